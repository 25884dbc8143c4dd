// train.precision = "fp8" on the CPU's exact emulation: a tiny model learns with its blocks'
// linears in FP8 (current and delayed scaling, GPT-2 and Llama) and stays within 1% of the f32
// run step by step; with every layer left to the compute dtype it is the f32 run bit for bit.
// The step records carry the casts' saturated and flushed counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    return trainer.run();
}

// 30 steps of a 3-layer model; extra: the precision and [fp8] keys.
Config tiny_run(const std::string& family, const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=3", "model.d_model=64", "model.n_heads=4",
                                          "train.steps=30", "train.batch_size=4", "train.seq_len=64", "train.eval_every=0",
                                          "train.eval_sequences=8", "train.sample_tokens=0", "train.threads=2"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/tiny.toml", overrides);
}

const std::vector<std::string> kEveryLayerFp8 = {"train.precision=\"fp8\"", "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"};

std::vector<std::string> with(std::vector<std::string> keys, const std::string& more) {
    keys.push_back(more);
    return keys;
}

// The FP8 run learns (its loss falls by over a nat in 30 steps), is not the f32 run (FP8
// rounded something), and every step's loss and the last validation loss are within 1%.
void expect_learns_within_one_percent_of_f32(const std::string& family, const std::vector<std::string>& fp8_keys) {
    const TrainResult f32 = train_quietly(tiny_run(family, {}));
    const TrainResult fp8 = train_quietly(tiny_run(family, fp8_keys));
    ASSERT_EQ(fp8.steps.size(), 30u);
    ASSERT_EQ(f32.steps.size(), 30u);
    EXPECT_LT(fp8.steps.back().loss, fp8.steps.front().loss - 1.0);
    double largest = 0;
    bool differs = false;
    for (size_t i = 0; i < fp8.steps.size(); ++i) {
        const double a = fp8.steps[i].loss, b = f32.steps[i].loss;
        largest = std::max(largest, std::fabs(a - b) / b);
        differs = differs || a != b;
    }
    EXPECT_TRUE(differs) << "the FP8 run computed the f32 run exactly: no linear ran in FP8";
    EXPECT_LT(largest, 0.01);
    const double val_fp8 = fp8.evals.back().val_loss, val_f32 = f32.evals.back().val_loss;
    EXPECT_LT(std::fabs(val_fp8 - val_f32) / val_f32, 0.01);
    std::printf("%s fp8 vs f32: largest step loss difference %.3g%%, val loss %.5f vs %.5f\n", family.c_str(), 100 * largest, val_fp8, val_f32);
}

}  // namespace

TEST(Fp8Training, Gpt2CurrentScaling_LearnsWithinOnePercentOfF32) { expect_learns_within_one_percent_of_f32("gpt2", kEveryLayerFp8); }

TEST(Fp8Training, Gpt2DelayedScaling_LearnsWithinOnePercentOfF32) {
    expect_learns_within_one_percent_of_f32("gpt2", with(kEveryLayerFp8, "fp8.recipe=\"delayed\""));
}

TEST(Fp8Training, LlamaCurrentScalingE4m3Everywhere_LearnsWithinOnePercentOfF32) {
    expect_learns_within_one_percent_of_f32("llama", with(with(kEveryLayerFp8, "fp8.format=\"e4m3\""), "model.qkv_bias=true"));
}

// The default bf16_first_layers = bf16_last_layers = 1 leave a 2-layer model no FP8 layer: the
// seam hands every linear to the backend's matmul as before.
TEST(Fp8Training, EveryLayerLeftToTheComputeDtype_IsTheF32RunBitwise) {
    const TrainResult f32 = train_quietly(tiny_run("gpt2", {"model.n_layers=2", "train.steps=4"}));
    const TrainResult fp8 = train_quietly(tiny_run("gpt2", {"model.n_layers=2", "train.steps=4", "train.precision=\"fp8\""}));
    test::expect_bitwise_identical(fp8, f32);
}

// The FP8 casts' overflow and underflow counts, in every step record of an FP8 run and of no
// other: current scaling scales each tensor to its own amax and so never leaves the format's
// range; the delayed recipe with a one-step history ("most_recent") scales from the step
// before, and a tensor whose amax grew by more than the rounding's margin (464 / 448 for
// e4m3) since then saturates. Both flush small gradient values to zero.
TEST(Fp8Training, CastCounts_CurrentScalingNeverSaturatesAndDelayedScalingDoesWhenAmaxesGrow) {
    const auto eight_steps = [](Config config) {
        config.train.steps = 8;
        return train_quietly(config);
    };
    const TrainResult current = eight_steps(tiny_run("gpt2", kEveryLayerFp8));
    const TrainResult delayed =
        eight_steps(tiny_run("gpt2", with(with(with(kEveryLayerFp8, "fp8.recipe=\"delayed\""), "fp8.amax_history_len=1"), "fp8.amax_compute=\"most_recent\"")));
    const TrainResult plain = eight_steps(tiny_run("gpt2", {}));
    double current_flushed = 0, delayed_saturated = 0;
    for (const StepRecord& s : current.steps) {
        EXPECT_TRUE(s.fp8) << "step " << s.step;
        EXPECT_EQ(s.fp8_saturated, 0) << "step " << s.step;
        current_flushed += s.fp8_flushed;
    }
    for (const StepRecord& s : delayed.steps) {
        EXPECT_TRUE(s.fp8) << "step " << s.step;
        EXPECT_EQ(s.fp8_saturated, std::floor(s.fp8_saturated));
        delayed_saturated += s.fp8_saturated;
    }
    EXPECT_EQ(delayed.steps.front().fp8_saturated, 0) << "the first step scales every tensor from its own amax";
    EXPECT_GT(delayed_saturated, 0);
    EXPECT_GT(current_flushed, 0);
    for (const StepRecord& s : plain.steps) EXPECT_FALSE(s.fp8);
}

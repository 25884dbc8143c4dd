// Training end to end on the bundled corpus: runs are bitwise reproducible, and the
// shipped tiny config learns (validation loss from ~5.5 to under 2.5 nats per byte).
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{"", DType::f32, true});
    return trainer.run();
}

Config small_run(const std::string& family) {
    return load_config("configs/tiny.toml", {"model.family=\"" + family + "\"", "model.n_layers=2", "model.d_model=32", "train.steps=6", "optimizer.warmup_steps=2",
                                             "train.batch_size=4", "train.seq_len=32", "train.grad_accum=2", "train.eval_batches=2",
                                             "train.sample_tokens=16", "train.threads=2"});
}

void expect_bitwise_identical_runs(const Config& config) {
    const TrainResult a = train_quietly(config), b = train_quietly(config);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
        EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
        EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
    }
    EXPECT_EQ(a.evals.back().val_loss, b.evals.back().val_loss);
    EXPECT_EQ(a.sample, b.sample);
}

}  // namespace

TEST(Training, Gpt2RunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_runs(small_run("gpt2")); }

TEST(Training, LlamaRunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_runs(small_run("llama")); }

TEST(Training, AnotherSeed_GivesAnotherRun) {
    Config other = small_run("gpt2");
    other.train.seed += 1;
    EXPECT_NE(train_quietly(small_run("gpt2")).steps[0].loss, train_quietly(other).steps[0].loss);
}

TEST(Training, TinyConfig_ValidationLossFallsFromAbout5p5ToUnder2p5) {
    const Config config = load_config("configs/tiny.toml", {"train.threads=2"});
    const TrainResult r = train_quietly(config);
    ASSERT_GE(r.evals.size(), 2u);
    EXPECT_GT(r.evals.front().val_loss, 5.0);   // ln(257) = 5.55 at initialization
    EXPECT_LT(r.evals.back().val_loss, 2.5);
    EXPECT_FALSE(r.sample.empty());
    std::printf("tiny: val loss %.4f -> %.4f, %.0f tokens/s, %.0f%% of step time in GEMMs\n", r.evals.front().val_loss,
                r.evals.back().val_loss, r.tokens_per_second, 100 * r.gemm_fraction);
}

// Recomputation rebuilds bitwise what the forward kept: the run does not change, for either
// family, while the planned activation memory shrinks.
TEST(Training, SelectiveAndFullRecompute_GiveBitwiseTheSameRunWithLessActivationMemory) {
    for (const std::string family : {"gpt2", "llama"}) {
        Config none = small_run(family);
        none.train.sample_tokens = 0;
        none.train.steps = 3;
        const TrainResult base = train_quietly(none);
        size_t previous_bytes = Trainer(none, TrainerOptions{"", DType::f32, true}).memory().activation_bytes;
        for (const Recompute mode : {Recompute::selective, Recompute::full}) {
            Config config = none;
            config.train.recompute = mode;
            const TrainResult r = train_quietly(config);
            ASSERT_EQ(r.steps.size(), base.steps.size());
            for (size_t i = 0; i < r.steps.size(); ++i) {
                EXPECT_EQ(r.steps[i].loss, base.steps[i].loss) << family << " " << recompute_name(mode) << " step " << i + 1;
                EXPECT_EQ(r.steps[i].grad_norm, base.steps[i].grad_norm) << family << " " << recompute_name(mode) << " step " << i + 1;
            }
            EXPECT_EQ(r.evals.back().val_loss, base.evals.back().val_loss);
            const size_t bytes = Trainer(config, TrainerOptions{"", DType::f32, true}).memory().activation_bytes;
            EXPECT_LT(bytes, previous_bytes) << family << " " << recompute_name(mode);
            previous_bytes = bytes;
        }
    }
}

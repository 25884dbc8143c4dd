// Mixture-of-experts training end to end on the bundled corpus: a tiny MoE (8 experts, top-2)
// against a dense model of the same active parameters, and the expert load with and without
// DeepSeek-V3's expert bias. The figures are printed for docs/moe.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    return trainer.run();
}

// configs/tiny.toml as a 2-layer llama of d_model 64 on 8 sequences of 64 bytes per step.
// Dense: d_ff 128, 3 * 64 * 128 = 24,576 MLP weights per layer. MoE: 8 experts of d_ff 64,
// top-2: 2 * 3 * 64 * 64 = 24,576 active expert weights per token and layer (plus the
// router's 512), 98,304 in all.
Config tiny_llama(int64_t steps, const std::vector<std::string>& more = {}) {
    std::vector<std::string> overrides = {"model.family=\"llama\"", "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.d_ff=128",
                                          "model.max_seq_len=64", "train.batch_size=8", "train.seq_len=64", "train.steps=" + std::to_string(steps),
                                          "train.eval_every=" + std::to_string(steps), "train.eval_sequences=64", "train.sample_tokens=0",
                                          "train.threads=1", "optimizer.lr=3e-3", "optimizer.warmup_steps=20"};
    overrides.insert(overrides.end(), more.begin(), more.end());
    return load_config("configs/tiny.toml", overrides);
}

const std::vector<std::string> kEightExpertsTopTwo = {"model.moe.n_experts=8", "model.moe.top_k=2", "model.moe.d_ff_expert=64"};

std::vector<std::string> moe(const std::vector<std::string>& more) {
    std::vector<std::string> all = kEightExpertsTopTwo;
    all.insert(all.end(), more.begin(), more.end());
    return all;
}

// The worst layer's expert load at each step.
std::vector<double> worst_loads(const TrainResult& r) {
    std::vector<double> worst;
    for (const StepRecord& s : r.steps) {
        double w = 0;
        for (const MoeLayerRecord& l : s.moe) w = std::max(w, l.load_max_over_mean);
        worst.push_back(w);
    }
    return worst;
}

double mean_of_last(const std::vector<double>& v, size_t n) { return std::accumulate(v.end() - static_cast<std::ptrdiff_t>(n), v.end(), 0.0) / static_cast<double>(n); }

}  // namespace

// Softmax router, aux loss 0.01 (the defaults), dropless.
TEST(MoeTraining, EightExpertsTopTwo_EndsBelowTheDenseModelOfTheSameActiveParameters) {
    const int64_t steps = 600;
    const TrainResult dense = train_quietly(tiny_llama(steps));
    const TrainResult experts = train_quietly(tiny_llama(steps, kEightExpertsTopTwo));
    ASSERT_FALSE(dense.evals.empty());
    ASSERT_FALSE(experts.evals.empty());
    std::printf("after %lld steps: dense val loss %.4f, MoE (8 experts, top-2) %.4f\n", static_cast<long long>(steps), dense.evals.back().val_loss,
                experts.evals.back().val_loss);
    EXPECT_LT(experts.evals.back().val_loss, dense.evals.back().val_loss);
    EXPECT_TRUE(dense.steps.back().moe.empty());
    ASSERT_EQ(experts.steps.back().moe.size(), 2u);
}

// Without balancing the router collapses onto a few experts (max / mean near 4, every token's
// two choices on the same two experts); the expert bias (sigmoid scores, rate 0.005, 16
// sequences a step) brings the worst layer's load under 1.5 within 200 steps (the mean over
// steps 181-200).
TEST(MoeTraining, ExpertBias_BringsTheLoadUnderOneAndAHalfWhereNoBalancingDoesNot) {
    // The collapse is what the health monitor would stop (monitor.on_router_collapse): not here.
    const TrainResult none = train_quietly(tiny_llama(200, moe({"model.moe.router=\"sigmoid\"", "model.moe.load_balancing=\"none\"", "train.batch_size=16",
                                                                "monitor.router_collapse_steps=1000000"})));
    const TrainResult biased = train_quietly(tiny_llama(200, moe({"model.moe.router=\"sigmoid\"", "model.moe.load_balancing=\"expert_bias\"",
                                                                  "model.moe.bias_update_rate=0.005", "train.batch_size=16"})));
    const std::vector<double> unbalanced = worst_loads(none), balanced = worst_loads(biased);
    std::printf("worst layer's max/mean load over steps 181-200: none %.3f, expert_bias %.3f\n", mean_of_last(unbalanced, 20), mean_of_last(balanced, 20));
    EXPECT_GT(mean_of_last(unbalanced, 20), 1.5);
    EXPECT_LT(mean_of_last(balanced, 20), 1.5);
    for (const StepRecord& s : none.steps) EXPECT_EQ(s.balance_loss, 0.0);
}

// The aux loss is reported as the balancing loss (its coefficient times E sum f P, near the
// coefficient when balanced), and a capacity reports what it dropped.
TEST(MoeTraining, AuxLossAndCapacity_AreReportedPerStep) {
    const TrainResult r = train_quietly(tiny_llama(5, moe({"model.moe.aux_loss_coeff=0.01", "model.moe.capacity_factor=1.0"})));
    for (const StepRecord& s : r.steps) {
        EXPECT_GT(s.balance_loss, 0.005) << "step " << s.step;
        EXPECT_LT(s.balance_loss, 0.1) << "step " << s.step;
        ASSERT_EQ(s.moe.size(), 2u);
        for (const MoeLayerRecord& l : s.moe) {
            EXPECT_GE(l.load_max_over_mean, 1.0);
            EXPECT_GE(l.dropped_fraction, 0.0);
            EXPECT_LT(l.dropped_fraction, 1.0);
        }
    }
    double dropped = 0;
    for (const StepRecord& s : r.steps) dropped += s.moe[0].dropped_fraction + s.moe[1].dropped_fraction;
    EXPECT_GT(dropped, 0.0) << "a capacity of 1.0 drops something while the load is not perfectly even";
}

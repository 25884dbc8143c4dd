// parallel.grad_reduce_dtype = "bf16": the data-parallel gradient collectives carry bf16
// (half the bytes) while each rank accumulates in f32. Measured against the f32-reduced run
// of the same config on the tiny model, over 16 steps: losses and gradient norms stay within
// the tolerances below, every step's dp bytes are half, and the runs do differ (the option is
// not a no-op). Rank 0 prints the largest differences it saw ("[ bf16 reduce ]" lines).
//
// Tolerances, set with a margin over what these layouts measure: a bf16 sum of dp gradients
// is within about 2^-8 relative of the f32 one per element, and AdamW's update moves by about
// that share. Over the 16 steps the largest differences measured (rank 0's "[ bf16 reduce ]"
// lines) were 0.0022% of the loss and 0.12% of the gradient norm (dp2, ZeRO-0 and -1), and
// at most 0.0012% and 0.055% on dp4 (ZeRO-1 with small buckets, ZeRO-2, hybrid ZeRO-2,
// ZeRO-3); the final validation loss 0.0008%. 0.05% of the loss and 1% of the gradient norm
// leave a margin of about 20x and 8x, while a wrong reduction (a piece not widened back, a
// bucket reduced twice or left out, a rank missing) moves them by far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/parallel_test.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

constexpr double kLossTolerance = 5e-4;      // relative
constexpr double kGradNormTolerance = 0.01;  // relative

// configs/tiny.toml at 4 layers of d_model 64, 16 steps of 2 micro-batches of 2 x 32 tokens per rank.
Config tiny(const std::vector<std::string>& layout, const std::string& reduce_dtype) {
    std::vector<std::string> overrides = {"model.n_layers=4",     "model.d_model=64",       "model.n_heads=4",       "model.max_seq_len=32",
                                          "train.steps=16",       "optimizer.warmup_steps=2", "train.batch_size=2",    "train.seq_len=32",
                                          "train.grad_accum=2",   "train.eval_every=8",     "train.eval_sequences=4", "train.sample_tokens=0",
                                          "train.threads=1"};
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    if (!reduce_dtype.empty()) overrides.push_back("parallel.grad_reduce_dtype=\"" + reduce_dtype + "\"");
    return load_config("configs/tiny.toml", overrides);
}

TrainResult run(const Config& config) {
    ParallelContext ctx = make_mpi_context(config.parallel);
    TrainResult result = Trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}, ctx).run();
    ctx.world->barrier();
    return result;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

void expect_bf16_reduction_tracks_f32(const std::string& name, const std::vector<std::string>& layout) {
    const TrainResult f32 = run(tiny(layout, "f32")), bf16 = run(tiny(layout, "bf16"));
    ASSERT_EQ(bf16.steps.size(), f32.steps.size());
    double worst_loss = 0, worst_loss_abs = 0, worst_norm = 0;
    bool differs = false;
    for (size_t i = 0; i < f32.steps.size(); ++i) {
        const StepRecord &a = bf16.steps[i], &b = f32.steps[i];
        worst_loss = std::max(worst_loss, relative(a.loss, b.loss));
        worst_loss_abs = std::max(worst_loss_abs, std::abs(a.loss - b.loss));
        worst_norm = std::max(worst_norm, relative(a.grad_norm, b.grad_norm));
        differs = differs || a.grad_norm != b.grad_norm;
        EXPECT_LE(relative(a.loss, b.loss), kLossTolerance) << name << " step " << i + 1 << ": loss " << a.loss << ", f32-reduced " << b.loss;
        EXPECT_LE(relative(a.grad_norm, b.grad_norm), kGradNormTolerance) << name << " step " << i + 1 << ": grad norm " << a.grad_norm << ", f32-reduced " << b.grad_norm;
        // 2 bytes per element instead of 4 (up to a byte of rounding in each collective's share).
        EXPECT_GT(b.dp_bytes_sent, 0) << name;
        EXPECT_NEAR(static_cast<double>(a.dp_bytes_sent) / static_cast<double>(b.dp_bytes_sent), 0.5, 1e-4) << name << " step " << i + 1;
    }
    EXPECT_TRUE(differs) << name << ": the bf16-reduced run is bitwise the f32 one: the option changed nothing";
    EXPECT_LE(relative(bf16.evals.back().val_loss, f32.evals.back().val_loss), kLossTolerance) << name;
    EXPECT_LT(f32.steps.back().loss, f32.steps.front().loss) << name << ": the reference run must learn";
    if (MpiSession().world_rank() == 0)
        std::printf("[ bf16 reduce ] %-22s %zu steps: largest |loss - f32-reduced| %.3g (%.4f%%), grad norm %.3f%%, val loss %.4f%%; dp bytes/step %lld -> %lld\n",
                    name.c_str(), f32.steps.size(), worst_loss_abs, 100 * worst_loss, 100 * worst_norm, 100 * relative(bf16.evals.back().val_loss, f32.evals.back().val_loss),
                    static_cast<long long>(f32.steps.back().dp_bytes_sent), static_cast<long long>(bf16.steps.back().dp_bytes_sent));
}

}  // namespace

// The default is f32: a run without the key is bitwise the run with "f32".
PARALLEL_TEST(GradReduceDtype, DefaultIsF32_BitwiseTheExplicitF32Run, 2) {
    test::expect_bitwise_identical(run(tiny({"parallel.zero_stage=1"}, "")), run(tiny({"parallel.zero_stage=1"}, "f32")), "dp2 zero1");
}

PARALLEL_TEST(GradReduceDtype, Bf16TwoRanksZero0_TracksTheF32Reduction, 2) { expect_bf16_reduction_tracks_f32("dp2 zero0", {"parallel.zero_stage=0"}); }
PARALLEL_TEST(GradReduceDtype, Bf16TwoRanksZero1_TracksTheF32Reduction, 2) { expect_bf16_reduction_tracks_f32("dp2 zero1", {"parallel.zero_stage=1"}); }
PARALLEL_TEST(GradReduceDtype, Bf16TwoRanksZero2_TracksTheF32Reduction, 2) { expect_bf16_reduction_tracks_f32("dp2 zero2", {"parallel.zero_stage=2"}); }
PARALLEL_TEST(GradReduceDtype, Bf16FourRanksZero1SmallBuckets_TracksTheF32Reduction, 4) {
    // Buckets of about 16 KB: many bf16 reductions in flight at once, split parameters.
    expect_bf16_reduction_tracks_f32("dp4 zero1 16KB buckets", {"parallel.zero_stage=1", "parallel.bucket_mb=0.016"});
}
PARALLEL_TEST(GradReduceDtype, Bf16FourRanksZero2_TracksTheF32Reduction, 4) { expect_bf16_reduction_tracks_f32("dp4 zero2", {"parallel.zero_stage=2"}); }
PARALLEL_TEST(GradReduceDtype, Bf16HybridShardsOfTwoZero2_TracksTheF32Reduction, 4) {
    expect_bf16_reduction_tracks_f32("dp4 shard2 zero2", {"parallel.zero_stage=2", "parallel.shard_size=2"});
}
PARALLEL_TEST(GradReduceDtype, Bf16FourRanksZero3_TracksTheF32Reduction, 4) { expect_bf16_reduction_tracks_f32("dp4 zero3", {"parallel.zero_stage=3"}); }

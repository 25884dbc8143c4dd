// Mixture-of-experts training (model.moe, every expert on every rank: parallel.ep = 1) on
// parallel layouts computes what one process does: losses, gradient norms and validation
// losses within 1e-5 relative over 6 steps, as the dense layouts' tests
// (layout_equivalence_test.cpp) compare them.
//
// The fair reference: the balancing losses are formed per micro-batch (Megatron-Core's), so a
// dp run is the single process accumulating the same micro-batches; where a layout splits a
// micro-batch's tokens (tp under sequence parallelism, cp) the load statistics are summed over
// the ranks holding them before the aux loss is formed, and the z-loss is each rank's part of
// the micro-batch's mean, so the split run is the unsplit one. A capacity is the exception:
// each rank caps its own tokens, so it is compared on dp only.
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

constexpr double kTolerance = 1e-5;

// 4 llama layers: the first dense, the others of 4 experts (top 2, each 32 wide), so a
// pipeline stage holds both kinds. The aux loss and the z-loss weigh enough that a balancing
// gradient scaled wrongly on a layout moves the run past the tolerance
// (BalancingLosses_MoveTheRunPastTheTolerance).
std::vector<std::string> tiny_moe_overrides(int64_t micro_batches) {
    return {"model.family=\"llama\"", "model.n_layers=4", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.max_seq_len=32",
            "model.moe.n_experts=4", "model.moe.top_k=2", "model.moe.d_ff_expert=32", "model.moe.first_dense_layers=1",
            "model.moe.aux_loss_coeff=0.1", "model.moe.z_loss_coeff=0.01", "train.steps=6", "optimizer.warmup_steps=2", "train.batch_size=2",
            "train.seq_len=16", "train.eval_every=3", "train.eval_sequences=7", "train.sample_tokens=0", "train.threads=1",
            "train.grad_accum=" + std::to_string(micro_batches)};
}

Config tiny_moe(int64_t micro_batches, const std::vector<std::string>& layout) {
    std::vector<std::string> overrides = tiny_moe_overrides(micro_batches);
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides);
}

// Context parallelism: sequences of 256 tokens, so that each of the 2 cp chunks holds many.
std::vector<std::string> long_sequences(std::vector<std::string> layout) {
    layout.insert(layout.end(), {"model.max_seq_len=256", "train.seq_len=256", "train.eval_sequences=3"});
    return layout;
}

// One process over the whole global batch: dp times a dp rank's micro-batches, keeping every
// activation (recomputation changes no figure, so the reference takes none).
TrainResult run_single_process(Config config, int64_t dp) {
    config.train.grad_accum *= dp;
    config.train.recompute = Recompute::none;
    config.parallel = ParallelConfig{};
    return Trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}).run();
}

// The largest |a - b| / |b| over the runs' losses, gradient norms and validation losses:
// the figure each test prints (rank 0).
double max_relative_difference(const TrainResult& a, const TrainResult& b) {
    double worst = 0;
    const auto take = [&](double x, double y) { worst = std::max(worst, std::abs(x - y) / std::abs(y)); };
    for (size_t i = 0; i < std::min(a.steps.size(), b.steps.size()); ++i) {
        take(a.steps[i].loss, b.steps[i].loss);
        take(a.steps[i].grad_norm, b.steps[i].grad_norm);
    }
    for (size_t i = 0; i < std::min(a.evals.size(), b.evals.size()); ++i) take(a.evals[i].val_loss, b.evals[i].val_loss);
    return worst;
}

// The step records' MoE figures (train/moe_load.h), reduced over the job: the same routing
// gives the same expert loads, and the balancing losses agree as the losses do.
void expect_same_moe_figures(const TrainResult& parallel, const TrainResult& single) {
    ASSERT_EQ(parallel.steps.size(), single.steps.size());
    for (size_t i = 0; i < single.steps.size(); ++i) {
        const StepRecord &p = parallel.steps[i], &o = single.steps[i];
        EXPECT_NEAR(p.balance_loss, o.balance_loss, kTolerance * std::abs(o.balance_loss)) << "step " << o.step;
        ASSERT_EQ(p.moe.size(), o.moe.size()) << "step " << o.step;
        for (size_t l = 0; l < o.moe.size(); ++l) {
            EXPECT_EQ(p.moe[l].layer, o.moe[l].layer);
            EXPECT_NEAR(p.moe[l].load_max_over_mean, o.moe[l].load_max_over_mean, 1e-12) << "step " << o.step << " layer " << o.moe[l].layer;
            EXPECT_NEAR(p.moe[l].dropped_fraction, o.moe[l].dropped_fraction, 1e-12) << "step " << o.step << " layer " << o.moe[l].layer;
        }
    }
}

void expect_moe_layout_matches_single_process(int64_t micro_batches, const std::vector<std::string>& layout) {
    const Config config = tiny_moe(micro_batches, layout);
    ParallelContext ctx = make_mpi_context(config.parallel);
    const int64_t dp = ctx.mesh.dp();
    const TrainResult parallel = Trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}, ctx).run();
    ctx.world->barrier();
    const TrainResult single = run_single_process(config, dp);
    if (ctx.world->rank() == 0)
        std::printf("max relative difference from one process: %.3g\n", max_relative_difference(parallel, single));
    test::expect_matches_single_process(parallel, single, kTolerance, "moe");
    expect_same_moe_figures(parallel, single);
}

}  // namespace

// The comparisons below mean something only if the balancing losses move the run: without
// them (and with a capacity instead of dropless) the single process differs by far more
// than the tolerance.
PARALLEL_TEST(MoeLayouts, BalancingLossesAndCapacity_MoveTheRunPastTheTolerance, 2) {
    const TrainResult with = run_single_process(tiny_moe(2, {}), 1);
    const TrainResult without = run_single_process(tiny_moe(2, {"model.moe.aux_loss_coeff=0", "model.moe.z_loss_coeff=0"}), 1);
    const TrainResult without_z = run_single_process(tiny_moe(2, {"model.moe.z_loss_coeff=0"}), 1);
    const TrainResult capacity = run_single_process(tiny_moe(2, {"model.moe.capacity_factor=1.0"}), 1);
    EXPECT_GT(max_relative_difference(without, with), 100 * kTolerance) << "the balancing losses changed nothing";
    EXPECT_GT(max_relative_difference(without_z, with), 100 * kTolerance) << "the z-loss changed nothing";
    EXPECT_GT(max_relative_difference(capacity, with), 100 * kTolerance) << "the capacity dropped nothing";
}

PARALLEL_TEST(MoeLayouts, DataParallelZero1_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(2, {"parallel.zero_stage=1"}); }
PARALLEL_TEST(MoeLayouts, DataParallelZero3_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(2, {"parallel.zero_stage=3"}); }
// Each dp rank caps its own micro-batch as the single process caps the same micro-batch.
PARALLEL_TEST(MoeLayouts, DataParallelCapacityFactor_MatchesSingleProcessWithTheSameDrops, 2) {
    expect_moe_layout_matches_single_process(2, {"model.moe.capacity_factor=1.0"});
}
PARALLEL_TEST(MoeLayouts, DataParallelFullRecompute_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, {"train.recompute=\"full\""});
}
// Every tp rank routes every token: nothing to sum.
PARALLEL_TEST(MoeLayouts, TensorParallel_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(2, {"parallel.tp=2"}); }
// Each tp rank routes its half of the tokens: the load statistics are summed over tp.
PARALLEL_TEST(MoeLayouts, SequenceParallel_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(MoeLayouts, SequenceParallelSelectiveRecompute_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.recompute=\"selective\""});
}
// Full recomputation re-runs each layer's routing in backward (its slots are shared by every
// layer): the statistics the aux loss's gradient reads are this layer's again.
PARALLEL_TEST(MoeLayouts, SequenceParallelFullRecompute_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.recompute=\"full\""});
}
PARALLEL_TEST(MoeLayouts, Pipeline_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(3, {"parallel.pp=2"}); }
PARALLEL_TEST(MoeLayouts, InterleavedPipeline_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, {"parallel.pp=2", "parallel.virtual_stages=2"});
}
// Each cp rank routes its chunks of every sequence: the statistics are summed over cp, the
// per-sequence ones too.
PARALLEL_TEST(MoeLayouts, ContextParallel_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(1, long_sequences({"parallel.cp=2"}));
}
PARALLEL_TEST(MoeLayouts, ContextParallelSequenceAuxLoss_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(1, long_sequences({"parallel.cp=2", "model.moe.load_balancing=\"seq_aux_loss\""}));
}

// tp 2 (sequence parallel) x cp 2: four ranks share each micro-batch's tokens.
PARALLEL_TEST(MoeLayouts, ContextTimesSequenceParallel_MatchesSingleProcess, 4) {
    expect_moe_layout_matches_single_process(1, long_sequences({"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}));
}

// DeepSeek-V3's expert bias moves after each step by the job's load: every layout reduces the
// same load, so every rank moves the same biases and routes as one process does.
const std::vector<std::string> kExpertBias = {"model.moe.load_balancing=\"expert_bias\"", "model.moe.bias_update_rate=0.05", "model.moe.router=\"sigmoid\""};
std::vector<std::string> with_expert_bias(std::vector<std::string> layout) {
    layout.insert(layout.end(), kExpertBias.begin(), kExpertBias.end());
    return layout;
}
PARALLEL_TEST(MoeLayouts, ExpertBiasDataParallel_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(2, with_expert_bias({})); }
PARALLEL_TEST(MoeLayouts, ExpertBiasSequenceParallel_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, with_expert_bias({"parallel.tp=2", "parallel.sequence_parallel=true"}));
}
PARALLEL_TEST(MoeLayouts, ExpertBiasPipeline_MatchesSingleProcess, 2) { expect_moe_layout_matches_single_process(3, with_expert_bias({"parallel.pp=2"})); }

// Shared experts (Qwen2-MoE's, gated; DeepSeek-V3's, added as they are): their dense MLP is
// split over tp as a dense layer's is, their gate acts on each rank's own tokens.
std::vector<std::string> with_shared_experts(std::vector<std::string> layout, bool gated) {
    layout.push_back(gated ? "model.moe.n_shared_experts=1" : "model.moe.n_shared_experts=2");
    layout.push_back(gated ? "model.moe.shared_expert_gate=true" : "model.moe.shared_expert_gate=false");
    return layout;
}
PARALLEL_TEST(MoeLayouts, GatedSharedExpertTensorParallel_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, with_shared_experts({"parallel.tp=2"}, true));
}
PARALLEL_TEST(MoeLayouts, GatedSharedExpertSequenceParallelSelectiveRecompute_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, with_shared_experts({"parallel.tp=2", "parallel.sequence_parallel=true", "train.recompute=\"selective\""}, true));
}
PARALLEL_TEST(MoeLayouts, SharedExpertsDataParallelZero3FullRecompute_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(2, with_shared_experts({"parallel.zero_stage=3", "train.recompute=\"full\""}, false));
}
PARALLEL_TEST(MoeLayouts, GatedSharedExpertPipeline_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(3, with_shared_experts({"parallel.pp=2"}, true));
}
PARALLEL_TEST(MoeLayouts, GatedSharedExpertContextParallel_MatchesSingleProcess, 2) {
    expect_moe_layout_matches_single_process(1, long_sequences(with_shared_experts({"parallel.cp=2"}, true)));
}

// ZeRO-2 (parallel.zero_stage = 2) computes the run of one process on every layout it shards
// over (dp; dp x tp, with sequence parallelism; dp x pp with an embedding tied across the
// stages; hybrid sharding within blocks of 2 of dp 4): losses, gradient norms and validation
// losses within 1e-5 relative over 10 steps. And it holds what it should: no whole gradient
// buffer, a gradient shard of 1/dp (1/shard_size) plus two group-sized working buffers, the
// AdamW state of ZeRO-1 (over the shard group), the parameters of plain dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

Config tiny(const std::string& family, int64_t micro_batches, const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=4", "model.d_model=32", "model.n_heads=4",
                                          "model.max_seq_len=32", "train.steps=10", "optimizer.warmup_steps=2",
                                          "train.batch_size=2", "train.seq_len=16", "train.eval_every=5", "train.eval_sequences=7",
                                          "train.sample_tokens=0", "train.threads=1", "train.grad_accum=" + std::to_string(micro_batches),
                                          "parallel.zero_stage=2"};
    if (family == "llama") overrides.insert(overrides.end(), {"model.n_kv_heads=2", "model.qkv_bias=true"});
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/tiny.toml", overrides);
}

struct ParallelRun {
    TrainResult result;
    RankMemory memory;
    int64_t padded_numel = 0;
};

ParallelRun run_parallel(const Config& config) {
    ParallelContext ctx = make_mpi_context(config.parallel);
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}, ctx);
    ParallelRun run{trainer.run(), trainer.memory(), trainer.model().parameters().padded_numel()};
    EXPECT_TRUE(trainer.model().parameters().all_grads().empty() == (config.parallel.zero_stage >= 2)) << "a whole gradient buffer exists exactly below stage 2";
    const bool stage3 = config.parallel.zero_stage == 3;
    EXPECT_TRUE(trainer.model().parameters().has_master_values() != stage3) << "whole master weights exist exactly below stage 3";
    EXPECT_FALSE(stage3 && trainer.model().parameters().has_compute_copy()) << "stage 3 keeps no flat compute copy";
    ctx.world->barrier();
    return run;
}

void expect_zero2_matches_single_process(const std::string& family, int64_t micro_batches, const std::vector<std::string>& layout,
                                         const std::string& stage = "2") {
    std::vector<std::string> overrides = layout;
    overrides.push_back("parallel.zero_stage=" + stage);
    const Config config = tiny(family, micro_batches, overrides);
    const int64_t dp = make_mesh(config.parallel, MpiSession().world_size()).dp();
    Config single = config;
    single.train.grad_accum *= dp;
    single.parallel = ParallelConfig{};
    const TrainResult reference = Trainer(single, TrainerOptions{.dtype = DType::f32, .quiet = true}).run();
    test::expect_matches_single_process(run_parallel(config).result, reference, kTolerance, "ZeRO-" + stage);
}

void expect_zero3_matches_single_process(const std::string& family, int64_t micro_batches, const std::vector<std::string>& layout) {
    expect_zero2_matches_single_process(family, micro_batches, layout, "3");
}

}  // namespace

// ---- 2 ranks ----

// The head tied to the embedding on one stage: its gradient is written twice per backward.
PARALLEL_TEST(ZeroStages, Gpt2Zero2DataParallelTwoMicroBatches_MatchesSingleProcess, 2) { expect_zero2_matches_single_process("gpt2", 2, {}); }
PARALLEL_TEST(ZeroStages, LlamaZero2DataParallelUntied_MatchesSingleProcess, 2) { expect_zero2_matches_single_process("llama", 3, {"model.tied_embeddings=false"}); }

// ZeRO-3: the embedding tied to the head is gathered once per step (resident), the layers
// before each forward and backward; eval runs as many forwards on every rank (7 sequences
// in micro-batches of 2: 4 micro-batches on 2 ranks, but also an odd count below).
PARALLEL_TEST(ZeroStages, Gpt2Zero3DataParallelTwoMicroBatches_MatchesSingleProcess, 2) { expect_zero3_matches_single_process("gpt2", 2, {}); }
PARALLEL_TEST(ZeroStages, LlamaZero3DataParallelUntiedNoPrefetch_MatchesSingleProcess, 2) {
    expect_zero3_matches_single_process("llama", 3, {"model.tied_embeddings=false", "parallel.prefetch_layers=0", "train.eval_sequences=5"});
}
PARALLEL_TEST(ZeroStages, Gpt2Zero3PrefetchBeyondThePassAndFullRecompute_MatchesSingleProcess, 2) {
    expect_zero3_matches_single_process("gpt2", 1, {"parallel.prefetch_layers=3", "train.recompute=\"full\""});
}

// ---- 4 ranks ----

PARALLEL_TEST(ZeroStages, Gpt2Zero3DataParallel_MatchesSingleProcess, 4) { expect_zero3_matches_single_process("gpt2", 2, {}); }
PARALLEL_TEST(ZeroStages, LlamaZero3TensorTimesData_MatchesSingleProcess, 4) { expect_zero3_matches_single_process("llama", 2, {"parallel.tp=2"}); }
// The embedding tied across the stages: each stage's copy resident, their gradients summed.
PARALLEL_TEST(ZeroStages, Gpt2Zero3PipelineTimesData_MatchesSingleProcess, 4) { expect_zero3_matches_single_process("gpt2", 2, {"parallel.pp=2"}); }
PARALLEL_TEST(ZeroStages, Gpt2Zero3HybridShardsOfTwo_MatchesSingleProcess, 4) { expect_zero3_matches_single_process("gpt2", 2, {"parallel.shard_size=2"}); }

PARALLEL_TEST(ZeroStages, Gpt2Zero2DataParallel_MatchesSingleProcess, 4) { expect_zero2_matches_single_process("gpt2", 2, {}); }
PARALLEL_TEST(ZeroStages, LlamaZero2TensorTimesData_MatchesSingleProcess, 4) { expect_zero2_matches_single_process("llama", 2, {"parallel.tp=2"}); }
PARALLEL_TEST(ZeroStages, Gpt2Zero2SequenceParallelTensorTimesData_MatchesSingleProcess, 4) {
    expect_zero2_matches_single_process("gpt2", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}
// The embedding tied across the stages: summed between them after the last micro-batch.
PARALLEL_TEST(ZeroStages, Gpt2Zero2PipelineTimesData_MatchesSingleProcess, 4) { expect_zero2_matches_single_process("gpt2", 2, {"parallel.pp=2"}); }

// Hybrid sharding: dp ranks {0, 1} and {2, 3} shard, 0 and 2, 1 and 3 hold the same shards.
// The norm counts the first block's shards only: a doubled count would show in the grad norm.
PARALLEL_TEST(ZeroStages, Gpt2Zero2HybridShardsOfTwo_MatchesSingleProcess, 4) { expect_zero2_matches_single_process("gpt2", 2, {"parallel.shard_size=2"}); }
PARALLEL_TEST(ZeroStages, LlamaZero2HybridShardsOfTwoUntied_MatchesSingleProcess, 4) {
    expect_zero2_matches_single_process("llama", 1, {"parallel.shard_size=2", "model.tied_embeddings=false"});
}
// Blocks of one rank: nothing sharded, every gradient all-reduced across the replicas (dp 4).
PARALLEL_TEST(ZeroStages, Gpt2Zero2ShardsOfOne_MatchesSingleProcess, 4) { expect_zero2_matches_single_process("gpt2", 1, {"parallel.shard_size=1"}); }

// 12 untied layers on dp 4: every group is pooled. Gradients: a shard of the whole / 4 (each
// group padded to a multiple of 4), two buffers of the largest group padded, two pieces of it.
PARALLEL_TEST(ShardedStateSize, Zero2PerRankBytes_AreTheExpectedFractions, 4) {
    const std::vector<std::string> shape = {"model.n_layers=12", "model.tied_embeddings=false", "train.steps=1", "optimizer.warmup_steps=0",
                                            "train.eval_every=0"};
    const auto with = [&](const std::string& stage) {
        std::vector<std::string> overrides = shape;
        overrides.push_back("parallel.zero_stage=" + stage);
        return tiny("gpt2", 1, overrides);
    };
    std::vector<std::string> hybrid_overrides = shape;
    hybrid_overrides.insert(hybrid_overrides.end(), {"parallel.zero_stage=2", "parallel.shard_size=2"});
    const ParallelRun plain = run_parallel(with("0")), zero1 = run_parallel(with("1")), zero2 = run_parallel(with("2"));
    const ParallelRun hybrid = run_parallel(tiny("gpt2", 1, hybrid_overrides));
    const Config config = with("2");
    const int64_t C = config.model.d_model, F = config.model.d_ff, V = config.model.padded_vocab_size(1);
    const int64_t layer = 4 * C + 3 * C * C + 3 * C + C * C + C + F * C + F + C * F + C;  // GPT-2: 2 LayerNorms, c_attn, c_proj, c_fc, mlp c_proj
    const std::vector<int64_t> groups = {C + C + V * C, V * C + config.model.max_seq_len * C};  // final norm + head; wte + wpe
    const auto bytes = [](int64_t numel) { return static_cast<size_t>(numel) * sizeof(float); };
    // Sharded over `parts` ranks: each group padded to a multiple of parts, the shard, two
    // buffers of the largest group and two pieces of it.
    const auto gradient_bytes = [&](int64_t parts) {
        const auto padded = [parts](int64_t n) { return (n + parts - 1) / parts * parts; };
        int64_t shard = 12 * padded(layer) / parts, largest = padded(layer);
        for (int64_t g : groups) shard += padded(g) / parts, largest = std::max(largest, padded(g));
        return bytes(shard + 2 * (largest + largest / parts));
    };
    EXPECT_EQ(zero2.memory.gradient_bytes, gradient_bytes(4));
    EXPECT_EQ(hybrid.memory.gradient_bytes, gradient_bytes(2));
    EXPECT_NEAR(static_cast<double>(hybrid.memory.optimizer_bytes) / static_cast<double>(plain.memory.optimizer_bytes), 0.5, 1e-3);
    EXPECT_EQ(hybrid.memory.parameter_bytes, plain.memory.parameter_bytes);
    EXPECT_EQ(plain.memory.gradient_bytes, bytes(plain.padded_numel));
    EXPECT_LT(static_cast<double>(zero2.memory.gradient_bytes) / static_cast<double>(plain.memory.gradient_bytes), 0.5);
    EXPECT_NEAR(static_cast<double>(zero2.memory.optimizer_bytes) / static_cast<double>(plain.memory.optimizer_bytes), 0.25, 1e-3);
    EXPECT_NEAR(static_cast<double>(zero2.memory.optimizer_bytes) / static_cast<double>(zero1.memory.optimizer_bytes), 1.0, 1e-3);
    EXPECT_EQ(zero2.memory.parameter_bytes, plain.memory.parameter_bytes);
    if (MpiSession().world_rank() == 0)
        std::printf("gradient bytes per rank, dp 4: stage 0 %zu, stage 1 %zu, stage 2 %zu, stage 2 in shards of 2 %zu; optimizer bytes: %zu, %zu, %zu, %zu\n",
                    plain.memory.gradient_bytes, zero1.memory.gradient_bytes, zero2.memory.gradient_bytes, hybrid.memory.gradient_bytes,
                    plain.memory.optimizer_bytes, zero1.memory.optimizer_bytes, zero2.memory.optimizer_bytes, hybrid.memory.optimizer_bytes);
}

// ZeRO-3 on dp 4 (12 untied layers: no resident group): parameters are a master shard of
// the whole / 4 (groups padded to a multiple of 4) plus prefetch_layers + 1 gather buffers of
// the largest group; gradients and AdamW state are stage 2's.
PARALLEL_TEST(ShardedStateSize, Zero3PerRankBytes_AreTheExpectedFractions, 4) {
    const std::vector<std::string> shape = {"model.n_layers=12", "model.tied_embeddings=false", "train.steps=1", "optimizer.warmup_steps=0",
                                            "train.eval_every=0"};
    const auto with = [&](const std::vector<std::string>& more) {
        std::vector<std::string> overrides = shape;
        overrides.insert(overrides.end(), more.begin(), more.end());
        return tiny("gpt2", 1, overrides);
    };
    const ParallelRun plain = run_parallel(with({"parallel.zero_stage=0"})), zero2 = run_parallel(with({"parallel.zero_stage=2"}));
    const ParallelRun zero3 = run_parallel(with({"parallel.zero_stage=3"})), no_prefetch = run_parallel(with({"parallel.zero_stage=3", "parallel.prefetch_layers=0"}));
    const ParallelRun hybrid = run_parallel(with({"parallel.zero_stage=3", "parallel.shard_size=2"}));
    const Config config = with({});
    const int64_t C = config.model.d_model, F = config.model.d_ff, V = config.model.padded_vocab_size(1);
    const int64_t layer = 4 * C + 3 * C * C + 3 * C + C * C + C + F * C + F + C * F + C;
    const std::vector<int64_t> groups = {C + C + V * C, V * C + config.model.max_seq_len * C};
    const auto bytes = [](int64_t numel) { return static_cast<size_t>(numel) * sizeof(float); };
    const auto parameter_bytes = [&](int64_t parts, int64_t buffers) {
        const auto padded = [parts](int64_t n) { return (n + parts - 1) / parts * parts; };
        int64_t shard = 12 * padded(layer) / parts, largest = padded(layer);
        for (int64_t g : groups) shard += padded(g) / parts, largest = std::max(largest, padded(g));
        return bytes(shard + buffers * largest);
    };
    EXPECT_EQ(zero3.memory.parameter_bytes, parameter_bytes(4, 2));
    EXPECT_EQ(no_prefetch.memory.parameter_bytes, parameter_bytes(4, 1));
    EXPECT_EQ(hybrid.memory.parameter_bytes, parameter_bytes(2, 2));
    EXPECT_EQ(plain.memory.parameter_bytes, bytes(plain.padded_numel));
    EXPECT_LT(static_cast<double>(zero3.memory.parameter_bytes) / static_cast<double>(plain.memory.parameter_bytes), 0.5);
    EXPECT_EQ(zero3.memory.gradient_bytes, zero2.memory.gradient_bytes);
    EXPECT_EQ(zero3.memory.optimizer_bytes, zero2.memory.optimizer_bytes);
    EXPECT_NEAR(static_cast<double>(zero3.memory.optimizer_bytes) / static_cast<double>(plain.memory.optimizer_bytes), 0.25, 1e-3);
    if (MpiSession().world_rank() == 0)
        std::printf("parameter bytes per rank, dp 4: stage 0 %zu, stage 3 %zu (prefetch 0: %zu), stage 3 in shards of 2 %zu\n", plain.memory.parameter_bytes,
                    zero3.memory.parameter_bytes, no_prefetch.memory.parameter_bytes, hybrid.memory.parameter_bytes);
}

// ---- 8 ranks ----

// Hybrid sharding beside the other dimensions: each (tp, pp) position's dp group of 4 is cut
// into blocks of 2; across pipeline stages the tied embedding's resident group is summed first.
PARALLEL_TEST(ZeroStages, Gpt2Zero2HybridPipelineTimesData_MatchesSingleProcess, 8) {
    expect_zero2_matches_single_process("gpt2", 2, {"parallel.pp=2", "parallel.shard_size=2"});
}
PARALLEL_TEST(ZeroStages, LlamaZero2HybridTensorTimesData_MatchesSingleProcess, 8) { expect_zero2_matches_single_process("llama", 1, {"parallel.tp=2", "parallel.shard_size=2"}); }

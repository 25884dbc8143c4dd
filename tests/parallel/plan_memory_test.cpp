// `llmtrain plan`'s memory is exact where it can be measured: under mpirun, for 14 layouts of
// the tiny model and a 50M-parameter one (tp, pp, dp, ZeRO-1/2, recompute, sequence parallel),
// every rank's planned bytes per category equal what its trainer allocated, and its resident
// set after two steps is within 5% of the plan plus the process' fixed overhead.
//
// The fixed overhead is what the process holds before the trainer is built (libraries, MPI,
// OpenBLAS, earlier tests' resident code: rank 0 prints it), and the pages of code the steps
// touch for the first time: so the check compares the anonymous resident set (heap and
// mappings, RssAnon) that the trainer adds with the plan. Both readings follow malloc_trim:
// MPI's non-blocking collectives (libnbc) allocate scratch as large as the message on the
// ranks that reduce (a reduce-scatter's root holds two buckets' worth), free it on completion,
// and glibc keeps the freed pages resident until trimmed; rank 0 prints that untrimmed growth
// too (the tiny model's 3 MB bucket: +7 MB on rank 0 of dp 4).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "config/config.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "plan/memory_plan.h"
#include "support/parallel_test.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// A figure of /proc/self/status in bytes: "VmRSS:" (the resident set) or "RssAnon:" (its anonymous part).
double status_bytes(const std::string& field) {
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
        if (key == field) {
            double kb = 0;
            status >> kb;
            return kb * 1024;
        }
        status.ignore(1 << 12, '\n');
    }
    return 0;
}

// Freed heap goes back to the system first: else the reading counts pages that only the
// allocator holds.
double trimmed_bytes(const std::string& field) {
    malloc_trim(0);
    return status_bytes(field);
}

Config layout_config(bool fifty_million, std::vector<std::string> layout) {
    std::vector<std::string> overrides = {"train.seq_len=32", "train.batch_size=2", "train.threads=1", "train.steps=2", "train.sample_tokens=0"};
    if (fifty_million) overrides.insert(overrides.end(), {"model.n_layers=16", "model.d_model=512", "model.n_heads=8", "model.max_seq_len=32"});
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
}

void expect_plan_is_what_the_rank_holds(const std::string& name, bool fifty_million, const std::vector<std::string>& layout) {
    const Config config = layout_config(fifty_million, layout);
    ParallelContext ctx = make_mpi_context(config.parallel);
    const double overhead = trimmed_bytes("VmRSS:"), anonymous_before = status_bytes("RssAnon:");
    double relative_error = 0, planned_total = 0, added = 0, added_untrimmed = 0;
    {
        TrainerOptions options;
        options.quiet = true;
        options.synthetic_data = true;
        Trainer trainer(config, options, ctx);
        const RankMemory planned = plan_memory(config, ctx.mesh, ctx.world_rank).memory, held = trainer.memory();
        EXPECT_EQ(planned.parameter_bytes, held.parameter_bytes) << name;
        EXPECT_EQ(planned.gradient_bytes, held.gradient_bytes) << name;
        EXPECT_EQ(planned.optimizer_bytes, held.optimizer_bytes) << name;
        EXPECT_EQ(planned.activation_bytes, held.activation_bytes) << name;
        EXPECT_EQ(planned.workspace_bytes, held.workspace_bytes) << name;
        EXPECT_EQ(planned.fp8_bytes, held.fp8_bytes) << name;
        for (int64_t step = 0; step < 2; ++step) trainer.train_step(step);
        added_untrimmed = status_bytes("RssAnon:") - anonymous_before;
        added = trimmed_bytes("RssAnon:") - anonymous_before;
        planned_total = static_cast<double>(planned.total());
        relative_error = (added - planned_total) / planned_total;
        EXPECT_LE(std::abs(relative_error), 0.05) << name << " rank " << ctx.world_rank << ": the trainer added " << added / 1e6 << " MB to the resident set, planned "
                                                  << planned_total / 1e6 << " MB (fixed overhead before it: " << overhead / 1e6 << " MB)";
    }
    const double worst = ctx.world->all_reduce_scalar(std::abs(relative_error), ReduceOp::max);
    const double most_untrimmed = ctx.world->all_reduce_scalar(added_untrimmed - planned_total, ReduceOp::max);
    if (ctx.world_rank == 0)
        std::printf("[ plan memory ] %-30s rank 0: fixed overhead %6.1f MB, planned %7.2f MB, added %7.2f MB; largest |error| over ranks %.1f%%; "
                    "before trimming, up to %+.2f MB\n",
                    name.c_str(), overhead / 1e6, planned_total / 1e6, added / 1e6, 100 * worst, most_untrimmed / 1e6);
    ctx.world->barrier();
}

// Context parallelism: the plan is what the ranks hold, and each rank's activations are
// those of its seq_len / cp tokens (the ring's buffers included), less than without cp.
void expect_context_parallel_plan_is_what_the_rank_holds(const std::string& name, const std::vector<std::string>& layout) {
    std::vector<std::string> long_sequences = {"model.max_seq_len=128", "train.seq_len=128"};
    long_sequences.insert(long_sequences.end(), layout.begin(), layout.end());
    expect_plan_is_what_the_rank_holds(name, true, long_sequences);
    Config without_cp = layout_config(true, long_sequences);
    const int world = MpiSession().world_size();
    const Mesh with = make_mesh(without_cp.parallel, world);
    without_cp.parallel.cp = 1;
    const Mesh without = make_mesh(without_cp.parallel, world);
    const size_t activations = plan_memory(layout_config(true, long_sequences), with, 0).memory.activation_bytes;
    const size_t activations_without = plan_memory(without_cp, without, 0).memory.activation_bytes;
    if (MpiSession().world_rank() == 0)
        std::printf("[ plan memory ] %-30s activations per rank %7.2f MB, %7.2f MB with cp = 1\n", name.c_str(), static_cast<double>(activations) / 1e6,
                    static_cast<double>(activations_without) / 1e6);
    EXPECT_LT(static_cast<double>(activations), 0.75 * static_cast<double>(activations_without))
        << name << ": activations " << activations << " bytes per rank with cp " << with.cp() << ", " << activations_without << " without";
}

}  // namespace

PARALLEL_TEST(MemoryPlan, TinyDataParallelZero1_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny dp4 zero1", false, {}); }
PARALLEL_TEST(MemoryPlan, TinyDataParallelZero2_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny dp4 zero2", false, {"parallel.zero_stage=2"}); }
PARALLEL_TEST(MemoryPlan, TinyPipelineTimesDataZero2_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2 zero2", false, {"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=2"});
}
PARALLEL_TEST(MemoryPlan, TinyHybridShardsOfTwoZero2_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny dp4 shard2 zero2", false, {"parallel.zero_stage=2", "parallel.shard_size=2"});
}
PARALLEL_TEST(MemoryPlan, TinyDataParallelZero3_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny dp4 zero3", false, {"parallel.zero_stage=3"}); }
PARALLEL_TEST(MemoryPlan, TinyPipelineTimesDataZero3PrefetchTwo_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2 zero3 prefetch2", false,
                                       {"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=3", "parallel.prefetch_layers=2"});
}
PARALLEL_TEST(MemoryPlan, TinyTensorTimesDataZero3_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny tp2 dp2 zero3", false, {"parallel.tp=2", "parallel.zero_stage=3"}); }
// FP8 (emulated): the FP8 linears' weight copies, casts' scratch and scaling state in their
// own category; under fp8.param_gather ZeRO-3's FP8 shard and the packed gathers' staging on
// top of the plain gather's parameter bytes. Each planned as allocated, and the resident set
// within 5% of the plan, with and without param_gather.
PARALLEL_TEST(MemoryPlan, TinyTensorTimesDataZero3Fp8ParamGather_IsWhatTheRankHolds_TheFp8ShardAndStagingOnTop, 4) {
    const std::vector<std::string> layout = {"parallel.tp=2", "parallel.zero_stage=3", "train.precision=\"fp8\"", "fp8.bf16_first_layers=1", "fp8.bf16_last_layers=0"};
    std::vector<size_t> parameter_bytes;
    for (const std::string gather : {"false", "true"}) {
        std::vector<std::string> overrides = layout;
        overrides.push_back("fp8.param_gather=" + gather);
        expect_plan_is_what_the_rank_holds("tiny tp2 dp2 zero3 fp8 param_gather " + gather, false, overrides);
        const Config config = layout_config(false, overrides);
        const RankMemory planned = plan_memory(config, make_mesh(config.parallel, MpiSession().world_size()), MpiSession().world_rank()).memory;
        EXPECT_GT(planned.fp8_bytes, 0u);
        parameter_bytes.push_back(planned.parameter_bytes);
    }
    EXPECT_GT(parameter_bytes[1], parameter_bytes[0]) << "the FP8 shard and staging come on top";
}
PARALLEL_TEST(MemoryPlan, TinyDataParallelFp8DelayedZero1_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny dp4 fp8 delayed", false,
                                       {"train.precision=\"fp8\"", "fp8.recipe=\"delayed\"", "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"});
}
PARALLEL_TEST(MemoryPlan, TinyHybridShardsOfTwoZero3_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny dp4 shard2 zero3", false, {"parallel.zero_stage=3", "parallel.shard_size=2"});
}
PARALLEL_TEST(MemoryPlan, 50MDataParallelZero3_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("50M dp4 zero3", true, {"parallel.zero_stage=3"}); }
PARALLEL_TEST(MemoryPlan, TinyDataParallelNoZero1_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny dp4 no zero1", false, {"parallel.zero_stage=0"}); }
PARALLEL_TEST(MemoryPlan, TinyTensorTimesData_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny tp2 dp2", false, {"parallel.tp=2"}); }
PARALLEL_TEST(MemoryPlan, TinyPipelineTimesData_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2", false, {"parallel.pp=2", "train.grad_accum=2"}); }
PARALLEL_TEST(MemoryPlan, TinyTensorTimesPipeline_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny tp2 pp2 m2", false, {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}); }
// parallel.grad_reduce_dtype = "bf16": the bf16 copies the dp collectives carry.
PARALLEL_TEST(MemoryPlan, TinyDataParallelNoZero1Bf16Reduction_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny dp4 no zero1 bf16 reduce", false, {"parallel.zero_stage=0", "parallel.grad_reduce_dtype=\"bf16\""});
}
PARALLEL_TEST(MemoryPlan, TinyTensorTimesDataZero1Bf16Reduction_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny tp2 dp2 bf16 reduce", false, {"parallel.tp=2", "parallel.grad_reduce_dtype=\"bf16\""});
}
PARALLEL_TEST(MemoryPlan, TinyHybridShardsOfTwoZero2Bf16Reduction_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny dp4 shard2 zero2 bf16 reduce", false,
                                       {"parallel.zero_stage=2", "parallel.shard_size=2", "parallel.grad_reduce_dtype=\"bf16\""});
}
PARALLEL_TEST(MemoryPlan, TinyPipelineTimesDataZero3Bf16Reduction_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2 zero3 bf16 reduce", false,
                                       {"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=3", "parallel.grad_reduce_dtype=\"bf16\""});
}
PARALLEL_TEST(MemoryPlan, TinyFourStagesFullRecompute_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny pp4 m4 recompute full", false, {"parallel.pp=4", "train.grad_accum=4", "train.recompute=\"full\""});
}
// Interleaved: two chunks per stage, each with the activation sets its schedule keeps.
PARALLEL_TEST(MemoryPlan, TinyFourStagesTwoVirtualStages_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny pp4 v2 m4", false, {"model.n_layers=8", "parallel.pp=4", "parallel.virtual_stages=2", "train.grad_accum=4"});
}
PARALLEL_TEST(MemoryPlan, TinyTensorFourSequenceParallel_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("tiny tp4 sp", false, {"parallel.tp=4", "parallel.sequence_parallel=true"}); }
PARALLEL_TEST(MemoryPlan, TinyLlamaSelectiveRecompute_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("tiny llama tp2 dp2 selective", false,
                                       {"model.family=\"llama\"", "model.n_kv_heads=2", "parallel.tp=2", "train.recompute=\"selective\""});
}
PARALLEL_TEST(MemoryPlan, 50MFourContextRanks_IsWhatTheRankHoldsAndLessThanWithoutCp, 4) {
    expect_context_parallel_plan_is_what_the_rank_holds("50M cp4", {"parallel.cp=4"});
}
PARALLEL_TEST(MemoryPlan, 50MContextTimesDataZero2_IsWhatTheRankHoldsAndLessThanWithoutCp, 4) {
    expect_context_parallel_plan_is_what_the_rank_holds("50M cp2 dp2 zero2", {"parallel.cp=2", "parallel.zero_stage=2"});
}
PARALLEL_TEST(MemoryPlan, 50MContextTimesSequenceParallel_IsWhatTheRankHoldsAndLessThanWithoutCp, 4) {
    expect_context_parallel_plan_is_what_the_rank_holds("50M cp2 tp2 sp", {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(MemoryPlan, 50MDataParallelZero1_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("50M dp4 zero1", true, {}); }
PARALLEL_TEST(MemoryPlan, 50MTensorTimesData_IsWhatTheRankHolds, 4) { expect_plan_is_what_the_rank_holds("50M tp2 dp2", true, {"parallel.tp=2"}); }
PARALLEL_TEST(MemoryPlan, 50MPipelineTimesDataNoZero1_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("50M pp2 dp2 m2 no zero1", true, {"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=0"});
}
PARALLEL_TEST(MemoryPlan, 50MTensorTimesPipelineFullRecompute_IsWhatTheRankHolds, 4) {
    expect_plan_is_what_the_rank_holds("50M tp2 pp2 m2 recompute full", true, {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2", "train.recompute=\"full\""});
}

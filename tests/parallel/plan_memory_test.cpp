// `llmtrain plan`'s memory is exact where it can be measured: under mpirun, for 12 layouts of
// the tiny model and a 50M-parameter one (tp, pp, dp, ZeRO-1, recompute, sequence parallel),
// every rank's planned bytes per category equal what its trainer allocated, and (50M model)
// its resident set after two steps is within 5% of the plan plus the process' fixed overhead
// (the resident set before the trainer is built: libraries, MPI, OpenBLAS; printed by rank 0).
// The tiny model's plan (4-16 MB) is smaller than what MPI maps for a group's first
// collectives (shared-memory segments, up to 10 MB): its resident set is printed, not checked.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "config/config.h"
#include "ops/memory_plan.h"
#include "parallel/context.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

double resident_bytes() {
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
        if (key == "VmRSS:") {
            double kb = 0;
            status >> kb;
            return kb * 1024;
        }
        status.ignore(1 << 12, '\n');
    }
    return 0;
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
    // Earlier tests' freed heap goes back to the system first: else this trainer would reuse
    // pages already resident, and the resident set would not grow by what it allocates.
    malloc_trim(0);
    const double overhead = resident_bytes();
    double relative_error = 0, planned_total = 0, resident = 0;
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
        for (int64_t step = 0; step < 2; ++step) trainer.train_step(step);
        resident = resident_bytes();
        planned_total = static_cast<double>(planned.total());
        relative_error = (resident - (planned_total + overhead)) / (planned_total + overhead);
        if (fifty_million) {
            EXPECT_LE(std::abs(relative_error), 0.05) << name << " rank " << ctx.world_rank << ": resident " << resident / 1e6 << " MB, planned "
                                                  << planned_total / 1e6 << " MB + fixed overhead " << overhead / 1e6 << " MB";
        }
    }
    const double worst = ctx.world->all_reduce_scalar(std::abs(relative_error), ReduceOp::max);
    if (ctx.world_rank == 0)
        std::printf("[ plan memory ] %-34s rank 0: planned %8.1f MB + overhead %6.1f MB, resident %8.1f MB; largest |error| over ranks %.1f%%\n", name.c_str(),
                    planned_total / 1e6, overhead / 1e6, resident / 1e6, 100 * worst);
    ctx.world->barrier();
}

}  // namespace

TEST(World4, PlanMemory_TinyDataParallelZero1) { expect_plan_is_what_the_rank_holds("tiny dp4 zero1", false, {}); }
TEST(World4, PlanMemory_TinyDataParallelZero2) { expect_plan_is_what_the_rank_holds("tiny dp4 zero2", false, {"parallel.zero_stage=2"}); }
TEST(World4, PlanMemory_TinyPipelineTimesDataZero2) {
    expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2 zero2", false, {"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=2"});
}
TEST(World4, PlanMemory_TinyHybridShardsOfTwoZero2) {
    expect_plan_is_what_the_rank_holds("tiny dp4 shard2 zero2", false, {"parallel.zero_stage=2", "parallel.shard_size=2"});
}
TEST(World4, PlanMemory_TinyDataParallelNoZero1) { expect_plan_is_what_the_rank_holds("tiny dp4 no zero1", false, {"parallel.zero1=false"}); }
TEST(World4, PlanMemory_TinyTensorTimesData) { expect_plan_is_what_the_rank_holds("tiny tp2 dp2", false, {"parallel.tp=2"}); }
TEST(World4, PlanMemory_TinyPipelineTimesData) { expect_plan_is_what_the_rank_holds("tiny pp2 dp2 m2", false, {"parallel.pp=2", "train.grad_accum=2"}); }
TEST(World4, PlanMemory_TinyTensorTimesPipeline) { expect_plan_is_what_the_rank_holds("tiny tp2 pp2 m2", false, {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}); }
TEST(World4, PlanMemory_TinyFourStagesFullRecompute) {
    expect_plan_is_what_the_rank_holds("tiny pp4 m4 recompute full", false, {"parallel.pp=4", "train.grad_accum=4", "train.recompute=\"full\""});
}
TEST(World4, PlanMemory_TinyTensorFourSequenceParallel) { expect_plan_is_what_the_rank_holds("tiny tp4 sp", false, {"parallel.tp=4", "parallel.sequence_parallel=true"}); }
TEST(World4, PlanMemory_TinyLlamaSelectiveRecompute) {
    expect_plan_is_what_the_rank_holds("tiny llama tp2 dp2 selective", false,
                                       {"model.family=\"llama\"", "model.n_kv_heads=2", "parallel.tp=2", "train.recompute=\"selective\""});
}
TEST(World4, PlanMemory_50MDataParallelZero1) { expect_plan_is_what_the_rank_holds("50M dp4 zero1", true, {}); }
TEST(World4, PlanMemory_50MTensorTimesData) { expect_plan_is_what_the_rank_holds("50M tp2 dp2", true, {"parallel.tp=2"}); }
TEST(World4, PlanMemory_50MPipelineTimesDataNoZero1) {
    expect_plan_is_what_the_rank_holds("50M pp2 dp2 m2 no zero1", true, {"parallel.pp=2", "train.grad_accum=2", "parallel.zero1=false"});
}
TEST(World4, PlanMemory_50MTensorTimesPipelineFullRecompute) {
    expect_plan_is_what_the_rank_holds("50M tp2 pp2 m2 recompute full", true, {"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2", "train.recompute=\"full\""});
}

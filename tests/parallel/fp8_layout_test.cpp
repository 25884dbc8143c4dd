// FP8 runs on parallel layouts compute what one FP8 process does: every amax of a tensor split
// over tp is agreed over the group (current scaling: before each cast; delayed: once per step,
// with dp too), so every rank casts with the scale one process would. Losses, gradient norms
// and validation losses within 1e-5 relative over 6 steps, as the dense layouts' tests
// (layout_equivalence_test.cpp) compare them. In f64: a layout's sums round differently
// from one process's (in f32 by about 1e-7), and where that moves an amax, every value the
// scale brings across an FP8 rounding boundary (e5m2: steps of 25%) moves by a whole step,
// which 6 steps of f32 turned into 1e-4 or not by chance.
#include <gtest/gtest.h>

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

// 4 layers, every one in FP8; heads and d_ff divisible by tp = 2.
Config tiny_fp8(const std::string& family, const std::string& recipe, const std::vector<std::string>& layout) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=4", "model.d_model=32", "model.n_heads=4",
                                          "model.max_seq_len=32", "train.steps=6", "optimizer.warmup_steps=2", "train.batch_size=2",
                                          "train.seq_len=16", "train.eval_every=3", "train.eval_sequences=4", "train.sample_tokens=0",
                                          "train.threads=1", "train.grad_accum=2", "train.precision=\"fp8\"", "fp8.recipe=\"" + recipe + "\"",
                                          "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"};
    if (family == "llama") overrides.insert(overrides.end(), {"model.n_kv_heads=2", "model.qkv_bias=true"});
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides);
}

void expect_fp8_layout_matches_single_process(const std::string& family, const std::string& recipe, const std::vector<std::string>& layout) {
    const Config config = tiny_fp8(family, recipe, layout);
    ParallelContext ctx = make_mpi_context(config.parallel);
    const int64_t dp = ctx.mesh.dp();
    const TrainResult parallel = Trainer(config, TrainerOptions{.dtype = DType::f64, .quiet = true}, ctx).run();
    ctx.world->barrier();
    Config single = config;
    single.train.grad_accum *= dp;
    single.parallel = ParallelConfig{};
    const TrainResult one = Trainer(single, TrainerOptions{.dtype = DType::f64, .quiet = true}).run();
    test::expect_matches_single_process(parallel, one, 1e-5, "fp8 " + recipe);
}

// fp8.param_gather against one process (as above) and against the same layout gathering in
// the compute dtype: each rank casts its shard with the scale every holder of the weight
// agreed on, which gives the bytes the cast of the gathered weight gives, so the two runs are
// bitwise alike.
void expect_fp8_param_gather_matches_single_process_and_the_plain_gather(const std::string& family, const std::string& recipe,
                                                                         const std::vector<std::string>& layout) {
    std::vector<std::string> gathering = layout;
    gathering.push_back("fp8.param_gather=true");
    const Config config = tiny_fp8(family, recipe, gathering);
    ParallelContext ctx = make_mpi_context(config.parallel);
    const TrainResult fp8_gathered = Trainer(config, TrainerOptions{.dtype = DType::f64, .quiet = true}, ctx).run();
    ctx.world->barrier();
    const TrainResult plain = Trainer(tiny_fp8(family, recipe, layout), TrainerOptions{.dtype = DType::f64, .quiet = true}, ctx).run();
    ctx.world->barrier();
    Config single = config;
    single.train.grad_accum *= ctx.mesh.dp();
    single.parallel = ParallelConfig{};
    single.fp8.param_gather = false;
    const TrainResult one = Trainer(single, TrainerOptions{.dtype = DType::f64, .quiet = true}).run();
    test::expect_matches_single_process(fp8_gathered, one, 1e-5, "fp8 param_gather " + recipe);
    ASSERT_EQ(fp8_gathered.steps.size(), plain.steps.size());
    for (size_t i = 0; i < plain.steps.size(); ++i) {
        EXPECT_EQ(fp8_gathered.steps[i].loss, plain.steps[i].loss) << "step " << i + 1;
        EXPECT_EQ(fp8_gathered.steps[i].grad_norm, plain.steps[i].grad_norm) << "step " << i + 1;
    }
}

}  // namespace

PARALLEL_TEST(Fp8Layouts, Gpt2TensorParallelCurrentScaling_MatchesSingleProcess, 2) {
    expect_fp8_layout_matches_single_process("gpt2", "current", {"parallel.tp=2"});
}

PARALLEL_TEST(Fp8Layouts, LlamaTensorParallelDelayedScaling_MatchesSingleProcess, 2) {
    expect_fp8_layout_matches_single_process("llama", "delayed", {"parallel.tp=2"});
}

PARALLEL_TEST(Fp8Layouts, LlamaSequenceParallelCurrentScaling_MatchesSingleProcess, 2) {
    expect_fp8_layout_matches_single_process("llama", "current", {"parallel.tp=2", "parallel.sequence_parallel=true"});
}

PARALLEL_TEST(Fp8Layouts, Gpt2TensorTimesDataParallelZero1DelayedScaling_MatchesSingleProcess, 4) {
    expect_fp8_layout_matches_single_process("gpt2", "delayed", {"parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=1"});
}

PARALLEL_TEST(Fp8Layouts, LlamaTensorTimesDataParallelZero3CurrentScaling_MatchesSingleProcess, 4) {
    expect_fp8_layout_matches_single_process("llama", "current", {"parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=3"});
}

PARALLEL_TEST(Fp8Layouts, Gpt2TensorTimesDataParallelZero3DelayedScaling_MatchesSingleProcess, 4) {
    expect_fp8_layout_matches_single_process("gpt2", "delayed", {"parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=3"});
}

PARALLEL_TEST(Fp8Layouts, LlamaPipelineAndContextParallelCurrentScaling_MatchesSingleProcess, 4) {
    expect_fp8_layout_matches_single_process("llama", "current", {"parallel.pp=2", "parallel.cp=2"});
}

PARALLEL_TEST(Fp8Layouts, LlamaTensorTimesDataParallelZero3Fp8ParamGatherCurrentScaling_MatchesSingleProcessAndThePlainGatherBitwise, 4) {
    expect_fp8_param_gather_matches_single_process_and_the_plain_gather("llama", "current", {"parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=3"});
}

PARALLEL_TEST(Fp8Layouts, Gpt2HybridShardsOfTwoZero3Fp8ParamGatherDelayedScaling_MatchesSingleProcessAndThePlainGatherBitwise, 4) {
    expect_fp8_param_gather_matches_single_process_and_the_plain_gather("gpt2", "delayed", {"parallel.dp=4", "parallel.zero_stage=3", "parallel.shard_size=2"});
}

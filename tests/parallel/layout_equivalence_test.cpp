// Every parallel layout computes the same training run as one process: per-step losses,
// gradient norms and validation losses agree within 1e-5 relative over 10 steps. Each
// rank also runs the single-process reference itself (the models are tiny), so the check
// needs no files. Each test states the ranks it runs on (support/parallel_test.h); CTest
// runs the tests of each world size under their own mpirun.
#include <gtest/gtest.h>

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

// A tiny model on the bundled corpus: 4 layers so that 4 stages have one each and heads
// divisible by 2 for tensor parallelism. The 257 byte classes are not divisible by tp = 2:
// the model pads its vocabulary rows to 258 (model.pad_vocab_to), so every tensor-parallel
// layout here also checks that the padding is masked. micro_batches: train.grad_accum (0:
// derived from train.global_batch_size). 7 validation sequences in micro-batches of 2 leave
// a last one of 1.
Config tiny_from(const std::string& path, const std::string& family, int64_t micro_batches, const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=4", "model.d_model=32", "model.n_heads=4",
                                          "model.max_seq_len=32", "train.steps=10", "optimizer.warmup_steps=2",
                                          "train.batch_size=2", "train.seq_len=16", "train.eval_every=5", "train.eval_sequences=7",
                                          "train.sample_tokens=0", "train.threads=1", "train.grad_accum=" + std::to_string(micro_batches)};
    if (family == "llama") overrides.insert(overrides.end(), {"model.n_kv_heads=2", "model.qkv_bias=true"});
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config(path, overrides);
}

Config tiny(const std::string& family, int64_t micro_batches, const std::vector<std::string>& extra = {}) {
    return tiny_from("configs/tiny.toml", family, micro_batches, extra);
}

TrainResult run_single_process(Config config, int64_t dp) {
    // One process sees the whole global batch: dp times the micro-batches of a dp rank
    // (0, derived from train.global_batch_size, stays so).
    config.train.grad_accum *= dp;
    config.parallel = ParallelConfig{};
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    return trainer.run();
}

struct ParallelRun {
    TrainResult result;
    RankMemory memory;
};

ParallelRun run_parallel(const Config& config) {
    ParallelContext ctx = make_mpi_context(config.parallel);
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}, ctx);
    ParallelRun run{trainer.run(), trainer.memory()};
    ctx.world->barrier();
    return run;
}

void expect_same_run(const TrainResult& parallel, const TrainResult& single) { test::expect_matches_single_process(parallel, single, kTolerance); }

// layout: "parallel.tp=2", ...; micro_batches per dp rank.
void expect_same_run_as_single_process(const Config& config) {
    const int64_t dp = make_mesh(config.parallel, MpiSession().world_size()).dp();
    expect_same_run(run_parallel(config).result, run_single_process(config, dp));
}

void expect_layout_matches_single_process(const std::string& family, int64_t micro_batches, const std::vector<std::string>& layout) {
    expect_same_run_as_single_process(tiny(family, micro_batches, layout));
}

// train.global_batch_size sequences per step, and nothing but the parallel.* keys in
// `layout` differs between the parallel run and the single process: each derives its
// grad_accum from its own dp.
void expect_global_batch_matches_single_process(const std::string& family, int64_t global_batch_size, std::vector<std::string> layout) {
    layout.push_back("train.global_batch_size=" + std::to_string(global_batch_size));
    const Config config = tiny(family, 0, layout);
    Config single = config;
    single.parallel = ParallelConfig{};
    expect_same_run(run_parallel(config).result, Trainer(single, TrainerOptions{.dtype = DType::f32, .quiet = true}).run());
}

// Packed documents (data.attention_mask = "document" with positions reset): every stage and
// tp rank derives the same document starts from the micro-batch's tokens. Each word of the
// corpus is made a document (every space becomes the end-of-document token), so each window
// holds several boundaries; the masked single process must differ from the causal one beyond
// the layouts' tolerance, or the comparison would prove nothing.
void expect_document_mask_layout_matches_single_process(const std::string& family, int64_t micro_batches, std::vector<std::string> layout) {
    layout.push_back("data.document_separator=\" \"");
    const Config causal = tiny(family, micro_batches, layout);
    layout.insert(layout.end(), {"data.attention_mask=\"document\"", "data.reset_position_ids=true"});
    const Config masked = tiny(family, micro_batches, layout);
    const int64_t dp = make_mesh(masked.parallel, MpiSession().world_size()).dp();
    const TrainResult single = run_single_process(masked, dp);
    const TrainResult single_causal = run_single_process(causal, dp);
    ASSERT_EQ(single.steps.size(), single_causal.steps.size());
    EXPECT_GT(std::abs(single.steps.back().loss / single_causal.steps.back().loss - 1), 10 * kTolerance) << "the document mask changed nothing";
    expect_same_run(run_parallel(masked).result, single);
}

// Context parallelism (parallel.cp): 6 steps of 2 sequences of 256 tokens, so that each of
// the 2 x cp chunks holds many rows, with the same global batch as one process.
void expect_context_parallel_matches_single_process(const std::string& family, std::vector<std::string> layout) {
    layout.insert(layout.end(), {"model.max_seq_len=256", "train.seq_len=256", "train.steps=6", "train.eval_every=3", "train.eval_sequences=3"});
    expect_layout_matches_single_process(family, 1, layout);
}

}  // namespace

// ---- 2 ranks ----

PARALLEL_TEST(Layouts, Gpt2ContextParallel_MatchesSingleProcess, 2) { expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=2"}); }
PARALLEL_TEST(Layouts, LlamaGqaContextParallel_MatchesSingleProcess, 2) { expect_context_parallel_matches_single_process("llama", {"parallel.cp=2"}); }
PARALLEL_TEST(Layouts, LlamaContextParallelFullRecompute_MatchesSingleProcess, 2) {
    expect_context_parallel_matches_single_process("llama", {"parallel.cp=2", "train.recompute=\"full\""});
}
// A chunk's documents may begin in the other rank's chunks: every rank derives the starts
// from the whole sequences.
PARALLEL_TEST(Layouts, Gpt2DocumentMaskContextParallel_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("gpt2", 1, {"parallel.cp=2"});
}
PARALLEL_TEST(Layouts, LlamaDocumentMaskContextParallel_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("llama", 1, {"parallel.cp=2"});
}

PARALLEL_TEST(Layouts, Gpt2DataParallel_MatchesSingleProcess, 2) { expect_layout_matches_single_process("gpt2", 2, {"parallel.zero_stage=0"}); }
PARALLEL_TEST(Layouts, Gpt2DataParallelZero1_MatchesSingleProcess, 2) { expect_layout_matches_single_process("gpt2", 2, {"parallel.zero_stage=1"}); }
PARALLEL_TEST(Layouts, LlamaDataParallelZero1SmallBuckets_MatchesSingleProcess, 2) {
    // Buckets of about 4 KB: many reductions overlap backward and split parameters.
    expect_layout_matches_single_process("llama", 2, {"parallel.bucket_mb=0.004"});
}
PARALLEL_TEST(Layouts, Gpt2TensorParallel_MatchesSingleProcess, 2) { expect_layout_matches_single_process("gpt2", 2, {"parallel.tp=2"}); }
PARALLEL_TEST(Layouts, BundledTinyConfigWithTensorParallelOnly_PadsTheVocabularyAndMatchesSingleProcess, 2) {
    // configs/tiny.toml's model as shipped (vocabulary 257, d_model 128) with only
    // parallel.tp = 2 and a shorter run: the first-hour command `mpirun -np 2 llmtrain train
    // configs/tiny.toml --set parallel.tp=2`. The short warm-up keeps the 10 steps in the
    // stable part of training (at batch 2 x 32 the full schedule spikes, and a spike magnifies
    // rounding differences past the tolerance).
    const Config config = load_config("configs/tiny.toml", {"parallel.tp=2", "train.steps=10", "optimizer.warmup_steps=2", "train.batch_size=2",
                                                            "train.seq_len=32", "train.eval_every=5", "train.eval_sequences=4", "train.sample_tokens=0",
                                                            "train.threads=1"});
    ASSERT_EQ(config.model.vocab_size, 257);
    ASSERT_EQ(config.model.padded_vocab_size(config.parallel.tp), 258);
    expect_same_run_as_single_process(config);
}
PARALLEL_TEST(Layouts, LlamaGqaTensorParallel_MatchesSingleProcess, 2) { expect_layout_matches_single_process("llama", 2, {"parallel.tp=2"}); }
PARALLEL_TEST(Layouts, Gpt2SequenceParallel_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("gpt2", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(Layouts, LlamaSequenceParallel_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("llama", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(Layouts, Gpt2PipelineTiedEmbeddings_MatchesSingleProcess, 2) { expect_layout_matches_single_process("gpt2", 2, {"parallel.pp=2"}); }
PARALLEL_TEST(Layouts, LlamaPipelineUnevenStages_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("llama", 3, {"parallel.pp=2", "parallel.stage_layers=\"3,1\""});
}

PARALLEL_TEST(Layouts, Gpt2DocumentMaskSequenceParallel_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("gpt2", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(Layouts, LlamaDocumentMaskTensorParallelSelectiveRecompute_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("llama", 2, {"parallel.tp=2", "train.recompute=\"selective\""});
}
// A later stage has no embedding: it derives the document starts from the tokens it reads too.
PARALLEL_TEST(Layouts, Gpt2DocumentMaskPipeline_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("gpt2", 2, {"parallel.pp=2"});
}
PARALLEL_TEST(Layouts, LlamaDocumentMaskPipelineFullRecompute_MatchesSingleProcess, 2) {
    expect_document_mask_layout_matches_single_process("llama", 3, {"parallel.pp=2", "train.recompute=\"full\""});
}

// The global batch fixed by train.global_batch_size: 4 sequences per step are 2 micro-batches
// of 2 on one process, tp = 2 and pp = 2, and 1 per rank on dp = 2.
PARALLEL_TEST(Layouts, Gpt2GlobalBatchSizeDataParallel_MatchesSingleProcess, 2) { expect_global_batch_matches_single_process("gpt2", 4, {}); }
PARALLEL_TEST(Layouts, Gpt2GlobalBatchSizeTensorParallel_MatchesSingleProcess, 2) { expect_global_batch_matches_single_process("gpt2", 4, {"parallel.tp=2"}); }
PARALLEL_TEST(Layouts, Gpt2GlobalBatchSizePipeline_MatchesSingleProcess, 2) { expect_global_batch_matches_single_process("gpt2", 4, {"parallel.pp=2"}); }
PARALLEL_TEST(Layouts, LlamaGlobalBatchSizeDataParallelZero1_MatchesSingleProcess, 2) {
    expect_global_batch_matches_single_process("llama", 8, {"parallel.zero_stage=1"});
}

// Fewer micro-batches than stages: a larger bubble, the same run.
PARALLEL_TEST(Layouts, Gpt2PipelineOneMicroBatch_MatchesSingleProcess, 2) { expect_layout_matches_single_process("gpt2", 1, {"parallel.pp=2"}); }
PARALLEL_TEST(Layouts, LlamaPipelineOneMicroBatchUnevenStages_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("llama", 1, {"parallel.pp=2", "parallel.stage_layers=\"1,3\""});
}

// Interleaved 1F1B: each stage holds two chunks of layers, the transfers wrap around the
// ring (here both directions between the two ranks carry activations and gradients).
PARALLEL_TEST(Layouts, Gpt2InterleavedTwoStagesTwoChunks_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("gpt2", 4, {"model.n_layers=8", "parallel.pp=2", "parallel.virtual_stages=2"});
}
// As many micro-batches as stages, one layer per chunk, and (llama) an untied head.
PARALLEL_TEST(Layouts, LlamaInterleavedTwoStagesTwoChunksTwoMicroBatches_MatchesSingleProcess, 2) {
    expect_layout_matches_single_process("llama", 2, {"parallel.pp=2", "parallel.virtual_stages=2"});
}

PARALLEL_TEST(ShardedStateSize, Zero1OptimizerState_IsHalfOfPlainDataParallel, 2) {
    const RankMemory plain = run_parallel(tiny("gpt2", 2, {"parallel.zero_stage=0", "train.steps=1", "optimizer.warmup_steps=0", "train.eval_every=0"})).memory;
    const RankMemory sharded = run_parallel(tiny("gpt2", 2, {"parallel.zero_stage=1", "train.steps=1", "optimizer.warmup_steps=0", "train.eval_every=0"})).memory;
    // The flat buffer is padded to a multiple of dp, so the halves are exact to a few elements.
    EXPECT_NEAR(static_cast<double>(sharded.optimizer_bytes) / static_cast<double>(plain.optimizer_bytes), 0.5, 1e-3);
    EXPECT_EQ(sharded.parameter_bytes, plain.parameter_bytes);
}

// ---- 4 ranks ----

PARALLEL_TEST(Layouts, Gpt2FourStagesEightMicroBatches_MatchesSingleProcess, 4) { expect_layout_matches_single_process("gpt2", 8, {"parallel.pp=4"}); }
PARALLEL_TEST(Layouts, Gpt2FourStagesTwoMicroBatches_MatchesSingleProcess, 4) { expect_layout_matches_single_process("gpt2", 2, {"parallel.pp=4"}); }
PARALLEL_TEST(Layouts, Gpt2InterleavedFourStagesTwoChunks_MatchesSingleProcess, 4) {
    expect_layout_matches_single_process("gpt2", 4, {"model.n_layers=8", "parallel.pp=4", "parallel.virtual_stages=2"});
}
PARALLEL_TEST(Layouts, LlamaInterleavedFourStagesTwoChunksEightMicroBatches_MatchesSingleProcess, 4) {
    expect_layout_matches_single_process("llama", 8, {"model.n_layers=8", "parallel.pp=4", "parallel.virtual_stages=2"});
}
// dp 2 x pp 2 with two chunks per stage: the gradients of every chunk are reduced over dp.
PARALLEL_TEST(Layouts, Gpt2InterleavedPipelineTimesData_MatchesSingleProcess, 4) {
    expect_layout_matches_single_process("gpt2", 2, {"model.n_layers=8", "parallel.pp=2", "parallel.virtual_stages=2"});
}
// dp = 2 x pp = 2: 4 sequences per step give each dp rank one micro-batch for two stages.
PARALLEL_TEST(Layouts, Gpt2GlobalBatchSizePipelineTimesData_MatchesSingleProcess, 4) {
    expect_global_batch_matches_single_process("gpt2", 4, {"parallel.pp=2"});
}
PARALLEL_TEST(Layouts, Gpt2ContextTimesTensorParallel_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=2", "parallel.tp=2"});
}
PARALLEL_TEST(Layouts, LlamaGqaContextTimesTensorParallel_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("llama", {"parallel.cp=2", "parallel.tp=2"});
}
PARALLEL_TEST(Layouts, LlamaContextTimesSequenceParallel_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("llama", {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(Layouts, Gpt2FourContextRanks_MatchesSingleProcess, 4) { expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=4"}); }
PARALLEL_TEST(Layouts, LlamaGqaFourContextRanks_MatchesSingleProcess, 4) { expect_context_parallel_matches_single_process("llama", {"parallel.cp=4"}); }
PARALLEL_TEST(Layouts, Gpt2ContextTimesDataZero2_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=2", "parallel.zero_stage=2"});
}
PARALLEL_TEST(Layouts, LlamaContextTimesDataZero3_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("llama", {"parallel.cp=2", "parallel.zero_stage=3"});
}
PARALLEL_TEST(Layouts, Gpt2ContextTimesInterleavedPipeline_MatchesSingleProcess, 4) {
    expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=2", "parallel.pp=2", "parallel.virtual_stages=2", "train.grad_accum=2"});
}
PARALLEL_TEST(Layouts, LlamaTensorTimesData_MatchesSingleProcess, 4) { expect_layout_matches_single_process("llama", 2, {"parallel.tp=2"}); }
PARALLEL_TEST(Layouts, Gpt2PipelineTimesDataZero1_MatchesSingleProcess, 4) { expect_layout_matches_single_process("gpt2", 2, {"parallel.pp=2"}); }
PARALLEL_TEST(Layouts, LlamaOnBpeTokenShardsTensorTimesData_MatchesSingleProcess, 4) {
    // The shard loader's global cursor hands each dp rank its slice of every global batch.
    expect_same_run_as_single_process(tiny_from("configs/tiny-bpe.toml", "llama", 2, {"parallel.tp=2"}));
}
PARALLEL_TEST(ShardedStateSize, Zero1OptimizerState_IsAQuarterOfPlainDataParallel, 4) {
    const RankMemory plain = run_parallel(tiny("llama", 1, {"parallel.zero_stage=0", "train.steps=1", "optimizer.warmup_steps=0", "train.eval_every=0"})).memory;
    const RankMemory sharded = run_parallel(tiny("llama", 1, {"parallel.zero_stage=1", "train.steps=1", "optimizer.warmup_steps=0", "train.eval_every=0"})).memory;
    EXPECT_NEAR(static_cast<double>(sharded.optimizer_bytes) / static_cast<double>(plain.optimizer_bytes), 0.25, 1e-3);
}

// ---- 8 ranks ----

PARALLEL_TEST(Layouts, Gpt2ContextPipelineData_MatchesSingleProcess, 8) {
    expect_context_parallel_matches_single_process("gpt2", {"parallel.cp=2", "parallel.pp=2", "train.grad_accum=2"});
}
PARALLEL_TEST(Layouts, LlamaGqaContextPipelineData_MatchesSingleProcess, 8) {
    expect_context_parallel_matches_single_process("llama", {"parallel.cp=2", "parallel.pp=2", "train.grad_accum=2"});
}
PARALLEL_TEST(Layouts, Gpt2TensorPipelineData_MatchesSingleProcess, 8) {
    expect_layout_matches_single_process("gpt2", 2, {"parallel.tp=2", "parallel.pp=2"});
}
PARALLEL_TEST(Layouts, Gpt2SequenceParallelPipelineData_MatchesSingleProcess, 8) {
    expect_layout_matches_single_process("gpt2", 2, {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"});
}
PARALLEL_TEST(Layouts, LlamaTensorPipelineDataPipelineOutermost_MatchesSingleProcess, 8) {
    expect_layout_matches_single_process("llama", 2, {"parallel.tp=2", "parallel.pp=2", "parallel.order=\"tp-pp-dp\""});
}

// The memory plan, computed from the config and the mesh alone, equals what the trainer
// holds once it has allocated, byte for byte, for every rank of several layouts; and a plan
// that does not fit is a config error naming what it needs.
#include <gtest/gtest.h>

#include <regex>

#include "config/config.h"
#include "parallel/context.h"
#include "plan/memory_plan.h"
#include "support/stream_graph.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {


// World rank `rank` of a tp x dp x pp mesh, as one process sees it.
ParallelContext rank_context(const Mesh& mesh, int rank) {
    ParallelContext ctx;
    ctx.mesh = mesh;
    ctx.world_rank = rank;
    const MeshCoord c = mesh.coord(rank);
    // Groups with no peers: a trainer's set-up reads only their sizes and ranks.
    ctx.world = test::make_idle_group("world", rank, mesh.world_size());
    ctx.tp = test::make_idle_group("tp", c[mesh_dim::tp], mesh.tp());
    ctx.dp = test::make_idle_group("dp", c[mesh_dim::dp], mesh.dp());
    ctx.pp = test::make_idle_group("pp", c[mesh_dim::pp], mesh.pp());
    return ctx;
}

Config small(const std::string& family, std::vector<std::string> extra = {}) {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=4", "model.d_model=32", "model.vocab_size=260",
                                          "train.batch_size=2", "train.seq_len=16", "train.grad_accum=2", "train.threads=1",
                                          "parallel.bucket_mb=0.004"};  // buckets of 1000 floats: several per rank
    if (family == "llama") overrides.push_back("model.n_kv_heads=2");
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
}

// Every rank of the layout: the plan equals what a trainer for that rank allocates.
void expect_plan_matches_every_rank(const Config& config, int tp, int dp, int pp) {
    const Mesh mesh(tp * dp * pp, tp, dp, pp, config.parallel.order);
    size_t largest = 0;
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
        SCOPED_TRACE(cat("rank ", rank, " of tp ", tp, " x dp ", dp, " x pp ", pp));
        ParallelContext ctx = rank_context(mesh, rank);
        TrainerOptions options;
        options.quiet = true;
        options.synthetic_data = true;
        const Trainer trainer(config, options, ctx);
        const RankMemory held = trainer.memory(), planned = plan_memory(config, mesh, rank).memory;
        EXPECT_EQ(planned.parameter_bytes, held.parameter_bytes);
        EXPECT_EQ(planned.gradient_bytes, held.gradient_bytes);
        EXPECT_EQ(planned.optimizer_bytes, held.optimizer_bytes);
        EXPECT_EQ(planned.activation_bytes, held.activation_bytes);
        EXPECT_EQ(planned.workspace_bytes, held.workspace_bytes);
        EXPECT_EQ(planned.fp8_bytes, held.fp8_bytes);
        EXPECT_GT(held.total(), 0u);
        largest = std::max(largest, held.total());
    }
    EXPECT_EQ(largest_rank_plan(config, mesh).total(), largest);
}


// Mixture-of-experts layouts (every expert on every rank, parallel.ep = 1): the experts'
// weights, their gradients and AdamW's moments are planned in the flat buffer as the trainer
// registers them, and the routed activations at the rows the layer allocates: tokens x top_k
// dropless, n_experts x the capacity with a capacity factor.
Config small_moe(std::vector<std::string> extra = {}) {
    std::vector<std::string> moe = {"model.moe.n_experts=4", "model.moe.top_k=2", "model.moe.d_ff_expert=24", "model.moe.first_dense_layers=1"};
    moe.insert(moe.end(), extra.begin(), extra.end());
    return small("llama", moe);
}

}  // namespace

TEST(MemoryPlan, SingleProcess_EqualsTrainerMemory_ForBothFamiliesAndEveryRecomputeMode) {
    for (const std::string family : {"gpt2", "llama"})
        for (const std::string recompute : {"none", "selective", "full"}) {
            SCOPED_TRACE(family + ", recompute " + recompute);
            expect_plan_matches_every_rank(small(family, {"train.recompute=\"" + recompute + "\""}), 1, 1, 1);
        }
}

TEST(MemoryPlan, DataParallel_EqualsTrainerMemory_WithZero1OnAndOff) {
    for (const std::string stage : {"1", "0"}) {
        SCOPED_TRACE("zero_stage " + stage);
        // dp = 3 pads the flat buffer; ZeRO-1 shards the gradients and moments three ways.
        expect_plan_matches_every_rank(small("gpt2", {"parallel.zero_stage=" + stage}), 1, 3, 1);
        expect_plan_matches_every_rank(small("llama", {"parallel.zero_stage=" + stage}), 1, 4, 1);
    }
}

TEST(MemoryPlan, TensorAndPipelineParallel_EqualTrainerMemory_OnEveryRank) {
    expect_plan_matches_every_rank(small("gpt2", {"parallel.tp=2", "parallel.sequence_parallel=true"}), 2, 1, 1);
    expect_plan_matches_every_rank(small("llama", {"parallel.pp=2", "train.recompute=\"selective\""}), 1, 1, 2);
    expect_plan_matches_every_rank(small("gpt2", {"parallel.pp=2", "parallel.stage_layers=\"3,1\"", "train.recompute=\"full\""}), 1, 2, 2);
    expect_plan_matches_every_rank(small("llama", {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"}), 2, 2, 2);
    // Micro-batches in flight from train.global_batch_size: 12 / (2 x dp 2) = 3 per step.
    expect_plan_matches_every_rank(small("gpt2", {"parallel.pp=2", "train.grad_accum=0", "train.global_batch_size=12"}), 1, 2, 2);
}

// The document starts (i32 per token) are kept with each activation set in flight.
TEST(MemoryPlan, DocumentMask_CountsTheDocumentStartsOnEveryRank) {
    const std::vector<std::string> documents = {"data.attention_mask=\"document\"", "data.reset_position_ids=true"};
    std::vector<std::string> layout = {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"};
    layout.insert(layout.end(), documents.begin(), documents.end());
    expect_plan_matches_every_rank(small("llama", layout), 2, 1, 2);
    expect_plan_matches_every_rank(small("gpt2", documents), 1, 1, 1);
    const Mesh one(1, 1, 1, 1, ParallelConfig{}.order);
    const size_t causal = plan_memory(small("gpt2"), one, 0).memory.activation_bytes;
    const size_t masked = plan_memory(small("gpt2", documents), one, 0).memory.activation_bytes;
    EXPECT_GE(masked - causal, size_t{2 * 16 * 4});  // at least one set's batch_size x seq_len i32 starts
}

// Pipeline stages differ: the first holds the embedding and more micro-batches in flight.
TEST(MemoryPlan, LargestRank_IsTheStageThatHoldsMost) {
    const Config config = small("gpt2", {"parallel.pp=2", "parallel.stage_layers=\"3,1\""});
    const Mesh mesh(2, 1, 1, 2);
    const MemoryPlan first = plan_memory(config, mesh, 0), last = plan_memory(config, mesh, 1);
    EXPECT_GT(first.total(), last.total());
    EXPECT_EQ(largest_rank_plan(config, mesh).world_rank, 0);
}

TEST(MemoryPlan, PlanThatDoesNotFit_IsAConfigErrorWithTheBreakdown) {
    const Config config = small("gpt2");
    const MemoryPlan plan = plan_memory(config, Mesh(1, 1, 1, 1), 0);
    EXPECT_NO_THROW(check_memory_fits(plan, plan.total()));
    try {
        check_memory_fits(plan, plan.total() - 1);
        FAIL() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_TRUE(std::regex_search(e.what(), std::regex("needs [0-9.]+ GB per rank, has [0-9.]+ GB .*parameters .*gradients .*optimizer "
                                                           ".*activations .*workspace .*train.batch_size")))
            << e.what();
    }
}

// ZeRO-3 initializes, saves and loads its shards as they are: it never holds the whole
// master weights of a rank's part, so its plan (and the fit check) is its shards, far below
// what stage 2 holds as its flat f32 parameter buffer.
TEST(MemoryPlan, Zero3_HoldsNoWholeMasterWeights_TheFitCheckIsTheShards) {
    // Twelve untied layers: the shards, not the gather buffers of one layer, are what stage 3 holds.
    const std::vector<std::string> shape = {"model.n_layers=12", "model.tied_embeddings=false"};
    std::vector<std::string> stage3 = shape, stage2 = shape;
    stage3.push_back("parallel.zero_stage=3");
    stage2.push_back("parallel.zero_stage=2");
    const Config zero3 = small("gpt2", stage3), zero2 = small("gpt2", stage2);
    const Mesh dp4(4, 1, 4, 1);
    const MemoryPlan sharded = plan_memory(zero3, dp4, 0), plain = plan_memory(zero2, dp4, 0);
    EXPECT_LT(static_cast<double>(sharded.memory.parameter_bytes), 0.5 * static_cast<double>(plain.memory.parameter_bytes));
    EXPECT_NO_THROW(check_memory_fits(sharded, sharded.total()));
    EXPECT_THROW(check_memory_fits(sharded, sharded.total() - 1), Error);
    EXPECT_THROW(check_memory_fits(plain, sharded.total()), Error) << "stage 2's flat master weights do not fit where stage 3's shards do";
}

TEST(MemoryPlan, AvailableMemory_IsTheHostsSharedByTheRanksOnTheNode) {
    const Config config = small("gpt2");
    const size_t one = available_memory_per_rank(config, 0, 1), four = available_memory_per_rank(config, 0, 4);
    EXPECT_GT(one, 0u);
    // MemAvailable moves between the two reads; a quarter of it within 5%.
    EXPECT_NEAR(static_cast<double>(four), static_cast<double>(one) / 4, static_cast<double>(one) * 0.05);
}

// Context parallelism: each rank holds chunks r and 2cp - 1 - r of every sequence, seq_len / cp
// tokens, so its activations fall with cp (the weights, gradients and their data group's
// ZeRO-1 shards do not depend on which of dp or cp makes the group up); the attention
// workspace is planned at the local length.
TEST(MemoryPlan, ContextParallel_ActivationBytesPerRankFallWithCp) {
    const auto activations = [](const std::string& family, int cp) {
        const Config config = small(family, {cat("parallel.cp=", cp)});
        return plan_memory(config, Mesh(cp, 1, 1, 1, config.parallel.order, cp), 0).memory.activation_bytes;
    };
    for (const std::string family : {"gpt2", "llama"}) {
        SCOPED_TRACE(family);
        const size_t cp1 = activations(family, 1), cp2 = activations(family, 2), cp4 = activations(family, 4);
        EXPECT_LT(cp2, cp1);
        EXPECT_LT(cp4, cp2);
    }
    // The data group: cp 2 x dp 1 shards AdamW's moments as dp 2 does.
    const Config cp2 = small("llama", {"parallel.cp=2"}), dp2 = small("llama");
    const RankMemory by_cp = plan_memory(cp2, Mesh(2, 1, 1, 1, cp2.parallel.order, 2), 0).memory;
    const RankMemory by_dp = plan_memory(dp2, Mesh(2, 1, 2, 1, dp2.parallel.order), 0).memory;
    EXPECT_EQ(by_cp.optimizer_bytes, by_dp.optimizer_bytes);
    EXPECT_EQ(by_cp.parameter_bytes, by_dp.parameter_bytes);
    EXPECT_LT(by_cp.optimizer_bytes, plan_memory(dp2, Mesh(1, 1, 1, 1, dp2.parallel.order), 0).memory.optimizer_bytes);
}

// The long-context config at 64k tokens on 8 GPUs: with cp 8 each GPU holds the activations of
// 8,192 of the 65,536 tokens (about an eighth of cp 1's, under a quarter whatever the ring
// keeps besides), and the native attention's workspace is planned for the local length too.
TEST(MemoryPlan, ContextParallel_LongContextConfigHoldsUnderAQuarterOfTheActivationsAtCp8) {
    const Config cp8 = load_config("configs/llama-1b-64k.toml", {}, DataFiles::unchecked);
    ASSERT_EQ(cp8.parallel.cp, 8);
    const Config cp1 = load_config("configs/llama-1b-64k.toml", {"parallel.cp=1"}, DataFiles::unchecked);
    const RankMemory a8 = largest_rank_plan(cp8, make_mesh(cp8.parallel, 8)).memory, a1 = largest_rank_plan(cp1, make_mesh(cp1.parallel, 8)).memory;
    EXPECT_LT(a8.activation_bytes, a1.activation_bytes / 4);
    EXPECT_LT(a8.workspace_bytes, a1.workspace_bytes);
}

TEST(MemoryPlan, MoeSingleProcess_EqualsTrainerMemory_DroplessAndCapacityInEveryRecomputeMode) {
    for (const std::string recompute : {"none", "selective", "full"})
        for (const std::string capacity : {"0", "1.25"}) {
            SCOPED_TRACE("recompute " + recompute + ", capacity_factor " + capacity);
            expect_plan_matches_every_rank(small_moe({"train.recompute=\"" + recompute + "\"", "model.moe.capacity_factor=" + capacity}), 1, 1, 1);
        }
    // DeepSeek-V3's balancing: the per-expert bias is state the layer reserves.
    expect_plan_matches_every_rank(small_moe({"model.moe.router=\"sigmoid\"", "model.moe.load_balancing=\"expert_bias\""}), 1, 1, 1);
}

TEST(MemoryPlan, MoeDataParallel_EqualsTrainerMemory_UnderZero1AndZero3) {
    for (const std::string stage : {"1", "3"}) {
        SCOPED_TRACE("zero_stage " + stage);
        expect_plan_matches_every_rank(small_moe({"parallel.zero_stage=" + stage}), 1, 2, 1);
    }
}

// Shared experts: their dense MLP (split over tp), their output and their gate's slots.
TEST(MemoryPlan, MoeSharedExperts_EqualTrainerMemory_GatedOrNotOnOneProcessAndTensorParallel) {
    expect_plan_matches_every_rank(small_moe({"model.moe.n_shared_experts=2", "train.recompute=\"selective\""}), 1, 1, 1);
    expect_plan_matches_every_rank(small_moe({"model.moe.n_shared_experts=1", "model.moe.shared_expert_gate=true", "parallel.tp=2",
                                              "parallel.sequence_parallel=true", "train.recompute=\"full\""}),
                                   2, 1, 1);
}

TEST(MemoryPlan, MoeTensorAndPipelineParallel_EqualTrainerMemory_OnEveryRank) {
    expect_plan_matches_every_rank(small_moe({"parallel.tp=2", "parallel.sequence_parallel=true", "train.recompute=\"selective\""}), 2, 1, 1);
    expect_plan_matches_every_rank(small_moe({"parallel.pp=2", "train.recompute=\"full\""}), 1, 1, 2);
    expect_plan_matches_every_rank(small_moe({"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true", "model.moe.capacity_factor=1.0"}), 2, 2, 2);
}

// The FP8 linears' buffers, as fp8_buffers lays them out: for linears [6, 4] and [4, 8] and
// 10 token rows, T = 6 scaled tensors' f32 state (5 x 6 x 4 = 120), each weight's e4m3 copy
// and its transpose (48, 64), four casts' scratch of 10 rows x the widest 8 (4 x 80), the
// counts (16) and, gathered in FP8, an amax per weight (8).
TEST(MemoryPlan, Fp8Buffers_AreTheStateWeightCopiesScratchAndCounts) {
    const Fp8Buffers gathered = fp8_buffers({{6, 4}, {4, 8}}, 10, true), cast = fp8_buffers({{6, 4}, {4, 8}}, 10, false);
    EXPECT_EQ(gathered.state, 120u);
    EXPECT_EQ(gathered.weights, (std::vector<size_t>{48, 64}));
    EXPECT_EQ(gathered.scratch, 80u);
    EXPECT_EQ(gathered.total(), 120u + 48 + 64 + 4 * 80 + 16 + 8);
    EXPECT_EQ(cast.total(), gathered.total() - 8);
    EXPECT_EQ(fp8_buffers({}, 10, false).total(), 16u) << "a part with no FP8 layer keeps only the counts";
}

// train.precision = "fp8" (emulated here): the FP8 linears' weight copies, casts' scratch and
// scaling state are planned in their own category as the trainer's linears allocate them,
// under both recipes and on every rank of tp 2 x dp 2 under ZeRO-1 and ZeRO-3 (with and
// without fp8.param_gather); a bf16 run plans none.
TEST(MemoryPlan, Fp8_EqualsTrainerMemory_BothRecipesAndTensorTimesDataUnderZero1AndZero3) {
    const std::vector<std::string> fp8 = {"train.precision=\"fp8\"", "fp8.bf16_first_layers=1", "fp8.bf16_last_layers=0"};
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), fp8.begin(), fp8.end());
        return extra;
    };
    for (const std::string family : {"gpt2", "llama"}) {
        SCOPED_TRACE(family);
        expect_plan_matches_every_rank(small(family, with({})), 1, 1, 1);
        expect_plan_matches_every_rank(small(family, with({"fp8.recipe=\"delayed\"", "fp8.amax_history_len=16"})), 1, 1, 1);
    }
    expect_plan_matches_every_rank(small("llama", with({"parallel.tp=2", "parallel.zero_stage=1"})), 2, 2, 1);
    for (const std::string gather : {"false", "true"}) {
        SCOPED_TRACE("param_gather " + gather);
        expect_plan_matches_every_rank(small("llama", with({"parallel.tp=2", "parallel.zero_stage=3", "fp8.param_gather=" + gather})), 2, 2, 1);
    }
    // At least the two e4m3 bytes per FP8 weight element (its copy and the transpose); none without FP8.
    const Config config = small("gpt2", with({}));
    const Mesh one(1, 1, 1, 1, config.parallel.order);
    const TransformerLayout layout(config.model, Device::cpu, compute_dtype(config.train), config.train.batch_size, config.train.seq_len,
                                   stage_partition(config, one, 0), 0, 1);
    int64_t weight_elements = 0;
    for (const FlatRange& r : layout.fp8_weight_ranges()) weight_elements += r.end - r.begin;
    ASSERT_GT(weight_elements, 0);
    EXPECT_GT(plan_memory(config, one, 0).memory.fp8_bytes, static_cast<size_t>(2 * weight_elements));
    EXPECT_EQ(plan_memory(small("gpt2"), one, 0).memory.fp8_bytes, 0u);
}

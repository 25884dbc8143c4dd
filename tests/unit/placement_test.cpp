// The state placement (parallel/placement.h): a local range's boxes put every element where
// the tensor-parallel formula says, for every split and range; the cuts cover the flat buffer
// once with equal pieces; and over every rank of a layout the checkpoint shares hold each
// element of the job's state exactly once (tp splits, ZeRO stages 0-3, hybrid sharding, a
// tied embedding on two stages, a padded flat buffer).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/transformer.h"
#include "parallel/placement.h"
#include "plan/memory_plan.h"

using namespace llmtrain;

namespace {

// The flat index in the global tensor of element i of a box, row-major in the box.
int64_t global_of(const GlobalBox& box, const Shape& global_shape, int64_t i) {
    if (box.count.rank == 1) return box.start[0] + i;
    const int64_t row = box.start[0] + i / box.count[1], col = box.start[1] + i % box.count[1];
    return row * global_shape[1] + col;
}

void expect_boxes_follow_tp_global_index(const Shape& global, TensorSplit split, int tp) {
    for (int rank = 0; rank < tp; ++rank) {
        Shape local = global;
        if (tp > 1 && split.kind == TpSplit::rows) local.dims[0] /= tp;
        if (tp > 1 && split.kind == TpSplit::cols) local.dims[1] /= tp;
        const TensorPlace t{"w", global, local, split, rank, tp, {0, local.numel()}};
        for (int64_t b = 0; b <= t.numel(); ++b)
            for (int64_t e = b; e <= t.numel(); ++e) {
                int64_t at = b;
                for (const GlobalBox& box : boxes_of(t, {b, e})) {
                    ASSERT_TRUE(box.inside(global)) << box.str();
                    for (int64_t i = 0; i < box.numel(); ++i, ++at)
                        ASSERT_EQ(global_of(box, global, i), tp_global_index(local, global, split, rank, tp, at))
                            << "tp rank " << rank << " of " << tp << ", range [" << b << ", " << e << "), box " << box.str();
                }
                ASSERT_EQ(at, e) << "the boxes hold the range's elements, no more";
            }
    }
}

// Every rank's placement of a layout, each from its own model part.
std::vector<Placement> every_rank(const Config& config, const Mesh& mesh) {
    std::vector<Placement> placements;
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
        const ModelPartition part = stage_partition(config, mesh, rank);
        const TransformerLayout model(config.model, Device::cpu, DType::f32, config.train.batch_size, config.train.seq_len, part, mesh.coord(rank)[mesh_dim::tp],
                                      mesh.tp());
        placements.push_back(state_placement(config, mesh, rank, model, DType::f32));
    }
    return placements;
}

// How many ranks' shares hold each element of each global tensor.
std::map<std::string, std::vector<int>> coverage(const std::vector<Placement>& placements, bool split_tied) {
    std::map<std::string, std::vector<int>> counts;
    for (const Placement& p : placements)
        for (const TensorRange& r : p.checkpoint_share(split_tied)) {
            const TensorPlace& t = p.tensors()[r.tensor];
            std::vector<int>& count = counts[t.name];
            count.resize(static_cast<size_t>(t.global_shape.numel()));
            for (const GlobalBox& box : boxes_of(t, r.local))
                for (int64_t i = 0; i < box.numel(); ++i) ++count[static_cast<size_t>(global_of(box, t.global_shape, i))];
        }
    return counts;
}

Config tiny(const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"model.n_layers=4", "model.d_model=32", "model.n_heads=4", "model.max_seq_len=16", "train.batch_size=2",
                                          "train.seq_len=16", "train.grad_accum=2", "parallel.bucket_mb=0.002"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return load_config("configs/tiny.toml", overrides, DataFiles::unchecked);
}

void expect_every_element_saved_once(const std::vector<std::string>& layout, int tp, int dp, int pp) {
    std::vector<std::string> overrides = layout;
    overrides.push_back("parallel.tp=" + std::to_string(tp));
    overrides.push_back("parallel.pp=" + std::to_string(pp));
    const Config config = tiny(overrides);
    const Mesh mesh(tp * dp * pp, tp, dp, pp);
    const std::vector<Placement> placements = every_rank(config, mesh);
    const std::map<std::string, std::vector<int>> saved = coverage(placements, true);
    ASSERT_FALSE(saved.empty());
    for (const auto& [name, count] : saved)
        for (size_t g = 0; g < count.size(); ++g) ASSERT_EQ(count[g], 1) << name << " element " << g << " is written " << count[g] << " times";
    // A load reads the tied embedding on both its stages, every other element once.
    for (const auto& [name, count] : coverage(placements, false))
        for (size_t g = 0; g < count.size(); ++g) ASSERT_GE(count[g], 1) << name << " element " << g << " is read by no rank";
}

}  // namespace

TEST(Placement, BoxesOfALocalRange_PlaceEveryElementWhereTheTpFormulaSays) {
    for (int tp : {1, 2, 3}) {
        SCOPED_TRACE("tp " + std::to_string(tp));
        expect_boxes_follow_tp_global_index({12, 6}, {TpSplit::none, 1}, tp);
        expect_boxes_follow_tp_global_index({12, 6}, {TpSplit::rows, 1}, tp);
        expect_boxes_follow_tp_global_index({12, 6}, {TpSplit::cols, 1}, tp);
        expect_boxes_follow_tp_global_index({18}, {TpSplit::rows, 3}, tp);
        expect_boxes_follow_tp_global_index({13}, {TpSplit::none, 1}, tp);
    }
    // GPT-2's fused QKV: three row blocks, each split by heads.
    expect_boxes_follow_tp_global_index({24, 4}, {TpSplit::rows, 3}, 2);
    expect_boxes_follow_tp_global_index({24, 4}, {TpSplit::rows, 3}, 4);
}

TEST(Placement, BoxesOfWholeRows_AreOneBoxPerRowBlock) {
    const TensorPlace qkv{"qkv", {24, 4}, {12, 4}, {TpSplit::rows, 3}, 1, 2, {0, 48}};
    EXPECT_EQ(boxes_of(qkv, {0, 16}).size(), 1u) << "rows 0-3 of the first block";
    EXPECT_EQ(boxes_of(qkv, {0, 48}).size(), 3u) << "one box per q, k, v block";
    const std::vector<GlobalBox> partial = boxes_of(qkv, {2, 30});
    ASSERT_EQ(partial.size(), 4u) << "a partial row, the rest of block 0, block 1's first 3 rows, a partial row";
    EXPECT_EQ(partial[0].str(), "[4:5, 2:4]");
    EXPECT_EQ(partial[1].str(), "[5:8, 0:4]");
    EXPECT_EQ(partial[2].str(), "[12:15, 0:4]");
    EXPECT_EQ(partial[3].str(), "[15:16, 0:2]");
}

// [experts, rows, cols] and [a, b, c, cols]: a range's boxes hold its elements in order, each
// box row-major, and whole leading units are one box (at most two per leading dimension).
TEST(Placement, BoxesOfTensorsOfThreeAndFourDimensions_HoldTheRangeInOrderInFewBoxes) {
    for (const Shape& shape : {Shape{4, 3, 5}, Shape{2, 3, 2, 4}}) {
        SCOPED_TRACE(shape.str());
        const TensorPlace t{"experts", shape, shape, {TpSplit::none, 1}, 0, 1, {0, shape.numel()}};
        for (int64_t begin = 0; begin < shape.numel(); begin += 3)
            for (int64_t end = begin + 1; end <= shape.numel(); end += 5) {
                const std::vector<GlobalBox> boxes = boxes_of(t, {begin, end});
                EXPECT_LE(boxes.size(), static_cast<size_t>(2 * (shape.rank - 1) + 2)) << "[" << begin << ", " << end << ")";
                int64_t expected = begin;
                for (const GlobalBox& box : boxes)
                    for (int64_t i = 0; i < box.numel(); ++i) {
                        int64_t g = 0, below = 1, rest = i;
                        for (int d = shape.rank - 1; d >= 0; --d) {
                            g += (box.start[d] + rest % box.count[d]) * below;
                            rest /= box.count[d];
                            below *= shape[d];
                        }
                        ASSERT_EQ(g, expected++) << "[" << begin << ", " << end << ") in " << box.str();
                    }
                EXPECT_EQ(expected, end);
            }
    }
    const TensorPlace experts{"experts", {4, 3, 5}, {4, 3, 5}, {TpSplit::none, 1}, 0, 1, {0, 60}};
    const std::vector<GlobalBox> two_experts = boxes_of(experts, {15, 45});
    ASSERT_EQ(two_experts.size(), 1u);
    EXPECT_EQ(two_experts[0].str(), "[1:3, 0:3, 0:5]");
}

TEST(Placement, TensorParallelSplitOfAThreeDimensionalTensor_IsRefusedNamingIt) {
    const TensorPlace split{"experts", {4, 6, 5}, {4, 3, 5}, {TpSplit::rows, 1}, 0, 2, {0, 60}};
    try {
        boxes_of(split, {0, 60});
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tensor 'experts' of shape [4, 3, 5]: tensor parallelism splits vectors and matrices"), std::string::npos) << e.what();
    }
}

TEST(Placement, Cuts_CoverTheBufferOnceWithEqualPieces) {
    const std::vector<FlatCut> buckets = bucket_cuts(60, 4, 3, 40);  // 40 bytes: 3 floats per rank, 9 per bucket
    int64_t covered = 0, shard_at = 0;
    for (const FlatCut& c : buckets) {
        EXPECT_EQ(c.flat.size() % 3, 0);
        EXPECT_EQ(c.piece * 3, c.flat.size());
        EXPECT_EQ(c.shard_at, shard_at);
        shard_at += c.piece, covered += c.flat.size();
    }
    EXPECT_EQ(covered, 60);
    EXPECT_EQ(buckets.front().flat.end, 60) << "backward's first gradients, the buffer's end, come first";
    // Groups of 10 and 7 elements over 4 ranks: pieces of 3 and 2, the last clipped.
    const std::vector<FlatCut> groups = group_cuts({{0, 4}, {4, 10}, {10, 17}}, {{0, 2, false}, {2, 3, true}}, 4);
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[0].piece, 3);
    EXPECT_EQ(groups[0].piece_of(3), (FlatRange{9, 10}));
    EXPECT_EQ(groups[1].piece, 2);
    EXPECT_EQ(groups[1].piece_of(3), (FlatRange{16, 17}));
    EXPECT_EQ(groups[1].shard_at, 3);
    EXPECT_TRUE(groups[1].group.resident);
}

TEST(Placement, PartOf_SplitsNearEquallyLongerFirst) {
    EXPECT_EQ(Placement::part_of({10, 20}, 3, 0), (FlatRange{10, 14}));
    EXPECT_EQ(Placement::part_of({10, 20}, 3, 1), (FlatRange{14, 17}));
    EXPECT_EQ(Placement::part_of({10, 20}, 3, 2), (FlatRange{17, 20}));
    EXPECT_EQ(Placement::part_of({0, 2}, 4, 3).size(), 0);
}

TEST(Placement, CheckpointShares_HoldEveryElementOnce_TensorPipelineDataZero1TiedEmbedding) {
    expect_every_element_saved_once({"parallel.zero_stage=1"}, 2, 2, 2);
}
TEST(Placement, CheckpointShares_HoldEveryElementOnce_Stage0WithAPaddedBuffer) { expect_every_element_saved_once({"parallel.zero_stage=0"}, 1, 3, 1); }
TEST(Placement, CheckpointShares_HoldEveryElementOnce_Zero2HybridShards) {
    expect_every_element_saved_once({"parallel.zero_stage=2", "parallel.shard_size=2"}, 1, 4, 1);
}
TEST(Placement, CheckpointShares_HoldEveryElementOnce_Zero3LlamaTensorTimesData) {
    expect_every_element_saved_once({"parallel.zero_stage=3", "model.family=\"llama\"", "model.n_kv_heads=2", "model.qkv_bias=true"}, 2, 2, 1);
}
TEST(Placement, CheckpointShares_HoldEveryElementOnce_Zero3PipelineTied) { expect_every_element_saved_once({"parallel.zero_stage=3"}, 1, 2, 2); }

// Under ZeRO-1 a rank's share is its pieces; a tensor tp does not split is cut among the tp
// ranks; the tied embedding's two copies each write half, and each reads all of its own.
TEST(Placement, TiedEmbeddingShare_IsHalfPerStageOnSaveAndAllOfItOnLoad) {
    const Config config = tiny({"parallel.pp=2", "parallel.zero_stage=0"});
    const Mesh mesh(2, 1, 1, 2);
    const std::vector<Placement> placements = every_rank(config, mesh);
    for (const Placement& p : placements) {
        ASSERT_TRUE(p.tied().has_value());
        const TensorPlace& wte = p.tensors()[*p.tied()];
        EXPECT_EQ(wte.name, "transformer.wte.weight");
        int64_t written = 0, read = 0;
        for (const TensorRange& r : p.checkpoint_share(true)) written += r.tensor == *p.tied() ? r.local.size() : 0;
        for (const TensorRange& r : p.checkpoint_share(false)) read += r.tensor == *p.tied() ? r.local.size() : 0;
        EXPECT_EQ(written, wte.numel() / 2 + (p.tied_end() == 0 ? wte.numel() % 2 : 0));
        EXPECT_EQ(read, wte.numel());
    }
}

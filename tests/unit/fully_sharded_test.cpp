// ZeRO-3's gathers against a recording stand-in for the dp group (one rank: every collective
// is the identity, so the model computes what the unsharded one does): the all-gather of the
// group after L is issued before group L computes, in forward and in backward, with
// parallel.prefetch_layers = 1, and only when L itself runs with prefetch_layers = 0. The
// gathers come in the order the pass takes the groups, and the loss and gradients are those
// of the same model with flat parameters (the initialization written into the shards).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/transformer.h"
#include "plan/memory_plan.h"
#include "parallel/fully_sharded.h"
#include "parallel/sharded_gradients.h"

using namespace llmtrain;

namespace {

// What a pass did, in order: "gather <elements>" when an all-gather is issued, "compute" when
// a group begins to compute (the model's hook has returned).
using Events = std::vector<std::string>;

class RecordingComm final : public Comm {
public:
    explicit RecordingComm(Events& events) : events_(events) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    int world_rank(int) const override { return 0; }
    const std::string& name() const override { return name_; }
    CommHandle all_reduce_async(const Tensor&, ReduceOp) override { return {}; }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp) override {
        std::memcpy(out.raw(), in.raw(), out.bytes());
        return {};
    }
    CommHandle all_gather_async(const Tensor& data) override {
        events_.push_back("gather " + std::to_string(data.numel()));
        return {};
    }
    CommHandle all_to_all_async(const Tensor&, const Tensor&) override { return {}; }
    CommHandle send_async(const Tensor&, int) override { return {}; }
    void recv(const Tensor&, int) override {}
    void broadcast(const Tensor&, int) override {}
    void barrier() override {}

private:
    Events& events_;
    std::string name_ = "dp";
};

ModelConfig tiny_gpt2() {
    ModelConfig m;
    m.family = ModelFamily::gpt2;
    m.n_layers = 4;
    m.d_model = 8;
    m.n_heads = 2;
    m.n_kv_heads = 2;
    m.d_ff = 16;
    m.vocab_size = 13;
    m.max_seq_len = 8;
    m.tied_embeddings = false;  // every group gathered per pass: none resident
    return m;
}

constexpr int64_t kBatch = 2, kSeq = 6;

struct Tokens {
    OwnedTensor tokens{DType::i32, {kBatch * kSeq}}, targets{DType::i32, {kBatch * kSeq}};
    Tokens() {
        std::mt19937 rng(3);
        for (int64_t i = 0; i < kBatch * kSeq; ++i) {
            tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 13);
            targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 13);
        }
    }
};

struct ShardedModel {
    Events events;
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    RecordingComm comm{events};
    std::unique_ptr<Transformer> model;
    std::unique_ptr<Placement> placement;
    std::unique_ptr<ShardedGradients> reduction;
    std::unique_ptr<FullyShardedParameters> store;

    explicit ShardedModel(int prefetch) {
        ModelPartition part;
        part.grad_storage = GradStorage::bound;
        part.value_storage = ValueStorage::bound;
        model = std::make_unique<Transformer>(tiny_gpt2(), *backend, DType::f32, kBatch, kSeq, part);
        Parameters& params = model->parameters();
        Backend& b = *backend;
        FlatOps ops{[&b](const Tensor& x) { b.fill_zero(x); }, [&b](const Tensor& out, const Tensor& x, const Tensor& y) { b.add(out, x, y); },
                    [&b](const Tensor& out, const Tensor& in) { b.copy(out, in); }};
        // One rank of ZeRO-3: the model's layer groups, each a piece of its own.
        PlacementSpec spec;
        spec.tensors = tensor_places(params);
        spec.padded_numel = params.padded_numel();
        spec.zero_stage = 3;
        std::vector<FlatRange> ranges;
        for (const TensorPlace& t : spec.tensors) ranges.push_back(t.flat);
        spec.cuts = group_cuts(ranges, zero2_gradient_groups(*model), 1);
        placement = std::make_unique<Placement>(std::move(spec));
        reduction = std::make_unique<ShardedGradients>(flat_parameters(params), placement->cuts(), comm, nullptr, ops, DType::f32);
        store = std::make_unique<FullyShardedParameters>(flat_parameters(params), *placement, comm, ops, DType::f32, prefetch,
                                                         [&params](size_t first, size_t end, const Tensor& storage, int64_t offset) {
                                                             params.bind_values(first, end, storage, offset);
                                                         });
        store->initialize([this](FlatRange range, const Tensor& out) { model->initialize_range(7, range, out); });
        model->set_group_weights([this](const std::vector<size_t>& pass, size_t position) {
            GroupWeights weights = store->weights(pass, position);
            events.push_back("compute");
            return weights;
        });
        model->set_grads_begin_hook([this, &params](size_t begin, size_t end) {
            if (const std::optional<GradStorageBinding> g = reduction->open(begin, end)) params.bind_grads(g->first, g->end, g->values, g->flat_offset);
        });
        model->set_grads_ready_hook([this](size_t begin, size_t end) { reduction->ready(begin, end, true); });
    }
};

// Elements of each group of a pass, in its order: what its gathers should carry (one rank: no padding).
std::vector<int64_t> group_sizes(const Transformer& model, const std::vector<TransformerLayout::ParamGroup>& pass) {
    std::vector<int64_t> sizes;
    for (const TransformerLayout::ParamGroup& g : pass) {
        const ParamInfo& last = model.parameters().info(g.end - 1);
        sizes.push_back(last.offset + last.shape.numel() - model.parameters().info(g.begin).offset);
    }
    return sizes;
}

// For each group of the pass (events from `from` on): how many gathers had been issued when it began to compute.
std::vector<size_t> gathers_before_each_compute(const Events& events, size_t from, size_t to) {
    std::vector<size_t> counts;
    size_t gathers = 0;
    for (size_t i = from; i < to; ++i) {
        if (events[i] == "compute") counts.push_back(gathers);
        else ++gathers;
    }
    return counts;
}

std::vector<int64_t> gathered_sizes(const Events& events, size_t from, size_t to) {
    std::vector<int64_t> sizes;
    for (size_t i = from; i < to; ++i)
        if (events[i].rfind("gather ", 0) == 0) sizes.push_back(std::stoll(events[i].substr(7)));
    return sizes;
}

// prefetch p: group L computes once the gathers of groups 0..L+p (within the pass) are
// issued, less the first `reused` groups, still in the ring from the pass before.
std::vector<size_t> expected_counts(size_t groups, size_t prefetch, size_t reused = 0) {
    std::vector<size_t> counts;
    for (size_t l = 0; l < groups; ++l) counts.push_back(std::min(groups, l + 1 + prefetch) - reused);
    return counts;
}

void expect_gather_order(int prefetch) {
    ShardedModel s(prefetch);
    const Tokens batch;
    s.reduction->begin_step(true);
    s.events.clear();
    s.model->forward(batch.tokens, batch.targets, kBatch, kSeq);
    const size_t forward_end = s.events.size();
    s.model->backward(1.0);
    const auto p = static_cast<size_t>(prefetch);
    const std::vector<TransformerLayout::ParamGroup> forward = s.model->forward_groups(0), backward = s.model->backward_groups(0);
    ASSERT_EQ(forward.size(), 6u) << "embedding, 4 layers, final norm and head";
    ASSERT_EQ(backward.size(), 5u) << "head, 4 layers (the embedding's backward reads no values)";
    EXPECT_EQ(gathers_before_each_compute(s.events, 0, forward_end), expected_counts(forward.size(), p)) << "forward, prefetch " << prefetch;
    // The forward's last p + 1 groups (the head, the last layers) are still in the ring of
    // p + 1 buffers, and they are the backward's first: not gathered again.
    EXPECT_EQ(gathers_before_each_compute(s.events, forward_end, s.events.size()), expected_counts(backward.size(), p, p + 1))
        << "backward, prefetch " << prefetch;
    EXPECT_EQ(gathered_sizes(s.events, 0, forward_end), group_sizes(*s.model, forward));
    const std::vector<int64_t> backward_sizes = group_sizes(*s.model, backward);
    EXPECT_EQ(gathered_sizes(s.events, forward_end, s.events.size()), std::vector<int64_t>(backward_sizes.begin() + (p + 1), backward_sizes.end()));
}

}  // namespace

TEST(FullySharded, PrefetchOne_IssuesTheNextGroupsGatherBeforeEachGroupComputes) { expect_gather_order(1); }
TEST(FullySharded, PrefetchZero_GathersEachGroupOnlyWhenItComputes) { expect_gather_order(0); }
TEST(FullySharded, PrefetchTwo_KeepsTwoGathersAhead) { expect_gather_order(2); }

// An update changes the values: every group is gathered again, none reused from the ring.
TEST(FullySharded, AnUpdateEmptiesTheRing) {
    ShardedModel s(1);
    const Tokens batch;
    s.reduction->begin_step(true);
    s.model->forward(batch.tokens, batch.targets, kBatch, kSeq);
    s.store->after_update();  // what the trainer calls after the optimizer's step
    s.events.clear();
    s.model->forward(batch.tokens, batch.targets, kBatch, kSeq);
    EXPECT_EQ(gathered_sizes(s.events, 0, s.events.size()), group_sizes(*s.model, s.model->forward_groups(0)));
}

// The shards hold the initialization, the gathered groups compute the unsharded model's loss
// and the reduce-scattered shard its gradients; no whole master weights remain.
TEST(FullySharded, OneRank_LossAndGradientsAreTheFlatModels) {
    ShardedModel s(1);
    EXPECT_FALSE(s.model->parameters().has_master_values());
    auto backend = make_cpu_backend(1);
    Transformer flat(tiny_gpt2(), *backend, DType::f32, kBatch, kSeq);
    flat.initialize(7);
    const Tokens batch;
    s.reduction->begin_step(true);
    EXPECT_EQ(s.model->forward(batch.tokens, batch.targets, kBatch, kSeq), flat.forward(batch.tokens, batch.targets, kBatch, kSeq));
    s.model->backward(1.0);
    flat.backward(1.0);
    s.reduction->finish();
    const Tensor flat_grads = flat.parameters().all_grads();
    int64_t compared = 0;
    for (const OwnedPiece& piece : s.reduction->owned()) {
        for (int64_t i = 0; i < piece.end - piece.begin; ++i)
            EXPECT_EQ(piece.grads.data<float>()[i], flat_grads.data<float>()[piece.begin + i]) << "flat element " << piece.begin + i;
        compared += piece.end - piece.begin;
    }
    EXPECT_EQ(compared, flat.parameters().total_numel());
}

// fp8.param_gather's packing (fully_sharded.h): a group [norm 4 | weight 10 | bias 3 | weight 6]
// over 3 ranks, pieces of 8: rank 0 holds the norm and 4 of the first weight, rank 1 the
// rest of it and the bias's first 2, rank 2 the bias's last and the second weight's 6 (and
// one padding element). Each rank's FP8 runs and compute runs lie in flat order in their
// slots; the slots are the largest any rank needs (6 bytes, 4 elements), so a gather moves
// 3 x (6 + 4 x 2) = 42 bytes against 3 x 8 x 2 = 48 in bf16: the bias and norm make half a
// group's worth here, a few vectors in a real layer.
TEST(FullySharded, Fp8ParamGather_PacksEachRanksRunsOfFp8WeightsAndTheRestInFlatOrder) {
    FlatCut cut;
    cut.flat = {100, 123};
    cut.piece = 8;
    const std::vector<FlatRange> fp8 = {{104, 114}, {117, 123}};
    const FullyShardedParameters::PackedGroup g = FullyShardedParameters::packed_group(cut, 3, fp8);
    const auto runs = [](const std::vector<FullyShardedParameters::Run>& rs) {
        std::string out;
        for (const auto& r : rs) out += cat("[", r.flat.begin, ",", r.flat.end, ")@", r.at, "w", r.weight, " ");
        return out;
    };
    EXPECT_EQ(runs(g.fp8[0]), "[104,108)@0w0 ");
    EXPECT_EQ(runs(g.compute[0]), "[100,104)@0w0 ");
    EXPECT_EQ(runs(g.fp8[1]), "[108,114)@0w0 ");
    EXPECT_EQ(runs(g.compute[1]), "[114,116)@0w0 ");
    EXPECT_EQ(runs(g.fp8[2]), "[117,123)@0w1 ");
    EXPECT_EQ(runs(g.compute[2]), "[116,117)@0w0 ");
    EXPECT_EQ(g.fp8_slot, 6);
    EXPECT_EQ(g.compute_slot, 4);
    // A group with no FP8 weight keeps the plain gather.
    EXPECT_EQ(FullyShardedParameters::packed_group(cut, 3, {{200, 210}}).fp8_slot, 0);
}

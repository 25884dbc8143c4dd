// Vocabulary-parallel embedding and cross-entropy on the CPU: the vocabulary split into
// uneven shards, each op run per shard and the shards combined as the tensor-parallel model
// combines them (sum of embedding outputs; max then sum for the loss statistics), must give
// what the whole-vocabulary ops give.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;

// Rows [begin, begin + count) of a [rows, cols] tensor, as a copy.
OwnedTensor row_block(const Tensor& t, int64_t begin, int64_t count) { return copy_of(t.slice_rows(begin, count)); }

// Columns [begin, begin + count) of a [rows, cols] tensor, as a copy.
OwnedTensor column_block(const Tensor& t, int64_t begin, int64_t count) {
    OwnedTensor out(t.dtype(), {t.dim(0), count});
    for (int64_t r = 0; r < t.dim(0); ++r)
        for (int64_t c = 0; c < count; ++c) set(out, r * count + c, get(t, r * t.dim(1) + begin + c));
    return out;
}

struct Shard {
    int64_t begin, count;
};
// A vocabulary of 13 in three uneven shards, as the loss sees them in any split.
const std::vector<Shard> kShards = {{0, 5}, {5, 4}, {9, 4}};
constexpr int64_t kVocab = 13;

}  // namespace

TEST(VocabShardEmbedding, SumOfShardsEqualsWholeTableForwardAndBackward) {
    auto be = make_cpu_backend(1);
    const int64_t B = 2, T = 5, C = 7, N = B * T;
    const OwnedTensor wte = random_tensor(f64, {kVocab, C}, 1), wpe = random_tensor(f64, {T, C}, 2);
    const OwnedTensor tokens = random_tokens(N, kVocab, 3), dout = random_tensor(f64, {N, C}, 4);
    const OwnedTensor whole(f64, {N, C}), dwte(f64, {kVocab, C}), dwpe(f64, {T, C});
    be->embedding_fwd({.out = whole, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
    be->embedding_bwd({.dwte = dwte, .dwpe = dwpe, .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});

    const OwnedTensor sum = filled(f64, {N, C}, 0);
    for (size_t s = 0; s < kShards.size(); ++s) {
        const Shard shard = kShards[s];
        const OwnedTensor local = row_block(wte, shard.begin, shard.count), out(f64, {N, C}), dlocal = filled(f64, {shard.count, C}, 0);
        // Positions are added by one shard only, as the tensor-parallel model does.
        be->embedding_fwd({.out = out, .tokens = tokens, .wte = local, .wpe = s == 0 ? Tensor(wpe) : Tensor(), .seq_len = T,
                           .vocab = {shard.begin, kVocab}, .doc_starts = Tensor(), .positions = Tensor()});
        be->add(sum, sum, out);
        be->embedding_bwd({.dwte = dlocal, .dwpe = Tensor(), .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {shard.begin, kVocab},
                           .doc_starts = Tensor(), .positions = Tensor()});
        expect_close("dwte shard", dlocal, row_block(dwte, shard.begin, shard.count), 1e-14);
    }
    expect_close("embedding", sum, whole, 1e-14);
}

TEST(VocabShardEmbedding, TokenBeyondTheFullVocabulary_IsADataError) {
    auto be = make_cpu_backend(1);
    const OwnedTensor wte = random_tensor(f64, {4, 3}, 1), out(f64, {2, 3}), tokens(DType::i32, {2});
    tokens.data<int32_t>()[1] = 8;
    try {
        be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = Tensor(), .seq_len = 2, .vocab = {4, 8}, .doc_starts = Tensor(), .positions = Tensor()});
        FAIL() << "expected a data error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("token id 8 at row 1 is outside the vocabulary [0, 8)"), std::string::npos) << e.what();
    }
}

TEST(VocabShardCrossEntropy, ShardedStatisticsEqualWholeRowLossAndGradient) {
    auto be = make_cpu_backend(1);
    const int64_t N = 9;
    const OwnedTensor logits = random_tensor(f64, {N, kVocab}, 5, -6, 6), targets = random_tokens(N, kVocab, 6);
    const OwnedTensor losses(f64, {N}), dlogits(f64, {N, kVocab});
    be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = targets, .vocab = {}});
    be->xent_bwd({.dlogits = dlogits, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = 0.5});

    // Reduction 1: max over shards of each shard's row max.
    std::vector<OwnedTensor> blocks;
    const OwnedTensor row_max = filled(f64, {N}, -1e300), local_max(f64, {N});
    for (const Shard& s : kShards) {
        blocks.push_back(column_block(logits, s.begin, s.count));
        be->logits_row_max(local_max, blocks.back(), {s.begin, kVocab});
        for (int64_t n = 0; n < N; ++n) set(row_max, n, std::max(get(row_max, n), get(local_max, n)));
    }
    // Reduction 2: sum over shards of (sum of exp, target logit).
    const OwnedTensor partial = filled(f64, {N, 2}, 0), local_partial(f64, {N, 2});
    for (size_t i = 0; i < kShards.size(); ++i) {
        be->xent_partial({.partial = local_partial, .logits = blocks[i], .targets = targets, .row_max = row_max,
                          .vocab = {kShards[i].begin, kVocab}});
        be->add(partial, partial, local_partial);
    }
    const OwnedTensor sharded_losses(f64, {N}), lse(f64, {N});
    be->xent_combine({.losses = sharded_losses, .lse = lse, .partial = partial, .row_max = row_max});
    expect_close("losses", sharded_losses, losses, 1e-13);

    for (size_t i = 0; i < kShards.size(); ++i) {
        const OwnedTensor dlocal(f64, {N, kShards[i].count});
        be->xent_bwd({.dlogits = dlocal, .logits = blocks[i], .targets = targets, .lse = lse, .vocab = {kShards[i].begin, kVocab}, .dloss = 0.5});
        expect_close("dlogits shard", dlocal, column_block(dlogits, kShards[i].begin, kShards[i].count), 1e-13);
    }
}

TEST(VocabShardCrossEntropy, ShardWithoutLse_IsRefused) {
    auto be = make_cpu_backend(1);
    const OwnedTensor logits = random_tensor(f64, {2, 4}, 1), targets = random_tokens(2, 4, 2), d(f64, {2, 4});
    EXPECT_THROW(be->xent_bwd({.dlogits = d, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {4, 8}, .dloss = 1.0}), Error);
}

// The CPU ops with document starts (backend.h): attention against a direct O(T^2) reference
// of the document mask and its backward against finite differences; rotary and learned
// positions restarting at each document; no boundary bitwise the causal ops; bad starts
// refused naming the row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "model/transformer.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;

std::unique_ptr<Backend> cpu_backend() { return make_cpu_backend(1); }

OwnedTensor starts_tensor(const std::vector<int32_t>& starts) {
    OwnedTensor t(DType::i32, {static_cast<int64_t>(starts.size())});
    std::copy(starts.begin(), starts.end(), t.data<int32_t>());
    return t;
}

// Document starts of B sequences of T tokens with random boundaries: token 0 ends a document
// with probability 1/4 (document_starts' convention: it is its document's last token).
std::vector<int32_t> random_starts(int64_t B, int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> tokens(static_cast<size_t>(B * T));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 4);
    return document_starts(tokens.data(), B, T, 0);
}

// out[b, t, h] = sum_{s in [start, t]} softmax_s(q_t . k_s / sqrt(D)) v_s, straight from the
// definition in double.
std::vector<double> reference_attention(const Tensor& qkv, const AttentionShape& s, const std::vector<int32_t>& starts) {
    const int64_t T = s.seq_len, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, W = s.qkv_width();
    std::vector<double> out(static_cast<size_t>(s.rows() * s.out_width()));
    for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / (H / Hkv);
            for (int64_t t = 0; t < T; ++t) {
                const int64_t first = starts[static_cast<size_t>(b * T + t)];
                std::vector<double> score(static_cast<size_t>(T), -std::numeric_limits<double>::infinity());
                double max_score = -std::numeric_limits<double>::infinity(), sum = 0;
                for (int64_t k = first; k <= t; ++k) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += get(qkv, (b * T + t) * W + h * D + d) * get(qkv, (b * T + k) * W + (H + g) * D + d);
                    score[static_cast<size_t>(k)] = dot / std::sqrt(static_cast<double>(D));
                    max_score = std::max(max_score, score[static_cast<size_t>(k)]);
                }
                for (int64_t k = first; k <= t; ++k) sum += std::exp(score[static_cast<size_t>(k)] - max_score);
                for (int64_t d = 0; d < D; ++d) {
                    double o = 0;
                    for (int64_t k = first; k <= t; ++k)
                        o += std::exp(score[static_cast<size_t>(k)] - max_score) / sum * get(qkv, (b * T + k) * W + (H + Hkv + g) * D + d);
                    out[static_cast<size_t>((b * T + t) * s.out_width() + h * D + d)] = o;
                }
            }
        }
    return out;
}

void expect_attention_matches_reference(const AttentionShape& s, const std::vector<int32_t>& starts) {
    auto be = cpu_backend();
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 60, -2, 2);
    const OwnedTensor out(f64, {s.rows(), s.out_width()}), saved(f64, be->attention_saved_shape(s)), doc = starts_tensor(starts);
    const OwnedTensor R = random_tensor(f64, {s.rows(), s.out_width()}, 61);
    auto loss = [&] {
        be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});
        return weighted_sum(out, R);
    };
    loss();
    const std::vector<double> expected = reference_attention(qkv, s, starts);
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_NEAR(get(out, i), expected[static_cast<size_t>(i)], 1e-12) << "element " << i;
    const OwnedTensor dqkv = filled(f64, {s.rows(), s.qkv_width()}, 99.0);
    be->attention_bwd({.dqkv = dqkv, .dout = R, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = doc});
    expect_gradient_matches("dqkv", qkv, dqkv, loss);
}

}  // namespace

TEST(DocumentMaskAttention, RandomBoundaries_MatchTheDirectReferenceForwardAndBackward) {
    for (const AttentionShape& s : {AttentionShape{2, 9, 4, 2, 3}, AttentionShape{3, 7, 2, 2, 4}, AttentionShape{1, 11, 3, 1, 5}}) {
        SCOPED_TRACE(testing::Message() << "B=" << s.batch << " T=" << s.seq_len << " H=" << s.n_heads << " Hkv=" << s.n_kv_heads);
        const std::vector<int32_t> starts = random_starts(s.batch, s.seq_len, static_cast<uint32_t>(s.seq_len));
        ASSERT_TRUE(std::any_of(starts.begin(), starts.end(), [](int32_t x) { return x > 0; })) << "no boundary drawn";
        expect_attention_matches_reference(s, starts);
    }
}

TEST(DocumentMaskAttention, BoundaryBeforeTheLastPosition_LeavesTheLastTokenItsOwnValue) {
    // An end-of-text token at T - 2: the last token is a document of one and attends to itself only.
    const AttentionShape s{1, 6, 2, 1, 4};
    std::vector<int32_t> starts = {0, 0, 0, 0, 0, 5};
    expect_attention_matches_reference(s, starts);
    auto be = cpu_backend();
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 62), out(f64, {s.rows(), s.out_width()});
    const OwnedTensor saved(f64, be->attention_saved_shape(s)), doc = starts_tensor(starts);
    be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});
    for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(get(out, 5 * s.out_width() + h * 4 + d), get(qkv, 5 * s.qkv_width() + (2 + 1) * 4 + d));
}

TEST(DocumentMaskAttention, NoBoundaryOrOneAtTheLastPosition_IsBitwiseCausal) {
    // An end-of-text token at the last position starts no document inside the sequence.
    const AttentionShape s{2, 8, 4, 2, 3};
    std::vector<int32_t> tokens(16, 1);
    tokens[7] = tokens[15] = 0;
    const std::vector<int32_t> starts = document_starts(tokens.data(), 2, 8, 0);
    ASSERT_EQ(starts, std::vector<int32_t>(16, 0));
    auto be = cpu_backend();
    const OwnedTensor qkv = random_tensor(DType::f32, {s.rows(), s.qkv_width()}, 63), doc = starts_tensor(starts);
    const OwnedTensor dout = random_tensor(DType::f32, {s.rows(), s.out_width()}, 64);
    const auto run = [&](const Tensor& doc_starts, const Tensor& out, const Tensor& saved, const Tensor& dqkv) {
        be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc_starts});
        be->attention_bwd({.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = doc_starts});
    };
    const Shape out_shape{s.rows(), s.out_width()}, qkv_shape{s.rows(), s.qkv_width()}, saved_shape = be->attention_saved_shape(s);
    const OwnedTensor out_c(DType::f32, out_shape), saved_c(DType::f32, saved_shape), dqkv_c(DType::f32, qkv_shape);
    const OwnedTensor out_d(DType::f32, out_shape), saved_d(DType::f32, saved_shape), dqkv_d(DType::f32, qkv_shape);
    run(Tensor(), out_c, saved_c, dqkv_c);
    run(doc, out_d, saved_d, dqkv_d);
    EXPECT_TRUE(bitwise_equal(out_c, out_d));
    EXPECT_TRUE(bitwise_equal(saved_c, saved_d));
    EXPECT_TRUE(bitwise_equal(dqkv_c, dqkv_d));
}

TEST(DocumentMaskRope, PositionsRestartAtEachDocumentAndBackwardIsTheInverse) {
    // Row n rotated with doc starts equals the same row rotated without them at row
    // (position n - start) of a sequence: the angle depends on the position in the document.
    const int64_t T = 7, heads = 2, D = 4, W = heads * D;
    auto be = cpu_backend();
    const OwnedTensor table(f64, {T, D});
    fill_rope_table(table, 100.0);
    const std::vector<int32_t> starts = {0, 0, 2, 2, 2, 5, 5};
    const OwnedTensor doc = starts_tensor(starts), x = random_tensor(f64, {T, W}, 70), work = copy_of(x);
    be->rope_fwd({.x = work, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = doc, .positions = Tensor()});
    for (int64_t n = 0; n < T; ++n) {
        const int64_t position = n - starts[static_cast<size_t>(n)];
        const OwnedTensor at(f64, {T, W});
        for (int64_t c = 0; c < W; ++c) set(at, position * W + c, get(x, n * W + c));
        be->rope_fwd({.x = at, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = Tensor()});
        for (int64_t c = 0; c < W; ++c) ASSERT_EQ(get(work, n * W + c), get(at, position * W + c)) << "row " << n << " column " << c;
    }
    be->rope_bwd({.x = work, .table = table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = doc, .positions = Tensor()});
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(get(work, i), get(x, i), 1e-14);
}

TEST(DocumentMaskEmbedding, LearnedPositionsRestartAtEachDocument) {
    const int64_t B = 2, T = 5, C = 3, V = 6, N = B * T;
    auto be = cpu_backend();
    const std::vector<int32_t> starts = {0, 0, 2, 2, 4, 0, 1, 1, 1, 1};
    const OwnedTensor doc = starts_tensor(starts), tokens = random_tokens(N, V, 71);
    const OwnedTensor wte = random_tensor(f64, {V, C}, 72), wpe = random_tensor(f64, {T, C}, 73), out(f64, {N, C});
    be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = doc, .positions = Tensor()});
    for (int64_t n = 0; n < N; ++n) {
        const int64_t position = n % T - starts[static_cast<size_t>(n)];
        for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(get(out, n * C + c), get(wte, tokens.data<int32_t>()[n] * C + c) + get(wpe, position * C + c)) << "row " << n;
    }
    const OwnedTensor R = random_tensor(f64, {N, C}, 74), dwte = filled(f64, {V, C}, 0.5), dwpe = filled(f64, {T, C}, 0.5);
    auto loss = [&] {
        be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = doc, .positions = Tensor()});
        return weighted_sum(out, R);
    };
    be->embedding_bwd({.dwte = dwte, .dwpe = dwpe, .dout = R, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = doc, .positions = Tensor()});
    expect_gradient_matches("dwpe", wpe, dwpe, loss, 0.5);
    expect_gradient_matches("dwte", wte, dwte, loss, 0.5);
}

TEST(DocumentMaskOps, StartAfterItsOwnPosition_IsRefusedNamingTheRow) {
    const AttentionShape s{1, 4, 1, 1, 2};
    auto be = cpu_backend();
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 75), out(f64, {s.rows(), s.out_width()});
    const OwnedTensor saved(f64, be->attention_saved_shape(s)), doc = starts_tensor({0, 0, 3, 2});
    try {
        be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});
        FAIL() << "a document start after its token was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::shape);
        EXPECT_NE(std::string(e.what()).find("doc_starts 3 at row 2"), std::string::npos) << e.what();
    }
}

// Every CPU op with a backward, checked in f64 against central finite differences of
// L = sum(out * R) for a fixed random R, on shapes with odd sizes. Parameter gradients start
// from a pre-filled buffer to prove they accumulate; activation gradients start from garbage
// to prove they are overwritten.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr double prefill = 0.375;  // what a parameter gradient holds before backward adds to it
constexpr double garbage = 99.0;   // what an activation gradient holds before backward overwrites it

std::unique_ptr<Backend> cpu_backend() { return make_cpu_backend(1); }

void check_embedding(int64_t B, int64_t T, int64_t C, int64_t V, bool positions) {
    SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " C=" << C << " V=" << V << " positions=" << positions);
    auto be = cpu_backend();
    const int64_t N = B * T;
    const OwnedTensor tokens = random_tokens(N, V, 1);
    const OwnedTensor wte = random_tensor(f64, {V, C}, 2);
    const OwnedTensor wpe = positions ? random_tensor(f64, {T + 2, C}, 3) : OwnedTensor();
    const OwnedTensor out(f64, {N, C}), R = random_tensor(f64, {N, C}, 4);
    auto loss = [&] {
        be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
        return weighted_sum(out, R);
    };
    const OwnedTensor dwte = filled(f64, {V, C}, prefill);
    const OwnedTensor dwpe = positions ? filled(f64, {T + 2, C}, prefill) : OwnedTensor();
    be->embedding_bwd({.dwte = dwte, .dwpe = dwpe, .dout = R, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
    expect_gradient_matches("dwte", wte, dwte, loss, prefill);
    if (positions) expect_gradient_matches("dwpe", wpe, dwpe, loss, prefill);
}

void check_layernorm(int64_t N, int64_t C) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    auto be = cpu_backend();
    const OwnedTensor x = random_tensor(f64, {N, C}, 10, -2, 3), w = random_tensor(f64, {C}, 11, 0.5, 1.5), b = random_tensor(f64, {C}, 12);
    const OwnedTensor out(f64, {N, C}), mean(f64, {N}), rstd(f64, {N}), R = random_tensor(f64, {N, C}, 13);
    auto loss = [&] {
        be->layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .eps = 1e-5});
        return weighted_sum(out, R);
    };
    loss();
    const OwnedTensor dx = filled(f64, {N, C}, garbage), dw = filled(f64, {C}, prefill), db = filled(f64, {C}, prefill);
    be->layernorm_bwd({.dx = dx, .dw = dw, .db = db, .dout = R, .x = x, .w = w, .mean = mean, .rstd = rstd, .accumulate_dx = false});
    expect_gradient_matches("dx", x, dx, loss);
    expect_gradient_matches("dw", w, dw, loss, prefill);
    expect_gradient_matches("db", b, db, loss, prefill);
}

void check_rmsnorm(int64_t N, int64_t C) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    auto be = cpu_backend();
    const OwnedTensor x = random_tensor(f64, {N, C}, 20, -2, 3), w = random_tensor(f64, {C}, 21, 0.5, 1.5);
    const OwnedTensor out(f64, {N, C}), rstd(f64, {N}), R = random_tensor(f64, {N, C}, 22);
    auto loss = [&] {
        be->rmsnorm_fwd({.out = out, .rstd = rstd, .x = x, .w = w, .eps = 1e-5});
        return weighted_sum(out, R);
    };
    loss();
    const OwnedTensor dx = filled(f64, {N, C}, garbage), dw = filled(f64, {C}, prefill);
    be->rmsnorm_bwd({.dx = dx, .dw = dw, .dout = R, .x = x, .w = w, .rstd = rstd, .accumulate_dx = false});
    expect_gradient_matches("dx", x, dx, loss);
    expect_gradient_matches("dw", w, dw, loss, prefill);
}

void check_matmul(int64_t N, int64_t IC, int64_t OC, bool with_bias) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " IC=" << IC << " OC=" << OC << " bias=" << with_bias);
    auto be = cpu_backend();
    const OwnedTensor x = random_tensor(f64, {N, IC}, 30), w = random_tensor(f64, {OC, IC}, 31);
    const OwnedTensor bias = with_bias ? random_tensor(f64, {OC}, 32) : OwnedTensor();
    const OwnedTensor out(f64, {N, OC}), R = random_tensor(f64, {N, OC}, 33);
    auto loss = [&] {
        be->matmul_fwd({.out = out, .x = x, .w = w, .bias = bias});
        return weighted_sum(out, R);
    };
    const OwnedTensor dx = filled(f64, {N, IC}, garbage), dw = filled(f64, {OC, IC}, prefill);
    const OwnedTensor dbias = with_bias ? filled(f64, {OC}, prefill) : OwnedTensor();
    be->matmul_bwd({.dx = dx, .dw = dw, .dbias = dbias, .dout = R, .x = x, .w = w});
    expect_gradient_matches("dx", x, dx, loss);
    expect_gradient_matches("dw", w, dw, loss, prefill);
    if (with_bias) expect_gradient_matches("dbias", bias, dbias, loss, prefill);
}

void check_attention(const AttentionShape& s) {
    SCOPED_TRACE(testing::Message() << "B=" << s.batch << " T=" << s.seq_len << " H=" << s.n_heads << " Hkv=" << s.n_kv_heads << " D=" << s.head_dim);
    auto be = cpu_backend();
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 40);
    const OwnedTensor out(f64, {s.rows(), s.out_width()}), saved(f64, be->attention_saved_shape(s));
    const OwnedTensor R = random_tensor(f64, {s.rows(), s.out_width()}, 41);
    auto loss = [&] {
        be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = Tensor()});
        return weighted_sum(out, R);
    };
    loss();
    const OwnedTensor dqkv = filled(f64, {s.rows(), s.qkv_width()}, garbage);
    be->attention_bwd({.dqkv = dqkv, .dout = R, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = Tensor()});
    expect_gradient_matches("dqkv", qkv, dqkv, loss);
}

void check_rope(int64_t B, int64_t T, int64_t n_heads, int64_t D) {
    SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " heads=" << n_heads << " D=" << D);
    auto be = cpu_backend();
    const int64_t N = B * T, W = (n_heads + 1) * D + 1;  // one more head and a column rope leaves alone
    const OwnedTensor table(f64, {T + 1, D});
    fill_rope_table(table, 100.0);
    const OwnedTensor x = random_tensor(f64, {N, W}, 50), work(f64, {N, W}), R = random_tensor(f64, {N, W}, 51);
    auto loss = [&] {
        copy_into(work, x);
        be->rope_fwd({.x = work, .table = table, .seq_len = T, .n_heads = n_heads, .head_dim = D, .doc_starts = Tensor(), .positions = Tensor()});
        return weighted_sum(work, R);
    };
    const OwnedTensor dx = copy_of(R);
    be->rope_bwd({.x = dx, .table = table, .seq_len = T, .n_heads = n_heads, .head_dim = D, .doc_starts = Tensor(), .positions = Tensor()});
    expect_gradient_matches("dx", x, dx, loss);
}

}  // namespace

TEST(EmbeddingBackward, MatchesFiniteDifferencesAndAccumulates) {
    check_embedding(1, 1, 5, 7, true);
    check_embedding(2, 3, 13, 11, true);
    check_embedding(1, 7, 5, 7, true);
    check_embedding(3, 5, 13, 7, false);
}

TEST(LayerNormBackward, MatchesFiniteDifferencesAndAccumulates) {
    for (int64_t N : {1, 3, 7})
        for (int64_t C : {5, 13}) check_layernorm(N, C);
}

TEST(RmsNormBackward, MatchesFiniteDifferencesAndAccumulates) {
    for (int64_t N : {1, 3, 7})
        for (int64_t C : {5, 13}) check_rmsnorm(N, C);
}

TEST(MatmulBackward, WithBias_MatchesFiniteDifferencesAndAccumulates) {
    for (int64_t N : {1, 3, 7}) {
        check_matmul(N, 5, 3, true);
        check_matmul(N, 13, 6, true);
    }
}

TEST(MatmulBackward, WithoutBias_MatchesFiniteDifferencesAndAccumulates) {
    for (int64_t N : {1, 3, 7}) {
        check_matmul(N, 5, 3, false);
        check_matmul(N, 13, 6, false);
    }
}

TEST(AttentionBackward, MultiHead_MatchesFiniteDifferences) {
    check_attention({1, 1, 2, 2, 2});
    check_attention({2, 5, 2, 2, 4});
    check_attention({1, 7, 3, 3, 6});
}

TEST(AttentionBackward, GroupedQueryTwoKvHeads_MatchesFiniteDifferences) {
    check_attention({1, 1, 4, 2, 2});
    check_attention({2, 5, 4, 2, 4});
    check_attention({1, 7, 4, 2, 6});
}

TEST(AttentionBackward, GroupedQueryOneKvHead_MatchesFiniteDifferences) {
    check_attention({2, 5, 4, 1, 4});
    check_attention({1, 7, 4, 1, 6});
}

TEST(RopeBackward, MatchesFiniteDifferences) {
    for (int64_t D : {2, 4, 6})
        for (int64_t heads : {1, 3}) {
            check_rope(1, 1, heads, D);
            check_rope(2, 5, heads, D);
            check_rope(1, 7, heads, D);
        }
}

TEST(GeluBackward, MatchesFiniteDifferences) {
    auto be = cpu_backend();
    for (int64_t N : {1, 3, 7}) {
        SCOPED_TRACE(testing::Message() << "N=" << N);
        const OwnedTensor x = random_tensor(f64, {N, 13}, 60, -4, 4), out(f64, {N, 13}), R = random_tensor(f64, {N, 13}, 61);
        auto loss = [&] {
            be->gelu_fwd(out, x);
            return weighted_sum(out, R);
        };
        const OwnedTensor dx = filled(f64, {N, 13}, garbage);
        be->gelu_bwd(dx, R, x);
        expect_gradient_matches("dx", x, dx, loss);
    }
}

TEST(SwigluBackward, MatchesFiniteDifferences) {
    auto be = cpu_backend();
    for (int64_t N : {1, 3, 7})
        for (int64_t F : {1, 5, 13}) {
            SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F);
            const OwnedTensor x = random_tensor(f64, {N, 2 * F}, 70, -4, 4), out(f64, {N, F}), R = random_tensor(f64, {N, F}, 71);
            auto loss = [&] {
                be->swiglu_fwd(out, x);
                return weighted_sum(out, R);
            };
            const OwnedTensor dx = filled(f64, {N, 2 * F}, garbage);
            be->swiglu_bwd(dx, R, x);
            expect_gradient_matches("dx", x, dx, loss);
        }
}

TEST(CrossEntropyBackward, MatchesFiniteDifferences) {
    auto be = cpu_backend();
    const double dloss = 0.37;  // the backward's scalar upstream gradient: L = dloss * sum(losses)
    for (int64_t N : {1, 3, 7})
        for (int64_t V : {7, 11}) {
            SCOPED_TRACE(testing::Message() << "N=" << N << " V=" << V);
            const OwnedTensor logits = random_tensor(f64, {N, V}, 80, -3, 3), targets = random_tokens(N, V, 81), losses(f64, {N});
            const OwnedTensor ones = filled(f64, {N}, dloss);
            auto loss = [&] {
                be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = targets, .vocab = {}});
                return weighted_sum(losses, ones);
            };
            const OwnedTensor dlogits = filled(f64, {N, V}, garbage);
            be->xent_bwd({.dlogits = dlogits, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = dloss});
            expect_gradient_matches("dlogits", logits, dlogits, loss);
        }
}

// The CPU backend beyond gradients: f32 forwards agree with f64, AdamW and sum_squares give
// hand-computed values, results are bitwise reproducible across runs and thread counts, bad
// shapes and token ids raise typed errors, and the ops' special cases (in-place cross-entropy,
// rope round trip, one-token attention) hold.
#include <cblas.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr DType f32 = DType::f32;

std::unique_ptr<Backend> cpu_backend(int threads = 1) { return make_cpu_backend(threads); }

// Runs `run` once on the f64 inputs and once on f32 copies of them, each time into fresh
// outputs of the given shapes; every f32 output must match its f64 twin within rtol.
using OpRun = std::function<void(Backend&, const std::vector<Tensor>& in, const std::vector<Tensor>& out)>;

void expect_f32_matches_f64(const std::vector<const OwnedTensor*>& inputs_f64, const std::vector<Shape>& output_shapes, const OpRun& run,
                            double rtol = 1e-5) {
    auto be = cpu_backend();
    std::vector<OwnedTensor> owned;
    std::vector<Tensor> in64, in32, out64, out32;
    for (const OwnedTensor* t : inputs_f64) {
        in64.push_back(*t);
        owned.push_back(converted(*t, f32));
        in32.push_back(owned.back());
    }
    for (const Shape& shape : output_shapes) {
        owned.emplace_back(f64, shape);
        out64.push_back(owned.back());
        owned.emplace_back(f32, shape);
        out32.push_back(owned.back());
    }
    run(*be, in64, out64);
    run(*be, in32, out32);
    for (size_t i = 0; i < out64.size(); ++i) expect_close(("output " + std::to_string(i)).c_str(), out32[i], out64[i], rtol);
}

}  // namespace

// ---- f32 forwards against f64 ----

TEST(F32Forward, Embedding_MatchesF64) {
    const OwnedTensor tokens = random_tokens(14, 11, 1), wte = random_tensor(f64, {11, 13}, 2), wpe = random_tensor(f64, {9, 13}, 3);
    expect_f32_matches_f64({&tokens, &wte, &wpe}, {{14, 13}}, [](Backend& be, const auto& in, const auto& out) {
        be.embedding_fwd({.out = out[0], .tokens = in[0], .wte = in[1], .wpe = in[2], .seq_len = 7, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
    });
}

TEST(F32Forward, LayerNorm_MatchesF64) {
    const OwnedTensor x = random_tensor(f64, {7, 13}, 4, -2, 3), w = random_tensor(f64, {13}, 5), b = random_tensor(f64, {13}, 6);
    expect_f32_matches_f64({&x, &w, &b}, {{7, 13}, {7}, {7}}, [](Backend& be, const auto& in, const auto& out) {
        be.layernorm_fwd({.out = out[0], .mean = out[1], .rstd = out[2], .x = in[0], .w = in[1], .b = in[2], .eps = 1e-5});
    });
}

TEST(F32Forward, RmsNorm_MatchesF64) {
    const OwnedTensor x = random_tensor(f64, {7, 13}, 7, -2, 3), w = random_tensor(f64, {13}, 8);
    expect_f32_matches_f64({&x, &w}, {{7, 13}, {7}}, [](Backend& be, const auto& in, const auto& out) {
        be.rmsnorm_fwd({.out = out[0], .rstd = out[1], .x = in[0], .w = in[1], .eps = 1e-5});
    });
}

TEST(F32Forward, Matmul_MatchesF64) {
    const OwnedTensor x = random_tensor(f64, {7, 13}, 9), w = random_tensor(f64, {6, 13}, 10), bias = random_tensor(f64, {6}, 11);
    expect_f32_matches_f64({&x, &w, &bias}, {{7, 6}}, [](Backend& be, const auto& in, const auto& out) {
        be.matmul_fwd({.out = out[0], .x = in[0], .w = in[1], .bias = in[2]});
    });
}

TEST(F32Forward, Attention_MatchesF64) {
    const AttentionShape s{2, 7, 4, 2, 6};
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 12);
    const Shape saved = cpu_backend()->attention_saved_shape(s);
    expect_f32_matches_f64({&qkv}, {{s.rows(), s.out_width()}, saved}, [&](Backend& be, const auto& in, const auto& out) {
        be.attention_fwd({.out = out[0], .saved = out[1], .qkv = in[0], .shape = s, .doc_starts = Tensor()});
    });
}

TEST(F32Forward, Rope_MatchesF64) {
    const OwnedTensor x = random_tensor(f64, {10, 20}, 13), table(f64, {6, 6});
    fill_rope_table(table, 10000.0);
    expect_f32_matches_f64({&x, &table}, {{10, 20}}, [](Backend& be, const auto& in, const auto& out) {
        copy_into(out[0], in[0]);
        be.rope_fwd({.x = out[0], .table = in[1], .seq_len = 5, .n_heads = 3, .head_dim = 6, .doc_starts = Tensor(), .positions = Tensor()});
    });
}

TEST(F32Forward, GeluSwigluAdd_MatchF64) {
    const OwnedTensor x = random_tensor(f64, {7, 10}, 14, -4, 4), y = random_tensor(f64, {7, 10}, 15);
    expect_f32_matches_f64({&x, &y}, {{7, 10}, {7, 5}, {7, 10}}, [](Backend& be, const auto& in, const auto& out) {
        be.gelu_fwd(out[0], in[0]);
        be.swiglu_fwd(out[1], in[0]);
        be.add(out[2], in[0], in[1]);
    });
}

TEST(F32Forward, CrossEntropy_MatchesF64) {
    const OwnedTensor logits = random_tensor(f64, {7, 11}, 16, -5, 5), targets = random_tokens(7, 11, 17);
    expect_f32_matches_f64({&logits, &targets}, {{7}, {7, 11}}, [](Backend& be, const auto& in, const auto& out) {
        be.xent_fwd({.losses = out[0], .lse = Tensor(), .logits = in[0], .targets = in[1], .vocab = {}});
        be.xent_bwd({.dlogits = out[1], .logits = in[0], .targets = in[1], .lse = Tensor(), .vocab = {}, .dloss = 0.5});
    });
}

// ---- values computed by hand ----

TEST(AdamW, TwoStepsMatchHandComputedUpdate) {
    auto be = cpu_backend();
    const OwnedTensor param = filled(f64, {3}, 1.0), grad(f64, {3}), m(f64, {3}), v(f64, {3});
    AdamWStep s;
    s.lr = 0.1;
    s.beta1 = 0.9;
    s.beta2 = 0.95;
    s.eps = 1e-8;
    s.weight_decay = 0.01;
    // Step 1, g = 0.5 (grad 0.25 scaled by 2): m = 0.05, v = 0.0125, m_hat = 0.5, v_hat = 0.25,
    // so p = 1 - 0.1 (0.5 / (0.5 + 1e-8) + 0.01 * 1).
    for (int i = 0; i < 3; ++i) grad.data<double>()[i] = 0.25;
    s.grad_scale = 2.0;
    s.step = 1;
    be->adamw({.param = param, .grad = grad, .m = m, .v = v, .param_copy = Tensor(), .step = s});
    const double p1 = 1.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01);
    EXPECT_NEAR(m.data<double>()[0], 0.05, 1e-15);
    EXPECT_NEAR(v.data<double>()[0], 0.0125, 1e-15);
    EXPECT_NEAR(param.data<double>()[0], p1, 1e-15);
    // Step 2, g = -0.25: m = 0.045 - 0.025 = 0.02, v = 0.011875 + 0.003125 = 0.015,
    // m_hat = 0.02 / (1 - 0.81), v_hat = 0.015 / (1 - 0.9025).
    for (int i = 0; i < 3; ++i) grad.data<double>()[i] = -0.25;
    s.grad_scale = 1.0;
    s.step = 2;
    be->adamw({.param = param, .grad = grad, .m = m, .v = v, .param_copy = Tensor(), .step = s});
    const double p2 = p1 - 0.1 * ((0.02 / 0.19) / (std::sqrt(0.015 / 0.0975) + 1e-8) + 0.01 * p1);
    for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(m.data<double>()[i], 0.02, 1e-15);
        EXPECT_NEAR(v.data<double>()[i], 0.015, 1e-15);
        EXPECT_NEAR(param.data<double>()[i], p2, 1e-14);
    }
}

TEST(AdamW, F32MatchesF64) {
    const OwnedTensor p = random_tensor(f64, {37}, 20), g = random_tensor(f64, {37}, 21), m = random_tensor(f64, {37}, 22, -0.1, 0.1),
                      v = random_tensor(f64, {37}, 23, 0.0, 0.1);
    AdamWStep s;
    s.lr = 1e-2;
    s.weight_decay = 0.1;
    s.step = 3;
    expect_f32_matches_f64({&p, &g, &m, &v}, {{37}, {37}, {37}}, [&](Backend& be, const auto& in, const auto& out) {
        for (size_t i = 0; i < 3; ++i) copy_into(out[i], i == 0 ? in[0] : in[i + 1]);
        be.adamw({.param = out[0], .grad = in[1], .m = out[1], .v = out[2], .param_copy = Tensor(), .step = s});
    });
}

TEST(SumSquares, IsExactOnSmallIntegersAcrossChunkBoundaries) {
    const int64_t count = 100003;  // several chunks and a partial one
    double expected = 0;
    for (int64_t i = 0; i < count; ++i) expected += 0.25 * static_cast<double>((i % 7 - 3) * (i % 7 - 3));
    for (DType dt : {f32, f64}) {
        OwnedTensor x(dt, {count});
        for (int64_t i = 0; i < count; ++i) set(x, i, 0.5 * static_cast<double>(i % 7 - 3));
        EXPECT_EQ(cpu_backend()->sum_squares(x), expected);
    }
}

TEST(SumSquares, IsBitwiseIdenticalForOneAndTwoThreads) {
    const OwnedTensor x = random_tensor(f32, {70001}, 30);
    const double one = cpu_backend(1)->sum_squares(x), two = cpu_backend(2)->sum_squares(x);
    EXPECT_EQ(one, two);
}

TEST(FillZero, ZeroesEveryElement) {
    const OwnedTensor x = random_tensor(f32, {5, 7}, 31);
    cpu_backend()->fill_zero(x);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(get(x, i), 0.0);
}

// 1 + 2^-9 lies below the midpoint between bf16's 1 and 1 + 2^-7, 1 + 3 * 2^-9 above it, and
// 1 + 2^-8 on it (to even: 1); widening back is exact.
TEST(Copy, F32ToBf16AndF16RoundsToNearestEvenAndWidensBackExactly) {
    std::vector<float> values = {1 + std::ldexp(1.0f, -9), 1 + 3 * std::ldexp(1.0f, -9), 1 + std::ldexp(1.0f, -8), -3.5f, 0};
    const int64_t n = static_cast<int64_t>(values.size());
    for (DType half : {DType::bf16, DType::f16}) {
        std::vector<uint16_t> narrow(values.size());
        std::vector<float> back(values.size());
        cpu_backend()->copy(Tensor(narrow.data(), half, {n}), Tensor(values.data(), f32, {n}));
        cpu_backend()->copy(Tensor(back.data(), f32, {n}), Tensor(narrow.data(), half, {n}));
        for (size_t i = 0; i < values.size(); ++i) {
            const uint16_t expected = half == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
            EXPECT_EQ(narrow[i], expected) << dtype_name(half) << " element " << i;
            EXPECT_EQ(back[i], half == DType::bf16 ? bf16_to_float(expected) : f16_to_float(expected)) << dtype_name(half) << " element " << i;
        }
        if (half != DType::bf16) continue;
        EXPECT_EQ(back[0], 1.0f);
        EXPECT_EQ(back[1], 1 + std::ldexp(1.0f, -7));
        EXPECT_EQ(back[2], 1.0f);
        EXPECT_EQ(back[3], -3.5f);
    }
}

TEST(RopeTable, HoldsCosThenSinOfPositionTimesInverseFrequency) {
    const OwnedTensor table(f64, {5, 6});
    fill_rope_table(table, 10000.0);
    for (int64_t pos = 0; pos < 5; ++pos)
        for (int64_t i = 0; i < 3; ++i) {
            const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(i) / 6.0);
            EXPECT_DOUBLE_EQ(get(table, pos * 6 + i), std::cos(angle));
            EXPECT_DOUBLE_EQ(get(table, pos * 6 + 3 + i), std::sin(angle));
        }
}

// ---- special cases of single ops ----

TEST(CrossEntropyBackward, InPlaceOnLogitsEqualsSeparateOutput) {
    auto be = cpu_backend();
    const OwnedTensor logits = random_tensor(f32, {9, 11}, 40, -4, 4), targets = random_tokens(9, 11, 41), separate(f32, {9, 11});
    be->xent_bwd({.dlogits = separate, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = 0.25});
    be->xent_bwd({.dlogits = logits, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = 0.25});
    EXPECT_TRUE(bitwise_equal(logits, separate));
}

TEST(CrossEntropyForward, OneHotLogitsGiveKnownLoss) {
    // Row logits (2, 0, 0) with target 0: loss = log(e^2 + 2) - 2.
    const OwnedTensor logits(f64, {1, 3}), targets(DType::i32, {1}), losses(f64, {1});
    set(logits, 0, 2.0);
    cpu_backend()->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = targets, .vocab = {}});
    EXPECT_NEAR(get(losses, 0), std::log(std::exp(2.0) + 2.0) - 2.0, 1e-15);
}

TEST(Rope, ForwardThenBackwardIsIdentity) {
    auto be = cpu_backend();
    const OwnedTensor table(f64, {8, 4});
    fill_rope_table(table, 10000.0);
    const OwnedTensor x = random_tensor(f64, {14, 13}, 42), work = copy_of(x);
    be->rope_fwd({.x = work, .table = table, .seq_len = 7, .n_heads = 3, .head_dim = 4, .doc_starts = Tensor(), .positions = Tensor()});
    be->rope_bwd({.x = work, .table = table, .seq_len = 7, .n_heads = 3, .head_dim = 4, .doc_starts = Tensor(), .positions = Tensor()});
    expect_close("x", work, x, 1e-14);
}

TEST(Rope, LeavesColumnsPastTheRotatedHeadsAndPositionZeroUnchanged) {
    auto be = cpu_backend();
    const OwnedTensor table(f64, {8, 4});
    fill_rope_table(table, 10000.0);
    const OwnedTensor x = random_tensor(f64, {14, 13}, 43), work = copy_of(x);
    be->rope_fwd({.x = work, .table = table, .seq_len = 7, .n_heads = 2, .head_dim = 4, .doc_starts = Tensor(), .positions = Tensor()});
    for (int64_t n = 0; n < 14; ++n)
        for (int64_t c = 0; c < 13; ++c)
            if (c >= 8 || n % 7 == 0) {
                ASSERT_EQ(get(work, n * 13 + c), get(x, n * 13 + c)) << "row " << n << " column " << c;
            }
}

TEST(Attention, OneTokenOutputEqualsItsValueHead) {
    auto be = cpu_backend();
    const AttentionShape s{3, 1, 4, 2, 5};
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 44), out(f64, {s.rows(), s.out_width()});
    const OwnedTensor saved(f64, be->attention_saved_shape(s));
    be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = Tensor()});
    for (int64_t n = 0; n < s.rows(); ++n)
        for (int64_t h = 0; h < 4; ++h)
            for (int64_t d = 0; d < 5; ++d) {
                const int64_t v_col = (4 + 2 + h / 2) * 5 + d;  // value head h / (H / Hkv)
                ASSERT_EQ(get(out, n * s.out_width() + h * 5 + d), get(qkv, n * s.qkv_width() + v_col));
            }
}

TEST(Attention, SavedProbabilitiesAreCausalAndSumToOne) {
    auto be = cpu_backend();
    const AttentionShape s{2, 6, 4, 1, 3};
    const Shape saved_shape = be->attention_saved_shape(s);
    ASSERT_EQ(saved_shape, Shape({2, 4, 6, 6}));
    const OwnedTensor qkv = random_tensor(f64, {s.rows(), s.qkv_width()}, 45), out(f64, {s.rows(), s.out_width()}), saved(f64, saved_shape);
    be->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = Tensor()});
    for (int64_t row = 0; row < 2 * 4 * 6; ++row) {
        const int64_t t = row % 6;
        double sum = 0;
        for (int64_t j = 0; j < 6; ++j) {
            const double p = get(saved, row * 6 + j);
            if (j > t) {
                EXPECT_EQ(p, 0.0);
            }
            sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-14);
    }
}

TEST(Embedding, WithoutPositionsCopiesTokenRows) {
    const OwnedTensor tokens = random_tokens(6, 5, 46), wte = random_tensor(f32, {5, 3}, 47), out(f32, {6, 3});
    cpu_backend()->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = Tensor(), .seq_len = 3, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
    for (int64_t n = 0; n < 6; ++n)
        for (int64_t c = 0; c < 3; ++c) ASSERT_EQ(get(out, n * 3 + c), get(wte, tokens.data<int32_t>()[n] * 3 + c));
}

TEST(MatmulBackward, EmptyDxStillAccumulatesDwAndDbias) {
    auto be = cpu_backend();
    const OwnedTensor x = random_tensor(f64, {5, 4}, 48), w = random_tensor(f64, {3, 4}, 49), dout = random_tensor(f64, {5, 3}, 50);
    const OwnedTensor dx(f64, {5, 4}), dw1(f64, {3, 4}), db1(f64, {3}), dw2(f64, {3, 4}), db2(f64, {3});
    be->matmul_bwd({.dx = dx, .dw = dw1, .dbias = db1, .dout = dout, .x = x, .w = w});
    be->matmul_bwd({.dx = Tensor(), .dw = dw2, .dbias = db2, .dout = dout, .x = x, .w = w});
    EXPECT_TRUE(bitwise_equal(dw1, dw2));
    EXPECT_TRUE(bitwise_equal(db1, db2));
}

namespace {
OwnedTensor small_integers(Shape shape, int64_t seed) {
    OwnedTensor t(f32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, static_cast<double>((i * 7 + seed) % 7 - 3));
    return t;
}

// C[m, n] = sum_k A[m, k] B[k, n] with A[m, k] = a(m, k), B[k, n] = b(k, n).
template <class A, class B>
double dot(int64_t K, A&& a, B&& b) {
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += a(k) * b(k);
    return sum;
}
}  // namespace

// A GEMM runs as one single-threaded BLAS call per thread's block of rows, or of columns when
// there are few rows: on small integers (exact sums) every thread count and every split,
// transposed operands included, gives the exact product.
TEST(Matmul, BlocksOverThreads_GiveTheExactProductForRowAndColumnSplits) {
    for (const auto& [N, IC, OC] : {std::array<int64_t, 3>{96, 24, 40}, {3, 24, 300}, {64, 300, 3}})
        for (int threads : {1, 2, 3, 5}) {
            SCOPED_TRACE(cat("N ", N, ", IC ", IC, ", OC ", OC, ", threads ", threads));
            auto be = cpu_backend(threads);
            const OwnedTensor x = small_integers({N, IC}, 1), w = small_integers({OC, IC}, 2), dout = small_integers({N, OC}, 3);
            const OwnedTensor out(f32, {N, OC}), dx(f32, {N, IC}), dw = filled(f32, {OC, IC}, 1);
            be->matmul_fwd({.out = out, .x = x, .w = w, .bias = Tensor()});
            be->matmul_bwd({.dx = dx, .dw = dw, .dbias = Tensor(), .dout = dout, .x = x, .w = w});
            for (int64_t n = 0; n < N; ++n)
                for (int64_t o = 0; o < OC; ++o)
                    ASSERT_EQ(get(out, n * OC + o), dot(IC, [&](int64_t k) { return get(x, n * IC + k); }, [&](int64_t k) { return get(w, o * IC + k); }));
            for (int64_t n = 0; n < N; ++n)
                for (int64_t i = 0; i < IC; ++i)
                    ASSERT_EQ(get(dx, n * IC + i), dot(OC, [&](int64_t k) { return get(dout, n * OC + k); }, [&](int64_t k) { return get(w, k * IC + i); }));
            for (int64_t o = 0; o < OC; ++o)
                for (int64_t i = 0; i < IC; ++i)
                    ASSERT_EQ(get(dw, o * IC + i), 1 + dot(N, [&](int64_t k) { return get(dout, k * OC + o); }, [&](int64_t k) { return get(x, k * IC + i); }));
        }
}

// One pool of threads: BLAS's own stays at one thread, so that it does not spin on the cores
// OpenMP's threads compute on (two threads were slower than one on two cores).
TEST(Matmul, BlasRunsSingleThreadedInsideTheBackendsThreads) {
    auto be = cpu_backend(2);
    EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(Add, MayWriteIntoAnInput) {
    auto be = cpu_backend();
    const OwnedTensor a = random_tensor(f32, {4, 5}, 51), b = random_tensor(f32, {4, 5}, 52), expected(f32, {4, 5});
    be->add(expected, a, b);
    be->add(a, a, b);
    EXPECT_TRUE(bitwise_equal(a, expected));
}

// ---- determinism ----

namespace {

// Runs `backward` into fresh gradient buffers with the backend and returns them.
using BackwardRun = std::function<std::vector<OwnedTensor>(Backend&)>;

void expect_bitwise_reproducible(const BackwardRun& backward, bool across_thread_counts) {
    auto two = cpu_backend(2);
    const std::vector<OwnedTensor> first = backward(*two), second = backward(*two);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(bitwise_equal(first[i], second[i])) << "output " << i << ", two runs with 2 threads";
    if (!across_thread_counts) return;
    auto one = cpu_backend(1);
    const std::vector<OwnedTensor> single = backward(*one);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(bitwise_equal(first[i], single[i])) << "output " << i << ", 1 thread against 2";
}

}  // namespace

TEST(Determinism, MatmulBackward_TwoRunsAreBitwiseEqual) {
    const OwnedTensor x = random_tensor(f32, {96, 80}, 60), w = random_tensor(f32, {200, 80}, 61), dout = random_tensor(f32, {96, 200}, 62);
    expect_bitwise_reproducible(
        [&](Backend& be) {
            std::vector<OwnedTensor> g;
            g.emplace_back(f32, Shape{96, 80});
            g.push_back(filled(f32, {200, 80}, 0.5));
            g.push_back(filled(f32, {200}, 0.5));
            be.matmul_bwd({.dx = g[0], .dw = g[1], .dbias = g[2], .dout = dout, .x = x, .w = w});
            return g;
        },
        false);  // BLAS may split its sums by thread count; same count, same result
}

TEST(Determinism, LayerNormBackward_IsBitwiseEqualAcrossRunsAndThreadCounts) {
    const OwnedTensor x = random_tensor(f32, {67, 200}, 63), w = random_tensor(f32, {200}, 64), b = random_tensor(f32, {200}, 65);
    const OwnedTensor out(f32, {67, 200}), mean(f32, {67}), rstd(f32, {67}), dout = random_tensor(f32, {67, 200}, 66);
    cpu_backend()->layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .eps = 1e-5});
    expect_bitwise_reproducible(
        [&](Backend& be) {
            std::vector<OwnedTensor> g;
            g.emplace_back(f32, Shape{67, 200});
            g.push_back(filled(f32, {200}, 0.5));
            g.push_back(filled(f32, {200}, 0.5));
            be.layernorm_bwd({.dx = g[0], .dw = g[1], .db = g[2], .dout = dout, .x = x, .w = w, .mean = mean, .rstd = rstd, .accumulate_dx = false});
            return g;
        },
        true);
}

TEST(Determinism, EmbeddingBackward_IsBitwiseEqualAcrossRunsAndThreadCounts) {
    const OwnedTensor tokens = random_tokens(160, 17, 67), dout = random_tensor(f32, {160, 150}, 68);
    expect_bitwise_reproducible(
        [&](Backend& be) {
            std::vector<OwnedTensor> g;
            g.push_back(filled(f32, {17, 150}, 0.5));
            g.push_back(filled(f32, {20, 150}, 0.5));
            be.embedding_bwd({.dwte = g[0], .dwpe = g[1], .dout = dout, .tokens = tokens, .seq_len = 16, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
            return g;
        },
        true);
}

TEST(Determinism, AttentionBackward_IsBitwiseEqualAcrossRunsAndThreadCounts) {
    const AttentionShape s{3, 16, 4, 2, 8};
    const OwnedTensor qkv = random_tensor(f32, {s.rows(), s.qkv_width()}, 69), out(f32, {s.rows(), s.out_width()});
    const OwnedTensor saved(f32, cpu_backend()->attention_saved_shape(s)), dout = random_tensor(f32, {s.rows(), s.out_width()}, 70);
    cpu_backend()->attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = Tensor()});
    expect_bitwise_reproducible(
        [&](Backend& be) {
            std::vector<OwnedTensor> g;
            g.emplace_back(f32, Shape{s.rows(), s.qkv_width()});
            be.attention_bwd({.dqkv = g[0], .dout = dout, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = Tensor()});
            return g;
        },
        true);
}

// ---- errors ----

TEST(ShapeErrors, NameTheOpAndTheTensor) {
    auto be = cpu_backend();
    const OwnedTensor x(f32, {4, 6}), w(f32, {6}), w_bad(f32, {7}), out(f32, {4, 6}), stats(f32, {4}), stats_bad(f32, {5});
    expect_error(ErrorKind::shape, {"layernorm_fwd", "w"}, [&] { be->layernorm_fwd({.out = out, .mean = stats, .rstd = stats, .x = x, .w = w_bad, .b = Tensor(), .eps = 1e-5}); });
    expect_error(ErrorKind::shape, {"rmsnorm_fwd", "rstd"}, [&] { be->rmsnorm_fwd({.out = out, .rstd = stats_bad, .x = x, .w = w, .eps = 1e-5}); });
    const OwnedTensor mw(f32, {3, 6}), mout_bad(f32, {4, 4}), mdout(f32, {4, 3});
    expect_error(ErrorKind::shape, {"matmul_fwd", "out"}, [&] { be->matmul_fwd({.out = mout_bad, .x = x, .w = mw, .bias = Tensor()}); });
    expect_error(ErrorKind::shape, {"matmul_bwd", "dw"}, [&] { be->matmul_bwd({.dx = Tensor(), .dw = w_bad, .dbias = Tensor(), .dout = mdout, .x = x, .w = mw}); });
    const AttentionShape s{1, 4, 2, 1, 3};
    const OwnedTensor qkv_bad(f32, {4, 9}), att_out(f32, {4, 6}), saved(f32, be->attention_saved_shape(s));
    expect_error(ErrorKind::shape, {"attention_fwd", "qkv"},
                 [&] { be->attention_fwd({.out = att_out, .saved = saved, .qkv = qkv_bad, .shape = s, .doc_starts = Tensor()}); });
    expect_error(ErrorKind::shape, {"attention_fwd", "n_kv_heads"}, [&] {
        be->attention_fwd({.out = att_out, .saved = saved, .qkv = qkv_bad, .shape = {1, 4, 3, 2, 2}, .doc_starts = Tensor()});
    });
    const OwnedTensor sw_out_bad(f32, {4, 6});
    expect_error(ErrorKind::shape, {"swiglu_fwd", "out"}, [&] { be->swiglu_fwd(sw_out_bad, x); });
    const OwnedTensor logits(f32, {4, 6}), targets_bad(DType::i32, {3}), losses(f32, {4});
    expect_error(ErrorKind::shape, {"xent_fwd", "targets"}, [&] { be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = targets_bad, .vocab = {}}); });
    const OwnedTensor x64(f64, {4, 6});
    expect_error(ErrorKind::shape, {"add", "b", "f64"}, [&] { be->add(out, x, x64); });
    const OwnedTensor table(f32, {3, 4});
    expect_error(ErrorKind::shape, {"rope_fwd", "seq_len"}, [&] { be->rope_fwd({.x = x, .table = table, .seq_len = 4, .n_heads = 1, .head_dim = 4, .doc_starts = Tensor(), .positions = Tensor()}); });
}

TEST(DataErrors, TokenOrTargetOutsideTheVocabularyIsReported) {
    auto be = cpu_backend();
    const OwnedTensor tokens(DType::i32, {4}), wte(f32, {5, 3}), out(f32, {4, 3});
    tokens.data<int32_t>()[2] = 5;
    expect_error(ErrorKind::data, {"embedding_fwd: token id 5 at row 2 is outside the vocabulary [0, 5)"},
                 [&] { be->embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = Tensor(), .seq_len = 4, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()}); });
    expect_error(ErrorKind::data, {"embedding_bwd", "token id 5"}, [&] {
        be->embedding_bwd({.dwte = wte, .dwpe = Tensor(), .dout = out, .tokens = tokens, .seq_len = 4, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
    });
    const OwnedTensor logits(f32, {4, 5}), losses(f32, {4});
    tokens.data<int32_t>()[2] = -1;
    expect_error(ErrorKind::data, {"xent_fwd", "target -1 at row 2"}, [&] { be->xent_fwd({.losses = losses, .lse = Tensor(), .logits = logits, .targets = tokens, .vocab = {}}); });
    expect_error(ErrorKind::data, {"xent_bwd", "target -1"}, [&] { be->xent_bwd({.dlogits = logits, .logits = logits, .targets = tokens, .lse = Tensor(), .vocab = {}, .dloss = 1.0}); });
}

TEST(Support, OnlyF32AndF64AreSupportedAndOthersThrowUnsupported) {
    auto be = cpu_backend();
    EXPECT_EQ(be->name(), "cpu");
    const OwnedTensor x(DType::bf16, {2, 2});
    expect_error(ErrorKind::unsupported, {"gelu_fwd", "bf16"}, [&] { be->gelu_fwd(x, x); });
}

TEST(Profile, CountsCallsPerOpAndSplitsOutGemmTime) {
    EXPECT_STREQ(op_name(Op::embedding_fwd), "embedding_fwd");
    EXPECT_STREQ(op_name(Op::fill_zero), "fill_zero");
    EXPECT_TRUE(op_is_gemm(Op::matmul_fwd) && op_is_gemm(Op::matmul_bwd));
    EXPECT_FALSE(op_is_gemm(Op::attention_fwd));
    auto be = cpu_backend();
    const OwnedTensor x = random_tensor(f32, {64, 64}, 80), w = random_tensor(f32, {64, 64}, 81), out(f32, {64, 64});
    be->matmul_fwd({.out = out, .x = x, .w = w, .bias = Tensor()});
    be->matmul_fwd({.out = out, .x = x, .w = w, .bias = Tensor()});
    be->gelu_fwd(out, x);
    const OpProfile& p = be->profile();
    EXPECT_EQ(p.calls[static_cast<size_t>(Op::matmul_fwd)], 2);
    EXPECT_EQ(p.calls[static_cast<size_t>(Op::gelu_fwd)], 1);
    EXPECT_EQ(p.calls[static_cast<size_t>(Op::add)], 0);
    EXPECT_GT(p.gemm_seconds(), 0.0);
    EXPECT_NEAR(p.total_seconds(), p.gemm_seconds() + p.seconds[static_cast<size_t>(Op::gelu_fwd)], 1e-12);
    be->profile().reset();
    EXPECT_EQ(be->profile().total_seconds(), 0.0);
}

TEST(Copy, CopiesEveryElementAndChecksTheShape) {
    auto be = cpu_backend();
    const OwnedTensor in = random_tensor(f32, {5, 3}, 9), out(f32, {5, 3}), wrong(f32, {3, 5});
    be->copy(out, in);
    EXPECT_TRUE(bitwise_equal(out, in));
    expect_error(ErrorKind::shape, {"copy", "out"}, [&] { be->copy(wrong, in); });
}

// The residual add fused into the norms' backward: accumulate_dx adds exactly what the
// overwriting call writes (bitwise, as the separate add did).
TEST(NormBackward, AccumulateDx_AddsTheOverwrittenResultToDx) {
    auto be = cpu_backend();
    const int64_t N = 5, C = 7;
    const OwnedTensor x = random_tensor(f32, {N, C}, 81), w = random_tensor(f32, {C}, 82), dout = random_tensor(f32, {N, C}, 83);
    const OwnedTensor out(f32, {N, C}), mean(f32, {N}), rstd(f32, {N});
    be->layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = Tensor(), .eps = 1e-5});
    for (const bool rms : {false, true}) {
        if (rms) be->rmsnorm_fwd({.out = out, .rstd = rstd, .x = x, .w = w, .eps = 1e-5});
        const OwnedTensor fresh(f32, {N, C}), dw(f32, {C}), db(f32, {C});
        const OwnedTensor residual = random_tensor(f32, {N, C}, 84), accumulated = copy_of(residual);
        if (rms) {
            be->rmsnorm_bwd({.dx = fresh, .dw = dw, .dout = dout, .x = x, .w = w, .rstd = rstd, .accumulate_dx = false});
            be->rmsnorm_bwd({.dx = accumulated, .dw = dw, .dout = dout, .x = x, .w = w, .rstd = rstd, .accumulate_dx = true});
        } else {
            be->layernorm_bwd({.dx = fresh, .dw = dw, .db = db, .dout = dout, .x = x, .w = w, .mean = mean, .rstd = rstd, .accumulate_dx = false});
            be->layernorm_bwd({.dx = accumulated, .dw = dw, .db = db, .dout = dout, .x = x, .w = w, .mean = mean, .rstd = rstd,
                               .accumulate_dx = true});
        }
        for (int64_t i = 0; i < N * C; ++i)
            EXPECT_EQ(accumulated.data<float>()[i], residual.data<float>()[i] + fresh.data<float>()[i]) << (rms ? "rmsnorm " : "layernorm ") << i;
    }
}

// ---- fused MLP ops and the kept logsumexp ----

// The CPU computes the fused ops as the composition of the separate ones: bitwise the same.
TEST(CpuFusedMlp, MatmulGeluFwd_IsBitwiseMatmulThenGelu) {
    auto be = cpu_backend();
    const int64_t N = 7, IC = 12, OC = 9;
    const OwnedTensor x = random_tensor(DType::f32, {N, IC}, 1), w = random_tensor(DType::f32, {OC, IC}, 2), b = random_tensor(DType::f32, {OC}, 3);
    const OwnedTensor pre(DType::f32, {N, OC}), act(DType::f32, {N, OC}), pre_ref(DType::f32, {N, OC}), act_ref(DType::f32, {N, OC});
    be->matmul_gelu_fwd({.act = act, .pre = pre, .x = x, .w = w, .bias = b});
    be->matmul_fwd({.out = pre_ref, .x = x, .w = w, .bias = b});
    be->gelu_fwd(act_ref, pre_ref);
    EXPECT_TRUE(bitwise_equal(pre, pre_ref));
    EXPECT_TRUE(bitwise_equal(act, act_ref));
}

TEST(CpuFusedMlp, GeluMatmulBwd_IsBitwiseMatmulBwdGeluBwdAndTheBiasColumnSums) {
    auto be = cpu_backend();
    const int64_t N = 7, F = 12, C = 9;
    const OwnedTensor act = random_tensor(DType::f32, {N, F}, 4), pre = random_tensor(DType::f32, {N, F}, 5, -3, 3);
    const OwnedTensor w = random_tensor(DType::f32, {C, F}, 6), dout = random_tensor(DType::f32, {N, C}, 7);
    const OwnedTensor d_pre(DType::f32, {N, F}), dpb = random_tensor(DType::f32, {F}, 8), dw = random_tensor(DType::f32, {C, F}, 9);
    const OwnedTensor db = random_tensor(DType::f32, {C}, 10);
    const OwnedTensor d_act_ref(DType::f32, {N, F}), d_pre_ref(DType::f32, {N, F}), dpb_ref = copy_of(dpb), dw_ref = copy_of(dw), db_ref = copy_of(db);
    be->gelu_matmul_bwd({.d_pre = d_pre, .d_pre_bias = dpb, .dw = dw, .dbias = db, .dout = dout, .act = act, .pre = pre, .w = w});

    // The unfused sequence the model ran before: down's backward, GELU's, then up's bias gradient.
    be->matmul_bwd({.dx = d_act_ref, .dw = dw_ref, .dbias = db_ref, .dout = dout, .x = act, .w = w});
    be->gelu_bwd(d_pre_ref, d_act_ref, pre);
    const OwnedTensor up_x = random_tensor(DType::f32, {N, 3}, 11), up_w = random_tensor(DType::f32, {F, 3}, 12);
    be->matmul_bwd({.dx = Tensor(), .dw = Tensor(), .dbias = dpb_ref, .dout = d_pre_ref, .x = up_x, .w = up_w});
    EXPECT_TRUE(bitwise_equal(d_pre, d_pre_ref));
    EXPECT_TRUE(bitwise_equal(dpb, dpb_ref));
    EXPECT_TRUE(bitwise_equal(dw, dw_ref));
    EXPECT_TRUE(bitwise_equal(db, db_ref));
}

// xent_fwd keeps each row's logsumexp; xent_bwd given it equals xent_bwd computing it.
TEST(CpuXent, ForwardKeepsTheLogsumexpThatTheBackwardWouldCompute) {
    auto be = cpu_backend();
    const int64_t N = 5, V = 11;
    const OwnedTensor logits = random_tensor(DType::f64, {N, V}, 13, -4, 4), targets(DType::i32, {N});
    for (int64_t n = 0; n < N; ++n) targets.data<int32_t>()[n] = static_cast<int32_t>((3 * n + 1) % V);
    const OwnedTensor losses(DType::f64, {N}), lse(DType::f64, {N}), d_given(DType::f64, {N, V}), d_computed(DType::f64, {N, V});
    be->xent_fwd({.losses = losses, .lse = lse, .logits = logits, .targets = targets, .vocab = {}});
    for (int64_t n = 0; n < N; ++n) {
        double m = -1e300, sum = 0;
        for (int64_t v = 0; v < V; ++v) m = std::max(m, logits.data<double>()[n * V + v]);
        for (int64_t v = 0; v < V; ++v) sum += std::exp(logits.data<double>()[n * V + v] - m);
        EXPECT_NEAR(lse.data<double>()[n], m + std::log(sum), 1e-12) << "row " << n;
    }
    be->xent_bwd({.dlogits = d_given, .logits = logits, .targets = targets, .lse = lse, .vocab = {}, .dloss = 0.5});
    be->xent_bwd({.dlogits = d_computed, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = 0.5});
    EXPECT_TRUE(bitwise_equal(d_given, d_computed));
}

// Every Backend op of the CUDA backend (bf16, and f16 for a subset) against the CPU f32
// reference, forward and backward, at shapes on the alignment edges: one row, odd row counts
// and sequence lengths (1, 7, 33), widths that are not a multiple of 8 (6, 10, 37, 1000) and
// widths that are (64, 768), vocabularies of 37, 1000 and 50257, head dims 64 and 128, MHA,
// GQA and MQA. Inputs are rounded to the 16-bit type on the host before either backend sees
// them (gpu_test_util.h), so the comparisons measure the GPU's arithmetic and its output
// rounding; the tolerances, and why, are next to their definitions there.
// Also: the conversions of copy() bit for bit, the kernels' determinism (two runs, bitwise
// the same), in-place and misaligned calls; context parallelism's attention blocks, explicit
// positions and copy_columns. Each test is SKIPPED without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#ifdef LLMTRAIN_CUDA_EMULATION
#include "emu_internal.h"
#endif
#include "gpu/gpu_test_util.h"
#include "model/transformer.h"

using namespace llmtrain;
using namespace llmtrain::gpu_test;
using llmtrain::test::copy_of;
using llmtrain::test::random_tensor;
using llmtrain::test::random_tokens;

namespace {

constexpr DType bf16 = DType::bf16;
constexpr DType f16 = DType::f16;
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;
constexpr double kNormEps = 1e-5;

// ---- host-side references and data ----

// Columns [begin, begin + count) of a host f32 matrix, as a copy.
OwnedTensor column_block(const Tensor& t, int64_t begin, int64_t count) {
    OwnedTensor out(f32, {t.dim(0), count});
    for (int64_t r = 0; r < t.dim(0); ++r)
        for (int64_t c = 0; c < count; ++c) out.data<float>()[r * count + c] = t.data<float>()[r * t.dim(1) + begin + c];
    return out;
}

// Per row of a host f32 matrix: the max, and the logsumexp (in double, stored as f32).
OwnedTensor row_max_of(const Tensor& logits) {
    OwnedTensor out(f32, {logits.dim(0)});
    const int64_t V = logits.dim(1);
    for (int64_t n = 0; n < logits.dim(0); ++n) {
        float m = logits.data<float>()[n * V];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, logits.data<float>()[n * V + v]);
        out.data<float>()[n] = m;
    }
    return out;
}

OwnedTensor row_logsumexp_of(const Tensor& logits) {
    OwnedTensor out(f32, {logits.dim(0)});
    const OwnedTensor mx = row_max_of(logits);
    const int64_t V = logits.dim(1);
    for (int64_t n = 0; n < logits.dim(0); ++n) {
        const double m = mx.data<float>()[n];
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits.data<float>()[n * V + v]) - m);
        out.data<float>()[n] = static_cast<float>(m + std::log(sum));
    }
    return out;
}

// Targets over the full vocabulary with rows 0-3 pinned to the edges of the shard
// [begin, begin + rows): its first and last column and the columns just outside it.
OwnedTensor shard_edge_targets(int64_t N, int64_t vocab, int64_t begin, int64_t rows, uint64_t seed) {
    OwnedTensor t = random_tokens(N, vocab, seed);
    int32_t* p = t.data<int32_t>();
    const int64_t edges[] = {begin, begin + rows - 1, begin - 1, begin + rows};
    for (int64_t i = 0; i < 4 && i < N; ++i)
        if (edges[i] >= 0 && edges[i] < vocab) p[i] = static_cast<int32_t>(edges[i]);
    return t;
}

// The log-sum-exp of each causal attention row, [B, H, T] in double: what CUDA's attention
// saves for the backward.
std::vector<double> attention_lse(const Tensor& qkv, const AttentionShape& s) {
    const float* x = qkv.data<float>();
    const int64_t W = s.qkv_width(), D = s.head_dim, T = s.seq_len, group = s.n_heads / s.n_kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<double> lse(static_cast<size_t>(s.batch * s.n_heads * T)), scores(static_cast<size_t>(T));
    for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.n_heads; ++h)
            for (int64_t t = 0; t < T; ++t) {
                const float* q = x + (b * T + t) * W + h * D;
                double m = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j <= t; ++j) {
                    const float* k = x + (b * T + j) * W + (s.n_heads + h / group) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * static_cast<double>(k[d]);
                    scores[static_cast<size_t>(j)] = dot * scale;
                    m = std::max(m, dot * scale);
                }
                double sum = 0;
                for (int64_t j = 0; j <= t; ++j) sum += std::exp(scores[static_cast<size_t>(j)] - m);
                lse[static_cast<size_t>((b * s.n_heads + h) * T + t)] = m + std::log(sum);
            }
    return lse;
}

std::string describe(const AttentionShape& s) {
    return cat("B ", s.batch, " T ", s.seq_len, " H ", s.n_heads, " Hkv ", s.n_kv_heads, " D ", s.head_dim);
}

float float_of_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

uint32_t bits_of(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

// f32 values for the conversions to 16 bits: random bit patterns (every finite exponent,
// f32 subnormals included), values across f16's range (its subnormals and overflow), the
// ties of both formats (round to nearest even) and the signed zeros, infinities and extremes.
std::vector<float> conversion_inputs(uint64_t seed) {
    std::vector<float> v;
    std::mt19937_64 rng(seed);
    while (v.size() < 4000) {
        const auto bits = static_cast<uint32_t>(rng());
        if ((bits & 0x7f800000u) != 0x7f800000u) v.push_back(float_of_bits(bits));
    }
    for (int i = 0; i < 4000; ++i) {
        const double mantissa = 1.0 + static_cast<double>(rng() >> 11) * 0x1.0p-53;
        const int exponent = static_cast<int>(rng() % 46) - 28;  // 2^-28 .. 2^17
        v.push_back(static_cast<float>((rng() % 2 ? -1.0 : 1.0) * std::ldexp(mantissa, exponent)));
    }
    // bf16 ties (low 16 bits exactly 0x8000) below even and odd upper halves, and their neighbours.
    for (uint32_t upper : {0x3f80u, 0x3f81u, 0x4049u, 0xc0a3u, 0x7f7eu, 0x7f7fu, 0x0001u, 0x0080u})
        for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) v.push_back(float_of_bits(upper << 16 | low));
    // f16 ties: between 1 and 1 + 2^-10, 1 + 2^-10 and 1 + 2^-9, 2048 and 2050, the largest
    // finite and infinity, and among the subnormals (steps of 2^-24).
    for (double x : {1.0 + 0x1.0p-11, 1.0 + 3 * 0x1.0p-11, 2049.0, 2051.0, 65519.0, 65520.0, 65504.0, 65505.0, 0x1.0p-25, 3 * 0x1.0p-25, 5 * 0x1.0p-25,
                     0x1.0p-14, 0x1.ffcp-15, 0x1.0p-24, 0x1.8p-24})
        for (double sign : {1.0, -1.0}) v.push_back(static_cast<float>(sign * x));
    for (float x : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                    -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min()})
        v.push_back(x);
    return v;
}

bool is_nan_16(DType dtype, uint16_t b) { return (b & 0x7fffu) > (dtype == bf16 ? 0x7f80u : 0x7c00u); }

// A device tensor inside a buffer with one guard element on each side: the view starts one
// element (2 or 4 bytes) past a 256-byte boundary, so the kernels take their unaligned path,
// and the guards, set to 7, show any write outside the view.
struct GuardedTensor {
    OwnedTensor buffer;
    Tensor view;
};

constexpr float kGuard = 7.0f;  // exact in every type

GuardedTensor guarded(Backend& be, DType dtype, Shape shape) {
    OwnedTensor buffer = device_tensor(be, dtype, {shape.numel() + 2});
    upload_into(be, buffer, test::filled(f32, {shape.numel() + 2}, kGuard));
    const Tensor view = offset_view(buffer, 1, shape);
    return {std::move(buffer), view};
}

void expect_guards_intact(const std::string& name, Backend& be, const GuardedTensor& g) {
    const std::vector<double> all = download(be, g.buffer);
    EXPECT_EQ(all.front(), kGuard) << name << ": the element before the view was written";
    EXPECT_EQ(all.back(), kGuard) << name << ": the element after the view was written";
}

// ---- the op checks ----

struct EmbeddingCase {
    int64_t batch, seq_len, vocab, channels;
    bool positions;
    VocabShard shard{};      // total = 0: wte holds the whole vocabulary
    int64_t shard_rows = 0;  // rows of wte when sharded

    int64_t rows() const { return shard.total ? shard_rows : vocab; }
    std::string str() const {
        return cat("B ", batch, " T ", seq_len, " V ", vocab, " C ", channels, positions ? " with wpe" : " without wpe", " shard [", shard.begin, ", ",
                   shard.begin + rows(), ")");
    }
};

const std::vector<EmbeddingCase> kEmbeddingCases = {
    {1, 1, 37, 6, true},      {3, 7, 37, 10, true},      {2, 33, 37, 64, false},         {4, 128, 37, 768, true},  // many repeats of each token
    {2, 64, 1000, 768, true}, {7, 33, 1000, 10, false},  {2, 33, 37, 64, false, {17, 37}, 20},                    // a shard at the end
    {3, 7, 37, 10, true, {10, 37}, 13},                  {4, 32, 1000, 768, false, {300, 1000}, 357},             // shards in the middle
};

struct MatmulCase {
    int64_t N, IC, OC;
    bool bias;
    std::string str() const { return cat("N ", N, " IC ", IC, " OC ", OC, bias ? " with bias" : " without bias"); }
};

const std::vector<MatmulCase> kMatmulCases = {
    {1, 6, 10, true}, {7, 10, 6, false}, {33, 64, 37, true}, {128, 768, 64, false}, {200, 768, 768, true}, {512, 64, 1000, true}, {5, 1000, 7, true},
};

const std::vector<AttentionShape> kAttentionShapes = {
    {2, 1, 4, 4, 64},   // one token: out is the value head
    {2, 7, 4, 2, 64},   // GQA, a partial tile
    {1, 33, 4, 1, 64},  // MQA
    {2, 64, 4, 4, 64},  // exactly one tile
    {1, 65, 4, 2, 128}, // one past a tile
    {2, 128, 4, 2, 128},
    {1, 100, 2, 1, 128},
    {2, 7, 4, 2, 32},    // head dim 32 (the bundled tiny config's): GQA, a partial tile
    {1, 130, 4, 4, 32},  // three tiles, the last partial
};

struct NormCase {
    int64_t N, C;
};
const std::vector<NormCase> kNormCases = {{1, 6}, {7, 10}, {33, 64}, {512, 768}, {9, 1000}, {64, 768}, {3, 2050}};

class CudaOps : public CudaVsCpuTest {
protected:
    // Document starts (backend.h) as an i32 tensor on the host, or on the device; empty: none.
    static OwnedTensor host_starts(const std::vector<int32_t>& starts) {
        if (starts.empty()) return OwnedTensor();
        OwnedTensor t(i32, {static_cast<int64_t>(starts.size())});
        std::copy(starts.begin(), starts.end(), t.data<int32_t>());
        return t;
    }
    OwnedTensor device_starts(const std::vector<int32_t>& starts) {
        return starts.empty() ? OwnedTensor() : to_device(gpu(), host_starts(starts), i32);
    }

    void embedding_fwd_case(DType dt, const EmbeddingCase& c, uint64_t seed, const std::vector<int32_t>& starts = {}) {
        SCOPED_TRACE(c.str());
        const int64_t N = c.batch * c.seq_len, C = c.channels;
        const OwnedTensor tokens = random_tokens(N, c.vocab, seed);
        const OwnedTensor wte = random_input(dt, {c.rows(), C}, seed + 1), wpe = random_input(dt, {c.seq_len + 2, C}, seed + 2);
        const OwnedTensor out(f32, {N, C});
        const OwnedTensor doc = host_starts(starts), g_doc = device_starts(starts);
        cpu().embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = c.positions ? wpe.view() : Tensor(), .seq_len = c.seq_len,
                             .vocab = c.shard, .doc_starts = doc, .positions = Tensor()});

        const OwnedTensor g_tokens = to_device(gpu(), tokens, i32), g_wte = to_device(gpu(), wte, dt), g_wpe = to_device(gpu(), wpe, dt);
        const OwnedTensor g_out = device_tensor(gpu(), dt, {N, C});
        gpu().embedding_fwd({.out = g_out, .tokens = g_tokens, .wte = g_wte, .wpe = c.positions ? g_wpe.view() : Tensor(), .seq_len = c.seq_len,
                             .vocab = c.shard, .doc_starts = g_doc, .positions = Tensor()});
        // A row of wte plus a row of wpe in fp32, rounded once.
        expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));
    }

    // The gradients start from random values: the op must add into them. The comparison is
    // exact: embedding.cu sums each token's (and position's) rows in row order, starting from
    // the gradient's old value, in fp32 as the CPU reference does, from the same 16-bit dout.
    void embedding_bwd_case(DType dt, const EmbeddingCase& c, uint64_t seed, const std::vector<int32_t>& starts = {}) {
        SCOPED_TRACE(c.str());
        const int64_t N = c.batch * c.seq_len, C = c.channels, positions = c.seq_len + 2;  // positions past seq_len get nothing
        const OwnedTensor tokens = random_tokens(N, c.vocab, seed), dout = random_input(dt, {N, C}, seed + 1);
        const OwnedTensor dwte0 = random_tensor(f32, {c.rows(), C}, seed + 2), dwpe0 = random_tensor(f32, {positions, C}, seed + 3);
        const OwnedTensor dwte = copy_of(dwte0), dwpe = copy_of(dwpe0);
        const OwnedTensor doc = host_starts(starts), g_doc = device_starts(starts);
        cpu().embedding_bwd({.dwte = dwte, .dwpe = c.positions ? dwpe.view() : Tensor(), .dout = dout, .tokens = tokens, .seq_len = c.seq_len,
                             .vocab = c.shard, .doc_starts = doc, .positions = Tensor()});

        const OwnedTensor g_tokens = to_device(gpu(), tokens, i32), g_dout = to_device(gpu(), dout, dt);
        const OwnedTensor g_dwte = to_device(gpu(), dwte0, f32), g_dwpe = to_device(gpu(), dwpe0, f32);
        gpu().embedding_bwd({.dwte = g_dwte, .dwpe = c.positions ? g_dwpe.view() : Tensor(), .dout = g_dout, .tokens = g_tokens, .seq_len = c.seq_len,
                             .vocab = c.shard, .doc_starts = g_doc, .positions = Tensor()});
        expect_matches("dwte", gpu(), g_dwte, dwte, Tolerance{0, 0});
        expect_matches("dwpe", gpu(), g_dwpe, dwpe, Tolerance{0, 0});  // untouched without positions
    }

    void layernorm_fwd_case(DType dt, NormCase c, bool bias, uint64_t seed) {
        SCOPED_TRACE(cat("N ", c.N, " C ", c.C, bias ? " with bias" : " without bias"));
        const OwnedTensor x = random_input(dt, {c.N, c.C}, seed, -2, 3), w = random_input(dt, {c.C}, seed + 1, -1.5, 1.5);
        const OwnedTensor b = random_input(dt, {c.C}, seed + 2);
        const OwnedTensor out(f32, {c.N, c.C}), mean(f32, {c.N}), rstd(f32, {c.N});
        cpu().layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = bias ? b.view() : Tensor(), .eps = kNormEps});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_b = to_device(gpu(), b, dt);
        const OwnedTensor g_out = device_tensor(gpu(), dt, {c.N, c.C}), g_mean = device_tensor(gpu(), f32, {c.N}), g_rstd = device_tensor(gpu(), f32, {c.N});
        gpu().layernorm_fwd({.out = g_out, .mean = g_mean, .rstd = g_rstd, .x = g_x, .w = g_w, .b = bias ? g_b.view() : Tensor(), .eps = kNormEps});
        expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));
        expect_matches("mean", gpu(), g_mean, mean, f32_sum_tolerance);
        expect_matches("rstd", gpu(), g_rstd, rstd, f32_sum_tolerance);
    }

    // Both backwards read the CPU forward's mean and rstd, so the comparison is of the
    // backward alone. dx starts from random values: kept and added to when accumulating,
    // overwritten otherwise; dw and db start from random values and are added to.
    void layernorm_bwd_case(DType dt, NormCase c, bool bias, bool accumulate, uint64_t seed) {
        SCOPED_TRACE(cat("N ", c.N, " C ", c.C, bias ? " with db" : " without db", accumulate ? ", accumulating dx" : ", overwriting dx"));
        const OwnedTensor x = random_input(dt, {c.N, c.C}, seed, -2, 3), w = random_input(dt, {c.C}, seed + 1, -1.5, 1.5);
        const OwnedTensor dout = random_input(dt, {c.N, c.C}, seed + 2), dx0 = random_input(dt, {c.N, c.C}, seed + 3);
        const OwnedTensor dw0 = random_tensor(f32, {c.C}, seed + 4), db0 = random_tensor(f32, {c.C}, seed + 5);
        const OwnedTensor out(f32, {c.N, c.C}), mean(f32, {c.N}), rstd(f32, {c.N});
        cpu().layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = Tensor(), .eps = kNormEps});
        const OwnedTensor dx = copy_of(dx0), dw = copy_of(dw0), db = copy_of(db0);
        cpu().layernorm_bwd({.dx = dx, .dw = dw, .db = bias ? db.view() : Tensor(), .dout = dout, .x = x, .w = w, .mean = mean, .rstd = rstd,
                             .accumulate_dx = accumulate});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_dout = to_device(gpu(), dout, dt);
        const OwnedTensor g_mean = to_device(gpu(), mean, f32), g_rstd = to_device(gpu(), rstd, f32);
        const OwnedTensor g_dx = to_device(gpu(), dx0, dt), g_dw = to_device(gpu(), dw0, f32), g_db = to_device(gpu(), db0, f32);
        gpu().layernorm_bwd({.dx = g_dx, .dw = g_dw, .db = bias ? g_db.view() : Tensor(), .dout = g_dout, .x = g_x, .w = g_w, .mean = g_mean,
                             .rstd = g_rstd, .accumulate_dx = accumulate});
        expect_matches("dx", gpu(), g_dx, dx, elementwise_tolerance(dt));
        expect_matches("dw", gpu(), g_dw, dw, f32_sum_tolerance);
        expect_matches("db", gpu(), g_db, db, f32_sum_tolerance);  // untouched without bias
    }

    void rmsnorm_fwd_case(DType dt, NormCase c, uint64_t seed) {
        SCOPED_TRACE(cat("N ", c.N, " C ", c.C));
        const OwnedTensor x = random_input(dt, {c.N, c.C}, seed, -2, 3), w = random_input(dt, {c.C}, seed + 1, -1.5, 1.5);
        const OwnedTensor out(f32, {c.N, c.C}), rstd(f32, {c.N});
        cpu().rmsnorm_fwd({.out = out, .rstd = rstd, .x = x, .w = w, .eps = kNormEps});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt);
        const OwnedTensor g_out = device_tensor(gpu(), dt, {c.N, c.C}), g_rstd = device_tensor(gpu(), f32, {c.N});
        gpu().rmsnorm_fwd({.out = g_out, .rstd = g_rstd, .x = g_x, .w = g_w, .eps = kNormEps});
        expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));
        expect_matches("rstd", gpu(), g_rstd, rstd, f32_sum_tolerance);
    }

    void rmsnorm_bwd_case(DType dt, NormCase c, bool accumulate, uint64_t seed) {
        SCOPED_TRACE(cat("N ", c.N, " C ", c.C, accumulate ? ", accumulating dx" : ", overwriting dx"));
        const OwnedTensor x = random_input(dt, {c.N, c.C}, seed, -2, 3), w = random_input(dt, {c.C}, seed + 1, -1.5, 1.5);
        const OwnedTensor dout = random_input(dt, {c.N, c.C}, seed + 2), dx0 = random_input(dt, {c.N, c.C}, seed + 3);
        const OwnedTensor dw0 = random_tensor(f32, {c.C}, seed + 4);
        const OwnedTensor out(f32, {c.N, c.C}), rstd(f32, {c.N});
        cpu().rmsnorm_fwd({.out = out, .rstd = rstd, .x = x, .w = w, .eps = kNormEps});
        const OwnedTensor dx = copy_of(dx0), dw = copy_of(dw0);
        cpu().rmsnorm_bwd({.dx = dx, .dw = dw, .dout = dout, .x = x, .w = w, .rstd = rstd, .accumulate_dx = accumulate});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_dout = to_device(gpu(), dout, dt);
        const OwnedTensor g_rstd = to_device(gpu(), rstd, f32), g_dx = to_device(gpu(), dx0, dt), g_dw = to_device(gpu(), dw0, f32);
        gpu().rmsnorm_bwd({.dx = g_dx, .dw = g_dw, .dout = g_dout, .x = g_x, .w = g_w, .rstd = g_rstd, .accumulate_dx = accumulate});
        expect_matches("dx", gpu(), g_dx, dx, elementwise_tolerance(dt));
        expect_matches("dw", gpu(), g_dw, dw, f32_sum_tolerance);
    }

    void matmul_fwd_case(DType dt, const MatmulCase& c, uint64_t seed) {
        SCOPED_TRACE(c.str());
        const OwnedTensor x = random_input(dt, {c.N, c.IC}, seed), w = random_input(dt, {c.OC, c.IC}, seed + 1), bias = random_input(dt, {c.OC}, seed + 2);
        const OwnedTensor out(f32, {c.N, c.OC});
        cpu().matmul_fwd({.out = out, .x = x, .w = w, .bias = c.bias ? bias.view() : Tensor()});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_bias = to_device(gpu(), bias, dt);
        const OwnedTensor g_out = device_tensor(gpu(), dt, {c.N, c.OC});
        gpu().matmul_fwd({.out = g_out, .x = g_x, .w = g_w, .bias = c.bias ? g_bias.view() : Tensor()});
        expect_matches("out", gpu(), g_out, out, gemm_tolerance(dt));
    }

    // dx starts from random values (it must be overwritten), dw and dbias too (added to).
    // with_dx false: the call without dx (the first layer's input needs no gradient).
    void matmul_bwd_case(DType dt, const MatmulCase& c, bool with_dx, uint64_t seed) {
        SCOPED_TRACE(c.str() + (with_dx ? ", with dx" : ", without dx"));
        const OwnedTensor x = random_input(dt, {c.N, c.IC}, seed), w = random_input(dt, {c.OC, c.IC}, seed + 1);
        const OwnedTensor dout = random_input(dt, {c.N, c.OC}, seed + 2), dx0 = random_input(dt, {c.N, c.IC}, seed + 3);
        const OwnedTensor dw0 = random_tensor(f32, {c.OC, c.IC}, seed + 4), db0 = random_tensor(f32, {c.OC}, seed + 5);
        const OwnedTensor dx = copy_of(dx0), dw = copy_of(dw0), db = copy_of(db0);
        cpu().matmul_bwd({.dx = with_dx ? dx.view() : Tensor(), .dw = dw, .dbias = c.bias ? db.view() : Tensor(), .dout = dout, .x = x, .w = w});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_dout = to_device(gpu(), dout, dt);
        const OwnedTensor g_dx = to_device(gpu(), dx0, dt), g_dw = to_device(gpu(), dw0, f32), g_db = to_device(gpu(), db0, f32);
        gpu().matmul_bwd({.dx = with_dx ? g_dx.view() : Tensor(), .dw = g_dw, .dbias = c.bias ? g_db.view() : Tensor(), .dout = g_dout, .x = g_x,
                          .w = g_w});
        if (with_dx) expect_matches("dx", gpu(), g_dx, dx, gemm_tolerance(dt));
        expect_matches("dw", gpu(), g_dw, dw, f32_gemm_tolerance);
        expect_matches("dbias", gpu(), g_db, db, f32_sum_tolerance);  // untouched without bias
    }

    // The fused MLP forward against the CPU's composition (matmul_fwd, gelu_fwd): pre and act.
    void matmul_gelu_fwd_case(DType dt, const MatmulCase& c, uint64_t seed) {
        SCOPED_TRACE(c.str());
        const OwnedTensor x = random_input(dt, {c.N, c.IC}, seed), w = random_input(dt, {c.OC, c.IC}, seed + 1), bias = random_input(dt, {c.OC}, seed + 2);
        const OwnedTensor pre(f32, {c.N, c.OC}), act(f32, {c.N, c.OC});
        cpu().matmul_gelu_fwd({.act = act, .pre = pre, .x = x, .w = w, .bias = c.bias ? bias.view() : Tensor()});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_bias = to_device(gpu(), bias, dt);
        const OwnedTensor g_pre = device_tensor(gpu(), dt, {c.N, c.OC}), g_act = device_tensor(gpu(), dt, {c.N, c.OC});
        gpu().matmul_gelu_fwd({.act = g_act, .pre = g_pre, .x = g_x, .w = g_w, .bias = c.bias ? g_bias.view() : Tensor()});
        expect_matches("pre", gpu(), g_pre, pre, gemm_tolerance(dt));
        expect_matches("act", gpu(), g_act, act, gemm_tolerance(dt));
    }

    // The fused MLP backward against the CPU's composition: d_pre overwritten, every gradient
    // accumulated onto random values. Here IC is the GELU's width (the down projection's input).
    void gelu_matmul_bwd_case(DType dt, const MatmulCase& c, uint64_t seed) {
        SCOPED_TRACE(c.str());
        const OwnedTensor act = random_input(dt, {c.N, c.IC}, seed), pre = random_input(dt, {c.N, c.IC}, seed + 1, -3, 3);
        const OwnedTensor w = random_input(dt, {c.OC, c.IC}, seed + 2), dout = random_input(dt, {c.N, c.OC}, seed + 3);
        const OwnedTensor d_pre0 = random_input(dt, {c.N, c.IC}, seed + 4), dpb0 = random_tensor(f32, {c.IC}, seed + 5);
        const OwnedTensor dw0 = random_tensor(f32, {c.OC, c.IC}, seed + 6), db0 = random_tensor(f32, {c.OC}, seed + 7);
        const OwnedTensor d_pre = copy_of(d_pre0), dpb = copy_of(dpb0), dw = copy_of(dw0), db = copy_of(db0);
        cpu().gelu_matmul_bwd({.d_pre = d_pre, .d_pre_bias = c.bias ? dpb.view() : Tensor(), .dw = dw, .dbias = db, .dout = dout, .act = act,
                               .pre = pre, .w = w});

        const OwnedTensor g_act = to_device(gpu(), act, dt), g_pre = to_device(gpu(), pre, dt), g_w = to_device(gpu(), w, dt);
        const OwnedTensor g_dout = to_device(gpu(), dout, dt), g_d_pre = to_device(gpu(), d_pre0, dt), g_dpb = to_device(gpu(), dpb0, f32);
        const OwnedTensor g_dw = to_device(gpu(), dw0, f32), g_db = to_device(gpu(), db0, f32);
        gpu().gelu_matmul_bwd({.d_pre = g_d_pre, .d_pre_bias = c.bias ? g_dpb.view() : Tensor(), .dw = g_dw, .dbias = g_db, .dout = g_dout,
                               .act = g_act,
                               .pre = g_pre, .w = g_w});
        expect_matches("d_pre", gpu(), g_d_pre, d_pre, gemm_tolerance(dt));
        expect_matches("dw", gpu(), g_dw, dw, f32_gemm_tolerance);
        expect_matches("dbias", gpu(), g_db, db, f32_sum_tolerance);
        // The bias gradient sums N values of d_pre, each within the 16-bit rounding of its own
        // size: bound it by u of N times the largest |d_pre| (plus the GEMM margin).
        const double d_pre_sum_scale = static_cast<double>(c.N) * max_abs(values_of(d_pre)) + max_abs(values_of(dpb));
        expect_matches("d_pre_bias", gpu(), g_dpb, dpb, {0, 8 * unit_roundoff(dt)}, {.min_scale = d_pre_sum_scale});
    }

    // Each backend keeps its own saved values (the CPU its probabilities [B, H, T, T], CUDA the
    // log-sum-exps [B, H, T]); CUDA's are checked against a double-precision reference.
    void attention_fwd_case(DType dt, const AttentionShape& s, uint64_t seed, const std::vector<int32_t>& starts = {}) {
        SCOPED_TRACE(describe(s));
        const OwnedTensor qkv = random_input(dt, {s.rows(), s.qkv_width()}, seed, -2, 2);
        const OwnedTensor out(f32, {s.rows(), s.out_width()}), saved(f32, cpu().attention_saved_shape(s));
        const OwnedTensor doc = host_starts(starts), g_doc = device_starts(starts);
        cpu().attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});

        ASSERT_EQ(gpu().attention_saved_shape(s), Shape({s.batch, s.n_heads, s.seq_len}));
        ASSERT_EQ(gpu().statistics_dtype(dt), f32);
        const OwnedTensor g_qkv = to_device(gpu(), qkv, dt), g_out = device_tensor(gpu(), dt, {s.rows(), s.out_width()});
        const OwnedTensor g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = g_doc});
        expect_matches("out", gpu(), g_out, out, attention_tolerance(dt));
        if (starts.empty()) expect_matches("lse", download(gpu(), g_saved), attention_lse(qkv, s), f32_sum_tolerance);
    }

    // Each backend's backward reads its own forward's out and saved values. dq, dk and dv are
    // compared apart (their magnitudes differ), each relative to the larger of its own largest
    // magnitude and 1% of the whole gradient's: at T = 1 dq and dk are zero by the math
    // (dS = P (dP - Delta) with P = 1 and Delta = dP) and only rounding noise is left.
    void attention_bwd_case(DType dt, const AttentionShape& s, uint64_t seed, const std::vector<int32_t>& starts = {}) {
        SCOPED_TRACE(describe(s));
        const int64_t W = s.qkv_width(), H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim;
        const OwnedTensor qkv = random_input(dt, {s.rows(), W}, seed, -2, 2), dout = random_input(dt, {s.rows(), s.out_width()}, seed + 1);
        const OwnedTensor dqkv0 = random_input(dt, {s.rows(), W}, seed + 2);  // overwritten
        const OwnedTensor out(f32, {s.rows(), s.out_width()}), saved(f32, cpu().attention_saved_shape(s)), dqkv(f32, {s.rows(), W});
        const OwnedTensor doc = host_starts(starts), g_doc = device_starts(starts);
        cpu().attention_fwd({.out = out, .saved = saved, .qkv = qkv, .shape = s, .doc_starts = doc});
        cpu().attention_bwd({.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .saved = saved, .shape = s, .doc_starts = doc});

        const OwnedTensor g_qkv = to_device(gpu(), qkv, dt), g_dout = to_device(gpu(), dout, dt), g_dqkv = to_device(gpu(), dqkv0, dt);
        const OwnedTensor g_out = device_tensor(gpu(), dt, {s.rows(), s.out_width()});
        const OwnedTensor g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = g_doc});
        gpu().attention_bwd({.dqkv = g_dqkv, .dout = g_dout, .qkv = g_qkv, .out = g_out, .saved = g_saved, .shape = s, .doc_starts = g_doc});

        const std::vector<double> g = download(gpu(), g_dqkv), ref = values_of(dqkv);
        const double floor = 1e-2 * max_abs(ref);
        struct Part {
            const char* name;
            int64_t begin, count;
            bool zero_at_one_token;
        };
        for (const Part& p : {Part{"dq", 0, H * D, true}, Part{"dk", H * D, Hkv * D, true}, Part{"dv", (H + Hkv) * D, Hkv * D, false}})
            expect_matches(p.name, columns(g, W, p.begin, p.count), columns(ref, W, p.begin, p.count), attention_tolerance(dt),
                           {floor, p.zero_at_one_token && s.seq_len == 1});
    }

    // Rotates heads [0, n_heads) of rows of `width` columns; the columns past them must come
    // back bit for bit.
    void rope_case(DType dt, int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t width, bool backward, uint64_t seed,
                   const std::vector<int32_t>& starts = {}) {
        SCOPED_TRACE(cat("B ", batch, " T ", seq_len, " heads ", n_heads, " D ", head_dim, " width ", width));
        const int64_t N = batch * seq_len;
        const OwnedTensor x = random_input(dt, {N, width}, seed, -2, 2), table(f32, {seq_len + 3, head_dim});
        fill_rope_table(table, 10000.0);
        const OwnedTensor work = copy_of(x);
        const OwnedTensor doc = host_starts(starts), g_doc = device_starts(starts);
        if (backward) cpu().rope_bwd({.x = work, .table = table, .seq_len = seq_len, .n_heads = n_heads, .head_dim = head_dim, .doc_starts = doc, .positions = Tensor()});
        else cpu().rope_fwd({.x = work, .table = table, .seq_len = seq_len, .n_heads = n_heads, .head_dim = head_dim, .doc_starts = doc, .positions = Tensor()});

        const OwnedTensor g_x = to_device(gpu(), x, dt), g_table = to_device(gpu(), table, f32);
        if (backward) gpu().rope_bwd({.x = g_x, .table = g_table, .seq_len = seq_len, .n_heads = n_heads, .head_dim = head_dim, .doc_starts = g_doc, .positions = Tensor()});
        else gpu().rope_fwd({.x = g_x, .table = g_table, .seq_len = seq_len, .n_heads = n_heads, .head_dim = head_dim, .doc_starts = g_doc, .positions = Tensor()});
        const std::vector<double> g = download(gpu(), g_x);
        expect_matches("x", g, values_of(work), elementwise_tolerance(dt));
        const int64_t rotated = n_heads * head_dim;
        if (rotated < width)
            expect_matches("columns past the rotated heads", columns(g, width, rotated, width - rotated),
                           columns(values_of(x), width, rotated, width - rotated), Tolerance{0, 0});
    }

    void gelu_case(DType dt, Shape shape, bool backward, uint64_t seed) {
        SCOPED_TRACE(shape.str());
        const OwnedTensor x = random_input(dt, shape, seed, -5, 5), dout = random_input(dt, shape, seed + 1), result(f32, shape);
        if (backward) cpu().gelu_bwd(result, dout, x);
        else cpu().gelu_fwd(result, x);
        const OwnedTensor g_x = to_device(gpu(), x, dt), g_dout = to_device(gpu(), dout, dt), g_result = device_tensor(gpu(), dt, shape);
        if (backward) gpu().gelu_bwd(g_result, g_dout, g_x);
        else gpu().gelu_fwd(g_result, g_x);
        expect_matches(backward ? "dx" : "out", gpu(), g_result, result, elementwise_tolerance(dt));
    }

    void swiglu_case(DType dt, int64_t N, int64_t F, bool backward, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, " F ", F));
        const OwnedTensor x = random_input(dt, {N, 2 * F}, seed, -4, 4), dout = random_input(dt, {N, F}, seed + 1);
        const OwnedTensor g_x = to_device(gpu(), x, dt);
        if (!backward) {
            const OwnedTensor out(f32, {N, F}), g_out = device_tensor(gpu(), dt, {N, F});
            cpu().swiglu_fwd(out, x);
            gpu().swiglu_fwd(g_out, g_x);
            expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));
            return;
        }
        const OwnedTensor dx(f32, {N, 2 * F});
        cpu().swiglu_bwd(dx, dout, x);
        const OwnedTensor g_dout = to_device(gpu(), dout, dt), g_dx = to_device(gpu(), random_input(dt, {N, 2 * F}, seed + 2), dt);  // overwritten
        gpu().swiglu_bwd(g_dx, g_dout, g_x);
        expect_matches("dx", gpu(), g_dx, dx, elementwise_tolerance(dt));
    }

    // out = a + b into a separate tensor, into a (out aliasing a) and into b.
    void add_case(DType dt, Shape shape, uint64_t seed) {
        SCOPED_TRACE(shape.str());
        const OwnedTensor a = random_input(dt, shape, seed), b = random_input(dt, shape, seed + 1), out(f32, shape);
        cpu().add(out, a, b);
        const OwnedTensor g_a = to_device(gpu(), a, dt), g_b = to_device(gpu(), b, dt), g_out = device_tensor(gpu(), dt, shape);
        gpu().add(g_out, g_a, g_b);
        expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));
        const OwnedTensor g_a2 = to_device(gpu(), a, dt), g_b2 = to_device(gpu(), b, dt);
        gpu().add(g_a2, g_a2, g_b);
        gpu().add(g_b2, g_a, g_b2);
        expect_matches("out aliasing a", gpu(), g_a2, out, elementwise_tolerance(dt));
        expect_matches("out aliasing b", gpu(), g_b2, out, elementwise_tolerance(dt));
    }

    // Losses, and the rows' logsumexp the forward keeps for the backward.
    void xent_fwd_case(DType dt, int64_t N, int64_t V, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, " V ", V));
        const OwnedTensor logits = random_input(dt, {N, V}, seed, -6, 6), targets = random_tokens(N, V, seed + 1), losses(f32, {N}), lse(f32, {N});
        cpu().xent_fwd({.losses = losses, .lse = lse, .logits = logits, .targets = targets, .vocab = {}});
        const OwnedTensor g_logits = to_device(gpu(), logits, dt), g_targets = to_device(gpu(), targets, i32), g_losses = device_tensor(gpu(), f32, {N});
        const OwnedTensor g_lse = device_tensor(gpu(), f32, {N});
        gpu().xent_fwd({.losses = g_losses, .lse = g_lse, .logits = g_logits, .targets = g_targets, .vocab = {}});
        expect_matches("losses", gpu(), g_losses, losses, f32_loss_tolerance);
        expect_matches("lse", gpu(), g_lse, lse, f32_loss_tolerance);
    }

    // Whole rows, the logsumexp computed by the op (lse empty); dlogits starts from garbage.
    void xent_bwd_case(DType dt, int64_t N, int64_t V, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, " V ", V));
        const double dloss = 0.37;
        const OwnedTensor logits = random_input(dt, {N, V}, seed, -6, 6), targets = random_tokens(N, V, seed + 1), dlogits(f32, {N, V});
        cpu().xent_bwd({.dlogits = dlogits, .logits = logits, .targets = targets, .lse = Tensor(), .vocab = {}, .dloss = dloss});
        const OwnedTensor g_logits = to_device(gpu(), logits, dt), g_targets = to_device(gpu(), targets, i32);
        const OwnedTensor g_dlogits = to_device(gpu(), random_input(dt, {N, V}, seed + 2), dt);
        gpu().xent_bwd({.dlogits = g_dlogits, .logits = g_logits, .targets = g_targets, .lse = Tensor(), .vocab = {}, .dloss = dloss});
        expect_matches("dlogits", gpu(), g_dlogits, dlogits, elementwise_tolerance(dt));
    }

    // Columns [begin, begin + rows) of a vocabulary of `vocab`, with the full rows' lse given
    // (the same f32 values to both backends).
    void xent_bwd_shard_case(DType dt, int64_t N, int64_t vocab, int64_t begin, int64_t rows, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, " vocab ", vocab, " shard [", begin, ", ", begin + rows, ")"));
        const double dloss = 0.5;
        const OwnedTensor full = random_input(dt, {N, vocab}, seed, -6, 6), targets = shard_edge_targets(N, vocab, begin, rows, seed + 1);
        const OwnedTensor lse = row_logsumexp_of(full), local = column_block(full, begin, rows), dlogits(f32, {N, rows});
        const VocabShard shard{begin, vocab};
        cpu().xent_bwd({.dlogits = dlogits, .logits = local, .targets = targets, .lse = lse, .vocab = shard, .dloss = dloss});
        const OwnedTensor g_local = to_device(gpu(), local, dt), g_targets = to_device(gpu(), targets, i32), g_lse = to_device(gpu(), lse, f32);
        const OwnedTensor g_dlogits = device_tensor(gpu(), dt, {N, rows});
        gpu().xent_bwd({.dlogits = g_dlogits, .logits = g_local, .targets = g_targets, .lse = g_lse, .vocab = shard, .dloss = dloss});
        expect_matches("dlogits", gpu(), g_dlogits, dlogits, elementwise_tolerance(dt));
    }

    // partial = (sum exp(logits - row_max), the target's logit or 0) over a shard, with the
    // full rows' max. The target column is a copy of a 16-bit logit: exact.
    void xent_partial_case(DType dt, int64_t N, int64_t vocab, int64_t begin, int64_t rows, VocabShard shard, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, " vocab ", vocab, " columns [", begin, ", ", begin + rows, ")"));
        const OwnedTensor full = random_input(dt, {N, vocab}, seed, -6, 6), targets = shard_edge_targets(N, vocab, begin, rows, seed + 1);
        const OwnedTensor row_max = row_max_of(full), local = column_block(full, begin, rows), partial(f32, {N, 2});
        cpu().xent_partial({.partial = partial, .logits = local, .targets = targets, .row_max = row_max, .vocab = shard});
        const OwnedTensor g_local = to_device(gpu(), local, dt), g_targets = to_device(gpu(), targets, i32), g_max = to_device(gpu(), row_max, f32);
        const OwnedTensor g_partial = device_tensor(gpu(), f32, {N, 2});
        gpu().xent_partial({.partial = g_partial, .logits = g_local, .targets = g_targets, .row_max = g_max, .vocab = shard});
        const std::vector<double> g = download(gpu(), g_partial), ref = values_of(partial);
        expect_matches("sum of exp", columns(g, 2, 0, 1), columns(ref, 2, 0, 1), f32_sum_tolerance);
        expect_matches("target logit", columns(g, 2, 1, 1), columns(ref, 2, 1, 1), Tolerance{0, 0});
    }

    // A padded vocabulary: rows of `padded` columns whose first `real` are classes. The
    // padded columns hold +30, above every real logit, so a kernel that let them into a max
    // or a sum, or gave them a gradient, misses the CPU by far more than the tolerance.
    // Whole rows (forward; backward computing the logsumexp) and shards of `shard_rows`
    // (row max, partial, backward with the lse given), including shards that straddle the
    // end of the real classes or hold padding only.
    void xent_padded_case(DType dt, int64_t N, int64_t real, int64_t padded, int64_t shard_rows, uint64_t seed) {
        SCOPED_TRACE(cat("N ", N, ", ", real, " real classes of ", padded, ", shards of ", shard_rows));
        const OwnedTensor full = random_input(dt, {N, padded}, seed, -6, 6), targets = random_tokens(N, real, seed + 1);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t v = real; v < padded; ++v) full.data<float>()[n * padded + v] = 30.f;
        targets.data<int32_t>()[0] = static_cast<int32_t>(real - 1);
        const OwnedTensor g_full = to_device(gpu(), full, dt), g_targets = to_device(gpu(), targets, i32);
        const VocabShard whole{0, padded, real};
        const double dloss = 0.5;

        const OwnedTensor losses(f32, {N}), g_losses = device_tensor(gpu(), f32, {N});
        cpu().xent_fwd({.losses = losses, .lse = Tensor(), .logits = full, .targets = targets, .vocab = whole});
        gpu().xent_fwd({.losses = g_losses, .lse = Tensor(), .logits = g_full, .targets = g_targets, .vocab = whole});
        expect_matches("losses", gpu(), g_losses, losses, f32_loss_tolerance);

        const OwnedTensor dlogits(f32, {N, padded}), g_dlogits = to_device(gpu(), random_input(dt, {N, padded}, seed + 2), dt);  // overwritten
        cpu().xent_bwd({.dlogits = dlogits, .logits = full, .targets = targets, .lse = Tensor(), .vocab = whole, .dloss = dloss});
        gpu().xent_bwd({.dlogits = g_dlogits, .logits = g_full, .targets = g_targets, .lse = Tensor(), .vocab = whole, .dloss = dloss});
        expect_matches("dlogits", gpu(), g_dlogits, dlogits, elementwise_tolerance(dt));

        const OwnedTensor real_columns = column_block(full, 0, real);
        const OwnedTensor row_max = row_max_of(real_columns), lse = row_logsumexp_of(real_columns);
        const OwnedTensor g_row_max = to_device(gpu(), row_max, f32), g_lse = to_device(gpu(), lse, f32);
        for (int64_t begin = 0; begin < padded; begin += shard_rows) {
            SCOPED_TRACE(cat("shard [", begin, ", ", begin + shard_rows, ")"));
            const VocabShard shard{begin, padded, real};
            const OwnedTensor local = column_block(full, begin, shard_rows), g_local = to_device(gpu(), local, dt);

            const OwnedTensor local_max(f32, {N}), g_local_max = device_tensor(gpu(), f32, {N});
            cpu().logits_row_max(local_max, local, shard);
            gpu().logits_row_max(g_local_max, g_local, shard);
            EXPECT_EQ(download(gpu(), g_local_max), values_of(local_max)) << "row max (-inf for padding only)";

            const OwnedTensor partial(f32, {N, 2}), g_partial = device_tensor(gpu(), f32, {N, 2});
            cpu().xent_partial({.partial = partial, .logits = local, .targets = targets, .row_max = row_max, .vocab = shard});
            gpu().xent_partial({.partial = g_partial, .logits = g_local, .targets = g_targets, .row_max = g_row_max, .vocab = shard});
            const std::vector<double> g = download(gpu(), g_partial), ref = values_of(partial);
            const bool padding_only = begin >= real;
            expect_matches("sum of exp", columns(g, 2, 0, 1), columns(ref, 2, 0, 1), f32_sum_tolerance, {0, padding_only});
            expect_matches("target logit", columns(g, 2, 1, 1), columns(ref, 2, 1, 1), Tolerance{0, 0}, {0, true});

            const OwnedTensor dlocal(f32, {N, shard_rows}), g_dlocal = to_device(gpu(), random_input(dt, {N, shard_rows}, seed + 3), dt);
            cpu().xent_bwd({.dlogits = dlocal, .logits = local, .targets = targets, .lse = lse, .vocab = shard, .dloss = dloss});
            gpu().xent_bwd({.dlogits = g_dlocal, .logits = g_local, .targets = g_targets, .lse = g_lse, .vocab = shard, .dloss = dloss});
            expect_matches("dlogits shard", gpu(), g_dlocal, dlocal, elementwise_tolerance(dt), {0, padding_only});
        }
    }
};

}  // namespace

// ---- embedding ----

// A checkpoint's host copy lands in memory the backend page-locked once (rank_snapshot.cpp):
// pinned until the handle goes, and a second pin of the same range refused (null), as the
// driver refuses it, rather than thrown.
TEST_F(CudaOps, PinHostMemory_PinsTheRangeUntilItsHandleIsReleased) {
    const OwnedTensor values = random_input(f32, {1000}, 77);
    const OwnedTensor g_values = to_device(gpu(), values, f32);
    std::vector<float> host(1000, 0.0f);
    const size_t bytes = host.size() * sizeof(float);
    {
        const std::shared_ptr<void> pinned = gpu().pin_host_memory(host.data(), bytes);
        ASSERT_TRUE(pinned) << "cudaHostRegister of " << bytes << " bytes";
#ifdef LLMTRAIN_CUDA_EMULATION
        EXPECT_EQ(emu::registered_host_bytes(), bytes);
#endif
        EXPECT_FALSE(gpu().pin_host_memory(host.data(), bytes)) << "the range is pinned already";
        gpu().copy_to_host(host.data(), g_values);
        EXPECT_EQ(std::memcmp(host.data(), values.data<float>(), bytes), 0);
    }
#ifdef LLMTRAIN_CUDA_EMULATION
    EXPECT_EQ(emu::registered_host_bytes(), 0u) << "released with its handle";
#endif
    EXPECT_TRUE(gpu().pin_host_memory(host.data(), bytes)) << "pinned again once released";
}

TEST_F(CudaOps, EmbeddingFwd_Bf16_MatchesCpuWithAndWithoutPositionsAndShards) {
    for (size_t i = 0; i < kEmbeddingCases.size(); ++i) embedding_fwd_case(bf16, kEmbeddingCases[i], 100 + 10 * i);
}

TEST_F(CudaOps, EmbeddingFwd_F16_MatchesCpu) {
    for (size_t i : {1u, 4u, 6u}) embedding_fwd_case(f16, kEmbeddingCases[i], 200 + 10 * i);
}

TEST_F(CudaOps, EmbeddingBwd_Bf16_AccumulatesBitwiseLikeCpuWithAndWithoutPositionsAndShards) {
    for (size_t i = 0; i < kEmbeddingCases.size(); ++i) embedding_bwd_case(bf16, kEmbeddingCases[i], 300 + 10 * i);
}

TEST_F(CudaOps, EmbeddingBwd_F16_AccumulatesBitwiseLikeCpu) {
    for (size_t i : {1u, 4u, 6u}) embedding_bwd_case(f16, kEmbeddingCases[i], 400 + 10 * i);
}

// ---- layernorm and rmsnorm ----

TEST_F(CudaOps, LayerNormFwd_Bf16_MatchesCpuWithAndWithoutBias) {
    for (size_t i = 0; i < kNormCases.size(); ++i)
        for (bool bias : {true, false}) layernorm_fwd_case(bf16, kNormCases[i], bias, 500 + 10 * i);
}

TEST_F(CudaOps, LayerNormFwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kNormCases.size(); ++i) layernorm_fwd_case(f16, kNormCases[i], i % 2 == 0, 600 + 10 * i);
}

TEST_F(CudaOps, LayerNormBwd_Bf16_MatchesCpuOverwritingAndAccumulatingDx) {
    for (size_t i = 0; i < kNormCases.size(); ++i)
        for (bool accumulate : {false, true})
            for (bool bias : {true, false}) layernorm_bwd_case(bf16, kNormCases[i], bias, accumulate, 700 + 10 * i);
}

TEST_F(CudaOps, LayerNormBwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kNormCases.size(); ++i) layernorm_bwd_case(f16, kNormCases[i], i % 2 == 0, i % 3 == 0, 800 + 10 * i);
}

TEST_F(CudaOps, RmsNormFwd_Bf16_MatchesCpu) {
    for (size_t i = 0; i < kNormCases.size(); ++i) rmsnorm_fwd_case(bf16, kNormCases[i], 900 + 10 * i);
}

TEST_F(CudaOps, RmsNormBwd_Bf16_MatchesCpuOverwritingAndAccumulatingDx) {
    for (size_t i = 0; i < kNormCases.size(); ++i)
        for (bool accumulate : {false, true}) rmsnorm_bwd_case(bf16, kNormCases[i], accumulate, 1000 + 10 * i);
}

TEST_F(CudaOps, RmsNormFwdBwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kNormCases.size(); ++i) {
        rmsnorm_fwd_case(f16, kNormCases[i], 1100 + 10 * i);
        rmsnorm_bwd_case(f16, kNormCases[i], i % 2 == 1, 1100 + 10 * i);
    }
}

// ---- matmul ----

// Shapes cuBLASLt is not asked for (a dimension of 1: m = OC, n = N, k = IC) run the fallback
// kernel; its results, forward and backward, match the CPU like cuBLASLt's.
const std::vector<MatmulCase> kFallbackGemmCases = {
    {1, 1, 1, true}, {1, 64, 50, true}, {9, 1, 13, true}, {9, 13, 1, true}, {17, 1, 1, false}, {3, 40, 24, true},
};

TEST_F(CudaOps, MatmulFwdBwd_Bf16_FallbackKernelMatchesCpuAtDimensionsOfOne) {
    for (size_t i = 0; i < kFallbackGemmCases.size(); ++i) {
        matmul_fwd_case(bf16, kFallbackGemmCases[i], 5000 + 10 * i);
        matmul_bwd_case(bf16, kFallbackGemmCases[i], true, 5100 + 10 * i);
    }
}

TEST_F(CudaOps, MatmulFwdBwd_F16_FallbackKernelMatchesCpuAtDimensionsOfOne) {
    for (size_t i = 0; i < kFallbackGemmCases.size(); ++i) {
        matmul_fwd_case(f16, kFallbackGemmCases[i], 5200 + 10 * i);
        matmul_bwd_case(f16, kFallbackGemmCases[i], true, 5300 + 10 * i);
    }
}

// The GELU epilogues: cuBLASLt where the aux matrix allows (widths multiple of 8), the fallback
// kernel at odd widths and dimensions of 1.
const std::vector<MatmulCase> kGeluGemmCases = {
    {64, 64, 256, true}, {130, 96, 384, false}, {33, 64, 37, true}, {1, 64, 64, true}, {7, 1, 24, true}, {256, 128, 512, true},
};

TEST_F(CudaOps, MatmulGeluFwd_Bf16_MatchesCpuComposition) {
    for (size_t i = 0; i < kGeluGemmCases.size(); ++i) matmul_gelu_fwd_case(bf16, kGeluGemmCases[i], 5400 + 10 * i);
}

TEST_F(CudaOps, MatmulGeluFwd_F16_MatchesCpuComposition) {
    for (size_t i = 0; i < kGeluGemmCases.size(); ++i) matmul_gelu_fwd_case(f16, kGeluGemmCases[i], 5500 + 10 * i);
}

TEST_F(CudaOps, GeluMatmulBwd_Bf16_MatchesCpuCompositionWithAndWithoutTheBiasGradient) {
    for (size_t i = 0; i < kGeluGemmCases.size(); ++i) {
        // IC is the GELU width here: swap so that the aux widths are the interesting ones.
        MatmulCase c{kGeluGemmCases[i].N, kGeluGemmCases[i].OC, kGeluGemmCases[i].IC, kGeluGemmCases[i].bias};
        gelu_matmul_bwd_case(bf16, c, 5600 + 10 * i);
    }
}

TEST_F(CudaOps, GeluMatmulBwd_F16_MatchesCpuComposition) {
    for (size_t i = 0; i < kGeluGemmCases.size(); ++i) {
        MatmulCase c{kGeluGemmCases[i].N, kGeluGemmCases[i].OC, kGeluGemmCases[i].IC, true};
        gelu_matmul_bwd_case(f16, c, 5700 + 10 * i);
    }
}

TEST_F(CudaOps, AttentionFwd_MisalignedQkvView_IsRefusedNamingTheTensorAndAlignment) {
    const AttentionShape s{1, 8, 2, 2, 64};
    const OwnedTensor g_buf = device_tensor(gpu(), bf16, {s.rows() * s.qkv_width() + 8});
    const Tensor g_qkv = offset_view(g_buf, 1, {s.rows(), s.qkv_width()});
    const OwnedTensor g_out = device_tensor(gpu(), bf16, {s.rows(), s.out_width()}), g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
    try {
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = Tensor()});
        ADD_FAILURE() << "a qkv view 2 bytes past a 16-byte boundary was accepted";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("attention_fwd: qkv"), std::string::npos) << what;
        EXPECT_NE(what.find("16-byte aligned"), std::string::npos) << what;
    }
}

TEST_F(CudaOps, MatmulFwd_Bf16_MatchesCpuAtOddShapes) {
    for (size_t i = 0; i < kMatmulCases.size(); ++i) {
        matmul_fwd_case(bf16, kMatmulCases[i], 1200 + 10 * i);
        MatmulCase flipped = kMatmulCases[i];
        flipped.bias = !flipped.bias;
        matmul_fwd_case(bf16, flipped, 1205 + 10 * i);
    }
}

// A MoE router's logits: bf16 (or f16) operands, the fp32 accumulator written as it is (no
// rounding to 16 bits), so it matches the CPU within f32 GEMM accuracy; with a bias refused.
TEST_F(CudaOps, MatmulFwd_F32OutputFromHalfOperands_IsTheAccumulatorUnrounded) {
    for (const DType dt : {bf16, f16}) {
        for (size_t i = 0; i < kMatmulCases.size(); ++i) {
            const MatmulCase& c = kMatmulCases[i];
            SCOPED_TRACE(c.str());
            const OwnedTensor x = random_input(dt, {c.N, c.IC}, 1400 + 10 * i), w = random_input(dt, {c.OC, c.IC}, 1401 + 10 * i);
            const OwnedTensor out(f32, {c.N, c.OC});
            cpu().matmul_fwd({.out = out, .x = x, .w = w, .bias = Tensor()});
            const OwnedTensor g_x = to_device(gpu(), x, dt), g_w = to_device(gpu(), w, dt), g_out = device_tensor(gpu(), f32, {c.N, c.OC});
            gpu().matmul_fwd({.out = g_out, .x = g_x, .w = g_w, .bias = Tensor()});
            expect_matches("out", gpu(), g_out, out, f32_gemm_tolerance);
        }
    }
    const OwnedTensor g_x = device_tensor(gpu(), bf16, {4, 8}), g_w = device_tensor(gpu(), bf16, {3, 8}), g_bias = device_tensor(gpu(), bf16, {3});
    const OwnedTensor g_out = device_tensor(gpu(), f32, {4, 3});
    EXPECT_THROW(gpu().matmul_fwd({.out = g_out, .x = g_x, .w = g_w, .bias = g_bias}), Error);
}

TEST_F(CudaOps, MatmulFwd_F16_MatchesCpuAtOddShapes) {
    for (size_t i = 0; i < kMatmulCases.size(); ++i) matmul_fwd_case(f16, kMatmulCases[i], 1300 + 10 * i);
}

TEST_F(CudaOps, MatmulBwd_Bf16_OverwritesDxAndAccumulatesDwAndDbias) {
    for (size_t i = 0; i < kMatmulCases.size(); ++i) matmul_bwd_case(bf16, kMatmulCases[i], true, 1400 + 10 * i);
}

TEST_F(CudaOps, MatmulBwd_Bf16_WithoutDxStillAccumulatesDwAndDbias) {
    for (size_t i = 0; i < kMatmulCases.size(); ++i) matmul_bwd_case(bf16, kMatmulCases[i], false, 1500 + 10 * i);
}

TEST_F(CudaOps, MatmulBwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kMatmulCases.size(); ++i) matmul_bwd_case(f16, kMatmulCases[i], i != 2, 1600 + 10 * i);
}

// ---- attention ----

TEST_F(CudaOps, AttentionFwd_Bf16_MatchesCpuForMhaGqaAndMqa) {
    for (size_t i = 0; i < kAttentionShapes.size(); ++i) attention_fwd_case(bf16, kAttentionShapes[i], 1700 + 10 * i);
}

TEST_F(CudaOps, AttentionFwd_F16_MatchesCpuForMhaGqaAndMqa) {
    for (size_t i = 0; i < kAttentionShapes.size(); ++i) attention_fwd_case(f16, kAttentionShapes[i], 1800 + 10 * i);
}

TEST_F(CudaOps, AttentionBwd_Bf16_MatchesCpuForMhaGqaAndMqa) {
    for (size_t i = 0; i < kAttentionShapes.size(); ++i) attention_bwd_case(bf16, kAttentionShapes[i], 1900 + 10 * i);
}

TEST_F(CudaOps, AttentionBwd_F16_MatchesCpuForMhaGqaAndMqa) {
    for (size_t i = 0; i < kAttentionShapes.size(); ++i) attention_bwd_case(f16, kAttentionShapes[i], 2000 + 10 * i);
}

// T = 256 crosses four 64-row tiles, so the online softmax rescales three times and the
// backward's key-block loops run over several query blocks.
TEST_F(CudaOps, AttentionFwdBwd_Bf16_MatchesCpuAcrossFourTilesAtT256D128) {
    const AttentionShape s{1, 256, 4, 2, 128};
    attention_fwd_case(bf16, s, 2100);
    attention_bwd_case(bf16, s, 2110);
}

// Document masks (data.attention_mask = "document"): query t sees keys [start(t), t]. T = 256
// in tiles of 64: sequence 0's documents end at 10, 100 and 130, so query tile 2 starts its
// loop at key tile 1 and query tile 3 at key tile 2, and key tile 0's dk/dv loop stops after
// query tile 1; sequence 1 has one boundary inside a tile and one at its last position (which
// starts nothing).
std::vector<int32_t> document_starts_of(int64_t T, const std::vector<std::vector<int64_t>>& ends) {
    std::vector<int32_t> starts;
    for (const std::vector<int64_t>& sequence : ends) {
        int32_t start = 0;
        for (int64_t t = 0; t < T; ++t) {
            starts.push_back(start);
            if (std::find(sequence.begin(), sequence.end(), t) != sequence.end()) start = static_cast<int32_t>(t + 1);
        }
    }
    return starts;
}

TEST_F(CudaOps, AttentionFwdBwd_Bf16_DocumentMaskMatchesCpuSkippingMaskedTiles) {
    const AttentionShape s{2, 256, 4, 2, 64};
    const std::vector<int32_t> starts = document_starts_of(256, {{10, 100, 130}, {200, 255}});
    attention_fwd_case(bf16, s, 2150, starts);
    attention_bwd_case(bf16, s, 2160, starts);
    const AttentionShape small{3, 33, 2, 1, 128};  // one partial tile, every row a boundary somewhere
    const std::vector<int32_t> small_starts = document_starts_of(33, {{0, 1, 2, 31}, {16}, {32}});
    attention_fwd_case(f16, small, 2170, small_starts);
    attention_bwd_case(f16, small, 2180, small_starts);
}

TEST_F(CudaOps, AttentionFwdBwd_Bf16_DocumentMaskWithoutABoundary_IsBitwiseCausal) {
    const AttentionShape s{1, 130, 2, 2, 64};
    const std::vector<int32_t> zeros = document_starts_of(130, {{129}});
    const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 2190, -2, 2), dout = random_input(bf16, {s.rows(), s.out_width()}, 2191);
    const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_dout = to_device(gpu(), dout, bf16), g_doc = device_starts(zeros);
    std::vector<std::vector<double>> results;
    for (const Tensor& doc : {Tensor(), g_doc.view()}) {
        const OwnedTensor g_out = device_tensor(gpu(), bf16, {s.rows(), s.out_width()}), g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
        const OwnedTensor g_dqkv = device_tensor(gpu(), bf16, {s.rows(), s.qkv_width()});
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = doc});
        gpu().attention_bwd({.dqkv = g_dqkv, .dout = g_dout, .qkv = g_qkv, .out = g_out, .saved = g_saved, .shape = s, .doc_starts = doc});
        results.push_back(download(gpu(), g_out));
        results.push_back(download(gpu(), g_dqkv));
    }
    EXPECT_EQ(results[0], results[2]) << "out";
    EXPECT_EQ(results[1], results[3]) << "dqkv";
}

TEST_F(CudaOps, RopeFwdBwd_Bf16_PositionsRestartingAtDocumentsMatchCpu) {
    const std::vector<int32_t> starts = document_starts_of(33, {{4, 20}, {0, 31}});
    rope_case(bf16, 2, 33, 3, 128, 4 * 128, false, 2250, starts);
    rope_case(bf16, 2, 33, 3, 128, 4 * 128, true, 2260, starts);
    rope_case(f16, 2, 33, 3, 10, 37, false, 2270, starts);  // the one-pair path
}

TEST_F(CudaOps, EmbeddingFwdBwd_Bf16_PositionsRestartingAtDocumentsMatchCpuBitwise) {
    for (const EmbeddingCase& c : {EmbeddingCase{3, 7, 37, 10, true}, EmbeddingCase{2, 64, 1000, 768, true}}) {
        const std::vector<int32_t> starts = document_starts_of(c.seq_len, {{2}, {0, 5, c.seq_len - 2}, {3, 4}});
        const std::vector<int32_t> used(starts.begin(), starts.begin() + c.batch * c.seq_len);
        embedding_fwd_case(bf16, c, 2280, used);
        embedding_bwd_case(bf16, c, 2290, used);
    }
}

// ---- context parallelism: attention blocks, explicit positions, copy_columns ----
// The CUDA kernels (kernels/attention_block.cu) against the CPU reference's blocks
// (cpu_attention_block.cpp, itself checked against whole attention in f64 by
// tests/ops/cpu_attention_block_test.cpp), from the same 16-bit inputs. Both compute in fp32
// or better without rounding P or dS to 16 bits, so the comparisons are fp32-tight.

// The positions rank r of cp holds: chunks r and 2cp - 1 - r of T / (2cp) rows.
std::vector<int32_t> cp_rows(int64_t T, int64_t cp, int64_t r) {
    const int64_t chunk = T / (2 * cp);
    std::vector<int32_t> rows;
    for (const int64_t c : {r, 2 * cp - 1 - r})
        for (int64_t i = 0; i < chunk; ++i) rows.push_back(static_cast<int32_t>(c * chunk + i));
    return rows;
}

OwnedTensor i32_host(const std::vector<int32_t>& values) {
    OwnedTensor t(i32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
}

OwnedTensor f32_host(const std::vector<double>& values, Shape shape) {
    OwnedTensor t(f32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(values[static_cast<size_t>(i)]);
    return t;
}

// Columns [col, col + cols) of the rows `rows` of every sequence of host x [B*T, W].
OwnedTensor gather_rows(const Tensor& x, int64_t B, int64_t T, const std::vector<int32_t>& rows, int64_t col, int64_t cols) {
    const auto P = static_cast<int64_t>(rows.size());
    OwnedTensor out(f32, {B * P, cols});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < P; ++i)
            for (int64_t c = 0; c < cols; ++c)
                out.data<float>()[(b * P + i) * cols + c] = x.data<float>()[(b * T + rows[static_cast<size_t>(i)]) * x.dim(1) + col + c];
    return out;
}

std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
    return out;
}

// fp32 arithmetic on both sides from identical 16-bit inputs, in another order (dots of D
// terms, sums over keys, expf/logf against the CPU's double): ~1e-6 relative to the largest
// term; 1e-4 of the largest magnitude leaves room and still sees one key missing or counted
// twice. The backward's dS = P (dout.v - delta) cancels, so its bound is of the largest
// magnitude only.
constexpr Tolerance kBlockTolerance{1e-4, 1e-4};

// Context parallelism's ring on both backends: every rank's queries against the blocks of
// ranks r, r - 1, ... (the first overwriting), then the backward of each block from the
// merged (out, lse), out rounded to 16 bits by copy_columns on the device and given to both.
// dq and dkv start from random values: the ops add into them.
void expect_block_ring_matches(Backend& cpu, Backend& gpu, DType dt, const AttentionShape& s, int64_t cp, const std::vector<int32_t>& starts,
                               uint64_t seed) {
    SCOPED_TRACE(cat(describe(s), " cp ", cp, starts.empty() ? " causal" : " document starts"));
    const int64_t B = s.batch, T = s.seq_len, H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim, KV = 2 * Hkv * D;
    const OwnedTensor qkv = random_input(dt, {s.rows(), s.qkv_width()}, seed, -2, 2), dout = random_input(dt, {s.rows(), H * D}, seed + 1);
    for (int64_t r = 0; r < cp; ++r) {
        SCOPED_TRACE(cat("rank ", r));
        const std::vector<int32_t> q_rows = cp_rows(T, cp, r);
        const auto Tq = static_cast<int64_t>(q_rows.size());
        const AttentionShape local{B, Tq, H, Hkv, D};
        std::vector<int32_t> first;
        for (int64_t b = 0; b < B && !starts.empty(); ++b)
            for (const int32_t t : q_rows) first.push_back(starts[static_cast<size_t>(b * T + t)]);
        const OwnedTensor q = gather_rows(qkv, B, T, q_rows, 0, s.qkv_width()), d_out = gather_rows(dout, B, T, q_rows, 0, H * D);
        const OwnedTensor q_pos = i32_host(q_rows), q_first = first.empty() ? OwnedTensor() : i32_host(first);
        const OwnedTensor g_q = to_device(gpu, q, dt), g_dout = to_device(gpu, d_out, dt), g_q_pos = to_device(gpu, q_pos, i32);
        const OwnedTensor g_first = first.empty() ? OwnedTensor() : to_device(gpu, q_first, i32);
        const OwnedTensor acc(f32, {B * Tq, H * D}), lse(f32, {B, H, Tq});
        const OwnedTensor g_acc = device_tensor(gpu, f32, {B * Tq, H * D}), g_lse = device_tensor(gpu, f32, {B, H, Tq});
        std::vector<OwnedTensor> kv, kv_pos, g_kv, g_kv_pos;
        for (int64_t i = 0; i < cp; ++i) {
            const std::vector<int32_t> k_rows = cp_rows(T, cp, (r - i + cp) % cp);
            kv.push_back(gather_rows(qkv, B, T, k_rows, H * D, KV));
            kv_pos.push_back(i32_host(k_rows));
            g_kv.push_back(to_device(gpu, kv.back(), dt));
            g_kv_pos.push_back(to_device(gpu, kv_pos.back(), i32));
        }
        const int64_t Tk = Tq;
        for (int64_t i = 0; i < cp; ++i) {
            cpu.attention_block_fwd({.acc = acc, .lse = lse, .qkv = q, .kv = kv[static_cast<size_t>(i)], .shape = local, .kv_len = Tk, .q_positions = q_pos,
                                     .kv_positions = kv_pos[static_cast<size_t>(i)], .q_first = q_first, .first = i == 0});
            gpu.attention_block_fwd({.acc = g_acc, .lse = g_lse, .qkv = g_q, .kv = g_kv[static_cast<size_t>(i)], .shape = local, .kv_len = Tk,
                                     .q_positions = g_q_pos, .kv_positions = g_kv_pos[static_cast<size_t>(i)], .q_first = g_first, .first = i == 0});
        }
        expect_matches("acc", gpu, g_acc, acc, kBlockTolerance);
        expect_matches("lse", gpu, g_lse, lse, kBlockTolerance);

        const OwnedTensor g_out = device_tensor(gpu, dt, {B * Tq, H * D});
        gpu.copy_columns({.dst = g_out, .dst_col = 0, .src = g_acc, .src_col = 0, .cols = H * D});
        const OwnedTensor out = f32_host(download(gpu, g_out), {B * Tq, H * D});
        expect_matches("out (acc rounded by copy_columns)", download(gpu, g_out), values_of(rounded_to(acc, dt)), elementwise_tolerance(dt));
        const OwnedTensor dq0 = random_tensor(f32, {B * Tq, H * D}, seed + 2), dq = copy_of(dq0), g_dq = to_device(gpu, dq0, f32);
        for (int64_t i = 0; i < cp; ++i) {
            SCOPED_TRACE(cat("block of rank ", (r - i + cp) % cp));
            const OwnedTensor dkv0 = random_tensor(f32, {B * Tk, KV}, seed + 3 + static_cast<uint64_t>(i)), dkv = copy_of(dkv0);
            const OwnedTensor g_dkv = to_device(gpu, dkv0, f32);
            cpu.attention_block_bwd({.dq = dq, .dkv = dkv, .dout = d_out, .out = out, .lse = lse, .qkv = q, .kv = kv[static_cast<size_t>(i)], .shape = local,
                                     .kv_len = Tk, .q_positions = q_pos, .kv_positions = kv_pos[static_cast<size_t>(i)], .q_first = q_first});
            gpu.attention_block_bwd({.dq = g_dq, .dkv = g_dkv, .dout = g_dout, .out = g_out, .lse = g_lse, .qkv = g_q, .kv = g_kv[static_cast<size_t>(i)],
                                     .shape = local, .kv_len = Tk, .q_positions = g_q_pos, .kv_positions = g_kv_pos[static_cast<size_t>(i)],
                                     .q_first = g_first});
            const std::vector<double> added = minus(download(gpu, g_dkv), values_of(dkv0)), want = minus(values_of(dkv), values_of(dkv0));
            // A block wholly in the future of every query adds nothing (exactly).
            const bool unseen = std::all_of(want.begin(), want.end(), [](double v) { return v == 0; });
            expect_matches("dk", columns(added, KV, 0, Hkv * D), columns(want, KV, 0, Hkv * D), kBlockTolerance, {.may_be_all_zero = unseen});
            expect_matches("dv", columns(added, KV, Hkv * D, Hkv * D), columns(want, KV, Hkv * D, Hkv * D), kBlockTolerance, {.may_be_all_zero = unseen});
            if (unseen) {
                EXPECT_EQ(download(gpu, g_dkv), values_of(dkv0)) << "an unseen block changed dkv";
            }
        }
        expect_matches("dq", minus(download(gpu, g_dq), values_of(dq0)), minus(values_of(dq), values_of(dq0)), kBlockTolerance);
    }
}

TEST_F(CudaOps, AttentionBlockRing_Bf16_MatchesCpuBlocksAtCp2AndCp4WithGqaMqaAndDocumentStarts) {
    expect_block_ring_matches(cpu(), gpu(), bf16, {2, 64, 4, 2, 32}, 2, {}, 2400);  // GQA, two query tiles of 16 per rank
    // Three key tiles per block, rank 1's queries (40..119) see none of rank 0's last tile (144..159).
    expect_block_ring_matches(cpu(), gpu(), bf16, {1, 160, 2, 2, 64}, 2, {}, 2410);
    // MQA at head dim 128, partial query and key tiles (18 rows per rank), documents crossing chunks.
    expect_block_ring_matches(cpu(), gpu(), bf16, {1, 36, 2, 1, 128}, 2, document_starts_of(36, {{4, 17, 20}}), 2420);
    // cp 4: 8-row chunks, MHA, a boundary in every sequence and one on a chunk edge.
    expect_block_ring_matches(cpu(), gpu(), bf16, {2, 64, 4, 4, 64}, 4, document_starts_of(64, {{7, 30}, {50}}), 2430);
}

TEST_F(CudaOps, AttentionBlockRing_F16_MatchesCpuBlocks) {
    expect_block_ring_matches(cpu(), gpu(), f16, {2, 32, 4, 2, 64}, 2, document_starts_of(32, {{9}, {20}}), 2440);
}

// A block no query sees (keys in the future, or before every query's document) leaves acc,
// lse, dq and dkv bitwise as they were; as the first block it leaves out 0 and lse -inf.
TEST_F(CudaOps, AttentionBlock_Bf16_BlockNoQuerySeesChangesNothing) {
    const AttentionShape s{2, 4, 2, 1, 32};
    const int64_t KV = 2 * s.head_dim;
    const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 2450, -2, 2), kv = random_input(bf16, {s.batch * 3, KV}, 2451, -2, 2);
    const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_kv = to_device(gpu(), kv, bf16);
    const OwnedTensor q_pos = to_device(gpu(), i32_host({0, 1, 2, 3}), i32), future = to_device(gpu(), i32_host({4, 5, 6}), i32);
    const OwnedTensor past = to_device(gpu(), i32_host({0, 1, 2}), i32), q_first = to_device(gpu(), i32_host({3, 3, 3, 3, 3, 3, 3, 3}), i32);
    const OwnedTensor acc0 = random_tensor(f32, {s.rows(), s.out_width()}, 2452), lse0 = random_tensor(f32, {2, 2, 4}, 2453);
    const OwnedTensor g_acc = to_device(gpu(), acc0, f32), g_lse = to_device(gpu(), lse0, f32);
    gpu().attention_block_fwd({.acc = g_acc, .lse = g_lse, .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = 3, .q_positions = q_pos,
                               .kv_positions = future, .q_first = Tensor(), .first = false});
    gpu().attention_block_fwd({.acc = g_acc, .lse = g_lse, .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = 3, .q_positions = q_pos,
                               .kv_positions = past, .q_first = q_first, .first = false});
    EXPECT_EQ(download(gpu(), g_acc), values_of(acc0));
    EXPECT_EQ(download(gpu(), g_lse), values_of(lse0));

    const OwnedTensor dq0 = random_tensor(f32, {s.rows(), s.out_width()}, 2454), dkv0 = random_tensor(f32, {s.batch * 3, KV}, 2455);
    const OwnedTensor g_dq = to_device(gpu(), dq0, f32), g_dkv = to_device(gpu(), dkv0, f32);
    const OwnedTensor g_dout = to_device(gpu(), random_input(bf16, {s.rows(), s.out_width()}, 2456), bf16);
    const OwnedTensor g_out = to_device(gpu(), rounded_to(acc0, bf16), bf16);
    gpu().attention_block_bwd({.dq = g_dq, .dkv = g_dkv, .dout = g_dout, .out = g_out, .lse = g_lse, .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = 3,
                               .q_positions = q_pos, .kv_positions = future, .q_first = Tensor()});
    EXPECT_EQ(download(gpu(), g_dq), values_of(dq0));
    EXPECT_EQ(download(gpu(), g_dkv), values_of(dkv0));

    gpu().attention_block_fwd({.acc = g_acc, .lse = g_lse, .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = 3, .q_positions = q_pos,
                               .kv_positions = future, .q_first = Tensor(), .first = true});
    for (const double v : download(gpu(), g_acc)) ASSERT_EQ(v, 0.0);
    for (const double v : download(gpu(), g_lse)) ASSERT_EQ(v, -std::numeric_limits<double>::infinity());
}

// Bad arguments are refused naming the op and the tensor: a head dim the kernels do not take,
// a 16-bit running output, explicit positions beside document starts.
TEST_F(CudaOps, AttentionBlockAndPositions_BadArguments_AreRefusedNamingThem) {
    auto expect_refused = [](const std::function<void()>& call, const std::string& message) {
        try {
            call();
            ADD_FAILURE() << "accepted; expected: " << message;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
        }
    };
    const OwnedTensor pos = to_device(gpu(), i32_host({0, 1, 2, 3}), i32);
    for (const int64_t D : {48, 32}) {
        const AttentionShape s{1, 4, 2, 2, D};
        const OwnedTensor g_qkv = device_tensor(gpu(), bf16, {s.rows(), s.qkv_width()}), g_kv = device_tensor(gpu(), bf16, {4, 2 * 2 * D});
        const OwnedTensor g_acc = device_tensor(gpu(), D == 48 ? f32 : bf16, {s.rows(), s.out_width()}), g_lse = device_tensor(gpu(), f32, {1, 2, 4});
        expect_refused([&] { gpu().attention_block_fwd({.acc = g_acc, .lse = g_lse, .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = 4, .q_positions = pos,
                                                        .kv_positions = pos, .q_first = Tensor(), .first = true}); },
                       D == 48 ? "attention_block_fwd: head_dim 48" : "attention_block_fwd: acc");
    }
    const OwnedTensor x = device_tensor(gpu(), bf16, {4, 64}), table = device_tensor(gpu(), f32, {8, 64});
    const OwnedTensor starts = to_device(gpu(), i32_host({0, 0, 2, 2}), i32);
    expect_refused([&] { gpu().rope_fwd({.x = x, .table = table, .seq_len = 4, .n_heads = 1, .head_dim = 64, .doc_starts = starts, .positions = pos}); }, "rope_fwd: doc_starts and explicit positions given together");
}

// Rope with explicit positions (rank r of cp 2 over a table of T rows, two sequences) on the
// device against the CPU; the columns past the rotated heads come back bit for bit.
void rope_positions_case(Backend& cpu, Backend& gpu, int64_t r, bool backward, uint64_t seed, const Tensor& table, const Tensor& g_table, int64_t heads,
                         int64_t D, int64_t width) {
    const std::vector<int32_t> rows = cp_rows(table.dim(0), 2, r);
    std::vector<int32_t> two = rows;
    two.insert(two.end(), rows.begin(), rows.end());
    const auto N = static_cast<int64_t>(two.size());
    const OwnedTensor x = random_input(bf16, {N, width}, seed, -2, 2), work = copy_of(x), pos = i32_host(two);
    const OwnedTensor g_x = to_device(gpu, x, bf16), g_pos = to_device(gpu, pos, i32);
    if (backward) {
        cpu.rope_bwd({.x = work, .table = table, .seq_len = N / 2, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = pos});
        gpu.rope_bwd({.x = g_x, .table = g_table, .seq_len = N / 2, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = g_pos});
    } else {
        cpu.rope_fwd({.x = work, .table = table, .seq_len = N / 2, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = pos});
        gpu.rope_fwd({.x = g_x, .table = g_table, .seq_len = N / 2, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = g_pos});
    }
    const std::vector<double> g = download(gpu, g_x);
    expect_matches("x", g, values_of(work), elementwise_tolerance(bf16));
    const int64_t rotated = heads * D;
    expect_matches("columns past the rotated heads", columns(g, width, rotated, width - rotated), columns(values_of(x), width, rotated, width - rotated),
                   Tolerance{0, 0});
}

// Rank 1 of cp 2 (positions 8..15 and 16..23 of T = 32) and rank 0 (reaching the table's last
// row, 31): rope with explicit positions against the CPU; positions t - start(t) bitwise the
// doc_starts path on the device.
TEST_F(CudaOps, RopeFwdBwd_Bf16_ExplicitPositionsMatchCpuAndEqualTheDocumentStartsPath) {
    const int64_t T = 32, D = 64, heads = 3, width = 4 * D;
    const OwnedTensor table(f32, {T, D});
    fill_rope_table(table, 10000.0);
    const OwnedTensor g_table = to_device(gpu(), table, f32);
    for (const int64_t r : {0, 1})
        for (const bool backward : {false, true}) {
            SCOPED_TRACE(cat("rank ", r, backward ? " backward" : " forward"));
            rope_positions_case(cpu(), gpu(), r, backward, 2460 + static_cast<uint64_t>(r), table, g_table, heads, D, width);
        }
    // The one-pair path: head dim 10 in rows of 37.
    const OwnedTensor small_table(f32, {T, 10});
    fill_rope_table(small_table, 10000.0);
    rope_positions_case(cpu(), gpu(), 0, false, 2465, small_table, to_device(gpu(), small_table, f32), 3, 10, 37);

    const std::vector<int32_t> starts = document_starts_of(T, {{4, 20}, {0, 31}});
    std::vector<int32_t> restarted;
    for (size_t n = 0; n < starts.size(); ++n) restarted.push_back(static_cast<int32_t>(static_cast<int64_t>(n) % T - starts[n]));
    const OwnedTensor x = random_input(bf16, {2 * T, width}, 2470, -2, 2);
    const OwnedTensor by_starts = to_device(gpu(), x, bf16), by_positions = to_device(gpu(), x, bf16);
    gpu().rope_fwd({.x = by_starts, .table = g_table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = device_starts(starts), .positions = Tensor()});
    gpu().rope_fwd({.x = by_positions, .table = g_table, .seq_len = T, .n_heads = heads, .head_dim = D, .doc_starts = Tensor(), .positions = to_device(gpu(), i32_host(restarted), i32)});
    EXPECT_EQ(download_bits(gpu(), by_starts), download_bits(gpu(), by_positions));
}

// The embedding with explicit positions: forward against the CPU, dwpe (rows grouped by a
// stable sort of the positions) bitwise the CPU's row-order sums; positions t - start(t)
// bitwise the doc_starts path.
TEST_F(CudaOps, EmbeddingFwdBwd_Bf16_ExplicitPositionsMatchCpuAndEqualTheDocumentStartsPath) {
    const int64_t T = 32, V = 37, table_rows = T;
    for (const int64_t r : {0, 1}) {
        const int64_t C = r == 0 ? 24 : 10;  // 16-byte packs, and the one-element path
        SCOPED_TRACE(cat("rank ", r, " C ", C));
        std::vector<int32_t> rows = cp_rows(T, 2, r), pos_values = rows;
        pos_values.insert(pos_values.end(), rows.begin(), rows.end());
        const auto N = static_cast<int64_t>(pos_values.size());
        const OwnedTensor tokens = random_tokens(N, V, 2480), wte = random_input(bf16, {V, C}, 2481), wpe = random_input(bf16, {table_rows, C}, 2482);
        const OwnedTensor pos = i32_host(pos_values), out(f32, {N, C});
        cpu().embedding_fwd({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = N / 2, .vocab = {}, .doc_starts = Tensor(), .positions = pos});
        const OwnedTensor g_tokens = to_device(gpu(), tokens, i32), g_pos = to_device(gpu(), pos, i32), g_out = device_tensor(gpu(), bf16, {N, C});
        gpu().embedding_fwd({.out = g_out, .tokens = g_tokens, .wte = to_device(gpu(), wte, bf16), .wpe = to_device(gpu(), wpe, bf16), .seq_len = N / 2,
                             .vocab = {}, .doc_starts = Tensor(), .positions = g_pos});
        expect_matches("out", gpu(), g_out, out, elementwise_tolerance(bf16));

        const OwnedTensor dout = random_input(bf16, {N, C}, 2483), dwpe0 = random_tensor(f32, {table_rows, C}, 2484), dwpe = copy_of(dwpe0);
        const OwnedTensor dwte0 = random_tensor(f32, {V, C}, 2485), dwte = copy_of(dwte0);
        cpu().embedding_bwd({.dwte = dwte, .dwpe = dwpe, .dout = dout, .tokens = tokens, .seq_len = N / 2, .vocab = {}, .doc_starts = Tensor(), .positions = pos});
        const OwnedTensor g_dwte = to_device(gpu(), dwte0, f32), g_dwpe = to_device(gpu(), dwpe0, f32);
        gpu().embedding_bwd({.dwte = g_dwte, .dwpe = g_dwpe, .dout = to_device(gpu(), dout, bf16), .tokens = g_tokens, .seq_len = N / 2, .vocab = {},
                             .doc_starts = Tensor(), .positions = g_pos});
        expect_matches("dwte", gpu(), g_dwte, dwte, Tolerance{0, 0});
        expect_matches("dwpe", gpu(), g_dwpe, dwpe, Tolerance{0, 0});
    }
    const int64_t C = 24;
    const std::vector<int32_t> starts = document_starts_of(T, {{3, 17}, {0, 30}});
    std::vector<int32_t> restarted;
    for (size_t n = 0; n < starts.size(); ++n) restarted.push_back(static_cast<int32_t>(static_cast<int64_t>(n) % T - starts[n]));
    const OwnedTensor tokens = to_device(gpu(), random_tokens(2 * T, V, 2490), i32), g_starts = device_starts(starts);
    const OwnedTensor g_pos = to_device(gpu(), i32_host(restarted), i32);
    const OwnedTensor wte = to_device(gpu(), random_input(bf16, {V, C}, 2491), bf16), wpe = to_device(gpu(), random_input(bf16, {T, C}, 2492), bf16);
    const OwnedTensor out_s = device_tensor(gpu(), bf16, {2 * T, C}), out_p = device_tensor(gpu(), bf16, {2 * T, C});
    gpu().embedding_fwd({.out = out_s, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = g_starts, .positions = Tensor()});
    gpu().embedding_fwd({.out = out_p, .tokens = tokens, .wte = wte, .wpe = wpe, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = g_pos});
    EXPECT_EQ(download_bits(gpu(), out_s), download_bits(gpu(), out_p));
    const OwnedTensor dout = to_device(gpu(), random_input(bf16, {2 * T, C}, 2493), bf16);
    const OwnedTensor dwpe_s = to_device(gpu(), test::filled(f32, {T, C}, 0.25), f32), dwpe_p = to_device(gpu(), test::filled(f32, {T, C}, 0.25), f32);
    gpu().embedding_bwd({.dwte = Tensor(), .dwpe = dwpe_s, .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = g_starts, .positions = Tensor()});
    gpu().embedding_bwd({.dwte = Tensor(), .dwpe = dwpe_p, .dout = dout, .tokens = tokens, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = g_pos});
    EXPECT_EQ(download(gpu(), dwpe_s), download(gpu(), dwpe_p));
}

// Columns of one matrix into another's, in every direction between f32, bf16 and f16 at odd
// widths and offsets: the host conversions' values, and nothing outside the columns touched.
TEST_F(CudaOps, CopyColumns_ConvertsLikeTheHostAndWritesOnlyItsColumns) {
    const int64_t N = 7, src_width = 37, dst_width = 21, src_col = 5, dst_col = 3, cols = 13;
    for (const DType from : {f32, bf16, f16})
        for (const DType to : {f32, bf16, f16}) {
            SCOPED_TRACE(cat(dtype_name(from), " -> ", dtype_name(to)));
            const OwnedTensor src = random_input(from, {N, src_width}, 2500, -3, 3), dst0 = random_input(to, {N, dst_width}, 2501);
            const OwnedTensor g_src = to_device(gpu(), src, from), g_dst = to_device(gpu(), dst0, to);
            gpu().copy_columns({.dst = g_dst, .dst_col = dst_col, .src = g_src, .src_col = src_col, .cols = cols});
            std::vector<double> want = values_of(dst0);
            for (int64_t n = 0; n < N; ++n)
                for (int64_t c = 0; c < cols; ++c)
                    want[static_cast<size_t>(n * dst_width + dst_col + c)] = round_to(to, src.data<float>()[n * src_width + src_col + c]);
            EXPECT_EQ(download(gpu(), g_dst), want);
        }
    const OwnedTensor g_src = device_tensor(gpu(), f32, {N, 4}), g_dst = device_tensor(gpu(), bf16, {N, 4});
    EXPECT_THROW(gpu().copy_columns({.dst = g_dst, .dst_col = 2, .src = g_src, .src_col = 0, .cols = 3}), Error);
}

// A Llama (GQA, rotary) and a GPT-2 (learned positions) model in bf16 on the CUDA kernels with
// packed documents: document B after document A (ending with the end-of-text token 3) gets
// the logits of B alone at the start of a sequence, and B's share of the loss and of every
// parameter gradient (T * run([A, B]) - la * run([A]) = lb * run([B]), as the CPU test
// tests/unit/document_mask_test.cpp states) within bf16's rounding; without the mask the
// differences are far larger.
struct DocumentRun {
    double weighted_loss = 0;
    std::vector<double> weighted_grads, logits;
};

DocumentRun run_documents(Transformer& model, Backend& be, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t rows_from) {
    const auto T = static_cast<int64_t>(tokens.size());
    OwnedTensor tok(i32, {T}), tgt(i32, {T});
    std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
    std::copy(targets.begin(), targets.end(), tgt.data<int32_t>());
    Parameters& p = model.parameters();
    be.fill_zero(p.all_grads());
    DocumentRun r;
    r.weighted_loss = static_cast<double>(T) * model.forward(tok.view(), tgt.view(), 1, T);
    for (int64_t row = rows_from; row < T; ++row) {
        const std::vector<double> l = model.logits_row(row);
        r.logits.insert(r.logits.end(), l.begin(), l.begin() + model.config().vocab_size);
    }
    model.backward(1.0);
    for (double g : download(be, p.all_grads())) r.weighted_grads.push_back(static_cast<double>(T) * g);
    return r;
}

// The largest difference between B alone and B's share of [A, B], relative to B alone's
// largest magnitude: logits, loss, gradients.
std::array<double, 3> document_b_error(Backend& be, ModelFamily family, bool mask) {
    ModelConfig m;
    m.family = family;
    m.n_layers = 2;
    m.d_model = 128;
    m.n_heads = 2;
    m.n_kv_heads = family == ModelFamily::llama ? 1 : 2;
    m.d_ff = 256;
    m.vocab_size = 13;
    m.max_seq_len = 16;
    m.tied_embeddings = family == ModelFamily::gpt2;
    m.init_std = 0.3;
    ModelPartition part;
    part.document_mask = part.reset_position_ids = mask;
    part.document_end_token = 3;
    Transformer model(m, be, bf16, 1, 16, part);
    model.initialize(7);
    const std::vector<int32_t> a = {5, 9, 1, 7, 3}, b = {4, 4, 11, 2, 8, 6, 10, 12, 1, 5};
    const std::vector<int32_t> ta = {9, 1, 7, 3, 12}, tb = {4, 11, 2, 8, 6, 10, 12, 1, 5, 0};
    std::vector<int32_t> ab = a, tab = ta;
    ab.insert(ab.end(), b.begin(), b.end());
    tab.insert(tab.end(), tb.begin(), tb.end());
    const DocumentRun both = run_documents(model, be, ab, tab, static_cast<int64_t>(a.size()));
    const DocumentRun alone_a = run_documents(model, be, a, ta, 0), alone_b = run_documents(model, be, b, tb, 0);
    const auto max_abs_of = [](const std::vector<double>& v) {
        double x = 0;
        for (double e : v) x = std::max(x, std::abs(e));
        return x;
    };
    double logits = 0, grads = 0;
    for (size_t i = 0; i < alone_b.logits.size(); ++i) logits = std::max(logits, std::abs(both.logits[i] - alone_b.logits[i]));
    for (size_t i = 0; i < alone_b.weighted_grads.size(); ++i)
        grads = std::max(grads, std::abs(both.weighted_grads[i] - alone_a.weighted_grads[i] - alone_b.weighted_grads[i]));
    const double loss = std::abs(both.weighted_loss - alone_a.weighted_loss - alone_b.weighted_loss);
    return {logits / max_abs_of(alone_b.logits), loss / std::abs(alone_b.weighted_loss), grads / max_abs_of(alone_b.weighted_grads)};
}

TEST_F(CudaOps, DocumentAfterAnother_Bf16_HasTheLogitsLossAndGradientsOfItAlone) {
    for (ModelFamily family : {ModelFamily::llama, ModelFamily::gpt2}) {
        SCOPED_TRACE(family_name(family));
        const std::array<double, 3> masked = document_b_error(gpu(), family, true), causal = document_b_error(gpu(), family, false);
        const char* what[] = {"logits", "loss", "gradients"};
        for (size_t i = 0; i < 3; ++i) {
            // Measured: logits bitwise, loss within 1e-8, gradients within 2.4e-2 (their
            // difference of bf16-computed sums); causal: 0.1 to 2.7.
            EXPECT_LT(masked[i], 5e-2) << what[i];
            EXPECT_GT(causal[i], std::max(10 * masked[i], 5e-2)) << what[i] << ": the mask changed nothing beyond rounding";
        }
    }
}

// ---- rope ----

TEST_F(CudaOps, RopeFwd_Bf16_MatchesCpuAndLeavesTheOtherColumnsUnchanged) {
    rope_case(bf16, 2, 7, 6, 64, 10 * 64, false, 2200);    // q and k heads of H 4, Hkv 2 (v heads untouched)
    rope_case(bf16, 1, 33, 3, 128, 4 * 128, false, 2210);  // H 2, Hkv 1
    rope_case(bf16, 2, 128, 5, 64, 6 * 64, false, 2220);   // H 4, Hkv 1
    rope_case(bf16, 3, 5, 3, 10, 37, false, 2230);         // odd width, head_dim 10
    rope_case(bf16, 1, 1, 2, 64, 128, false, 2240);        // position 0 only: the identity
}

TEST_F(CudaOps, RopeBwd_Bf16_MatchesCpuAndLeavesTheOtherColumnsUnchanged) {
    rope_case(bf16, 2, 7, 6, 64, 10 * 64, true, 2300);
    rope_case(bf16, 1, 33, 3, 128, 4 * 128, true, 2310);
    rope_case(bf16, 3, 5, 3, 10, 37, true, 2320);
}

TEST_F(CudaOps, RopeFwdBwd_F16_MatchesCpu) {
    rope_case(f16, 2, 7, 6, 64, 10 * 64, false, 2400);
    rope_case(f16, 1, 33, 3, 128, 4 * 128, true, 2410);
    rope_case(f16, 3, 5, 3, 10, 37, false, 2420);
}

// ---- gelu, swiglu, add ----

const std::vector<Shape> kElementwiseShapes = {{1}, {7}, {8}, {4099}, {33, 768}, {7, 10}};

TEST_F(CudaOps, GeluFwd_Bf16_MatchesCpuAtPackedAndTailLengths) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) gelu_case(bf16, kElementwiseShapes[i], false, 2500 + 10 * i);
}

TEST_F(CudaOps, GeluBwd_Bf16_MatchesCpuAtPackedAndTailLengths) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) gelu_case(bf16, kElementwiseShapes[i], true, 2600 + 10 * i);
}

TEST_F(CudaOps, GeluFwdBwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) {
        gelu_case(f16, kElementwiseShapes[i], false, 2700 + 10 * i);
        gelu_case(f16, kElementwiseShapes[i], true, 2705 + 10 * i);
    }
}

const std::vector<std::pair<int64_t, int64_t>> kSwigluShapes = {{1, 3}, {7, 5}, {33, 8}, {64, 768}, {5, 1000}, {2, 1028}};

TEST_F(CudaOps, SwigluFwd_Bf16_MatchesCpuAtOddAndAlignedWidths) {
    for (size_t i = 0; i < kSwigluShapes.size(); ++i) swiglu_case(bf16, kSwigluShapes[i].first, kSwigluShapes[i].second, false, 2800 + 10 * i);
}

TEST_F(CudaOps, SwigluBwd_Bf16_MatchesCpuAtOddAndAlignedWidths) {
    for (size_t i = 0; i < kSwigluShapes.size(); ++i) swiglu_case(bf16, kSwigluShapes[i].first, kSwigluShapes[i].second, true, 2900 + 10 * i);
}

TEST_F(CudaOps, SwigluFwdBwd_F16_MatchesCpu) {
    for (size_t i = 0; i < kSwigluShapes.size(); ++i) {
        swiglu_case(f16, kSwigluShapes[i].first, kSwigluShapes[i].second, false, 3000 + 10 * i);
        swiglu_case(f16, kSwigluShapes[i].first, kSwigluShapes[i].second, true, 3005 + 10 * i);
    }
}

TEST_F(CudaOps, Add_Bf16_MatchesCpuIncludingOutAliasingAnInput) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) add_case(bf16, kElementwiseShapes[i], 3100 + 10 * i);
}

TEST_F(CudaOps, Add_F16_MatchesCpuIncludingOutAliasingAnInput) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) add_case(f16, kElementwiseShapes[i], 3200 + 10 * i);
}

// ZeRO-2 adds each micro-batch's reduced piece into an f32 gradient shard: one rounding, as on the CPU.
TEST_F(CudaOps, Add_F32_MatchesCpuIncludingOutAliasingAnInput) {
    for (size_t i = 0; i < kElementwiseShapes.size(); ++i) add_case(f32, kElementwiseShapes[i], 3300 + 10 * i);
}

// Views one element past an aligned start take the kernels' scalar paths; the guard elements
// around each output show that nothing is written outside it.
TEST_F(CudaOps, ElementwiseOps_Bf16_MatchCpuOnMisalignedViewsAndWriteNothingOutside) {
    const int64_t n = 1001, N = 7, F = 24;  // F % 8 == 0: only the misalignment rules out the packed path
    const OwnedTensor x = random_input(bf16, {n}, 3300, -5, 5), y = random_input(bf16, {n}, 3301), sx = random_input(bf16, {N, 2 * F}, 3302, -4, 4);
    const OwnedTensor gelu_out(f32, {n}), gelu_dx(f32, {n}), sum(f32, {n}), swiglu_out(f32, {N, F});
    cpu().gelu_fwd(gelu_out, x);
    cpu().gelu_bwd(gelu_dx, y, x);
    cpu().add(sum, x, y);
    cpu().swiglu_fwd(swiglu_out, sx);

    const GuardedTensor g_x = guarded(gpu(), bf16, {n}), g_y = guarded(gpu(), bf16, {n}), g_sx = guarded(gpu(), bf16, {N, 2 * F});
    upload_into(gpu(), g_x.view, x);
    upload_into(gpu(), g_y.view, y);
    upload_into(gpu(), g_sx.view, sx);
    const GuardedTensor g_gelu = guarded(gpu(), bf16, {n}), g_dx = guarded(gpu(), bf16, {n}), g_sum = guarded(gpu(), bf16, {n});
    const GuardedTensor g_swiglu = guarded(gpu(), bf16, {N, F});
    gpu().gelu_fwd(g_gelu.view, g_x.view);
    gpu().gelu_bwd(g_dx.view, g_y.view, g_x.view);
    gpu().add(g_sum.view, g_x.view, g_y.view);
    gpu().swiglu_fwd(g_swiglu.view, g_sx.view);
    const Tolerance tol = elementwise_tolerance(bf16);
    expect_matches("gelu out", gpu(), g_gelu.view, gelu_out, tol);
    expect_matches("gelu dx", gpu(), g_dx.view, gelu_dx, tol);
    expect_matches("add out", gpu(), g_sum.view, sum, tol);
    expect_matches("swiglu out", gpu(), g_swiglu.view, swiglu_out, tol);
    expect_guards_intact("gelu out", gpu(), g_gelu);
    expect_guards_intact("gelu dx", gpu(), g_dx);
    expect_guards_intact("add out", gpu(), g_sum);
    expect_guards_intact("swiglu out", gpu(), g_swiglu);
}

// ---- cross-entropy ----

TEST_F(CudaOps, XentFwd_Bf16_MatchesCpuAtVocab37_1000And50257) {
    xent_fwd_case(bf16, 1, 37, 3400);
    xent_fwd_case(bf16, 33, 37, 3410);
    xent_fwd_case(bf16, 64, 1000, 3420);
    xent_fwd_case(bf16, 7, 1003, 3430);
    xent_fwd_case(bf16, 8, 50257, 3440);
}

TEST_F(CudaOps, XentFwd_F16_MatchesCpu) {
    xent_fwd_case(f16, 33, 37, 3500);
    xent_fwd_case(f16, 64, 1000, 3510);
    xent_fwd_case(f16, 4, 50257, 3520);
}

TEST_F(CudaOps, XentBwd_Bf16_MatchesCpuComputingTheLogsumexp) {
    xent_bwd_case(bf16, 1, 37, 3600);
    xent_bwd_case(bf16, 33, 37, 3610);
    xent_bwd_case(bf16, 64, 1000, 3620);
    xent_bwd_case(bf16, 4, 50257, 3630);
}

TEST_F(CudaOps, XentBwd_Bf16_MatchesCpuOnVocabShardsWithTheGivenLogsumexp) {
    xent_bwd_shard_case(bf16, 33, 37, 17, 20, 3700);
    xent_bwd_shard_case(bf16, 16, 1000, 300, 357, 3710);
    xent_bwd_shard_case(bf16, 7, 1000, 0, 500, 3720);
    xent_bwd_shard_case(bf16, 4, 50257, 25128, 25129, 3730);
    xent_bwd_shard_case(bf16, 9, 37, 0, 37, 3740);  // lse given for whole rows
}

TEST_F(CudaOps, XentBwd_F16_MatchesCpuWholeAndSharded) {
    xent_bwd_case(f16, 33, 37, 3800);
    xent_bwd_case(f16, 16, 1000, 3810);
    xent_bwd_shard_case(f16, 16, 1000, 300, 357, 3820);
}

// dlogits may alias logits (the loss writes its gradient over the logits in place).
TEST_F(CudaOps, XentBwd_Bf16_InPlaceOnLogitsEqualsSeparateOutput) {
    const int64_t N = 33, V = 1000;
    const OwnedTensor logits = random_input(bf16, {N, V}, 3900, -6, 6), targets = random_tokens(N, V, 3901), lse = row_logsumexp_of(logits);
    const OwnedTensor g_targets = to_device(gpu(), targets, i32), g_lse = to_device(gpu(), lse, f32);
    for (bool with_lse : {false, true}) {
        SCOPED_TRACE(with_lse ? "lse given" : "lse computed");
        const OwnedTensor g_logits = to_device(gpu(), logits, bf16), g_separate = device_tensor(gpu(), bf16, {N, V});
        gpu().xent_bwd({.dlogits = g_separate, .logits = g_logits, .targets = g_targets, .lse = with_lse ? g_lse.view() : Tensor(), .vocab = {},
                        .dloss = 0.5});
        gpu().xent_bwd({.dlogits = g_logits, .logits = g_logits, .targets = g_targets, .lse = with_lse ? g_lse.view() : Tensor(), .vocab = {},
                        .dloss = 0.5});
        expect_bitwise_equal("dlogits in place", download_bytes(gpu(), g_logits), download_bytes(gpu(), g_separate), 2);
    }
}

// The fused classifier: losses and lse as xent_fwd, the logits overwritten by xent_bwd's
// gradient; against the CPU reference, and bitwise the GPU's own two ops (padded vocabulary
// and a vocabulary whose rows are not 16-byte multiples included).
TEST_F(CudaOps, XentFwdBwd_Bf16AndF16_MatchCpuAndAreBitwiseTheTwoOps) {
    struct Case {
        int64_t N, V, real;
    };
    for (const DType dt : {bf16, f16})
        for (const Case c : {Case{33, 1000, 1000}, Case{17, 50257, 50257}, Case{9, 1024, 1001}}) {
            SCOPED_TRACE(cat(dtype_name(dt), " N ", c.N, " V ", c.V, " real ", c.real));
            const double dloss = 0.37;
            const VocabShard whole{0, c.V, c.real};
            const OwnedTensor logits = random_input(dt, {c.N, c.V}, 7100, -6, 6), targets = random_tokens(c.N, c.real, 7101);
            const OwnedTensor losses(f32, {c.N}), lse(f32, {c.N}), dlogits = copy_of(logits);
            cpu().xent_fwd({.losses = losses, .lse = lse, .logits = logits, .targets = targets, .vocab = whole});
            cpu().xent_bwd({.dlogits = dlogits, .logits = dlogits, .targets = targets, .lse = lse, .vocab = whole, .dloss = dloss});
            const OwnedTensor g_targets = to_device(gpu(), targets, i32), g_fused = to_device(gpu(), logits, dt), g_apart = to_device(gpu(), logits, dt);
            const OwnedTensor g_losses = device_tensor(gpu(), f32, {c.N}), g_lse = device_tensor(gpu(), f32, {c.N});
            const OwnedTensor a_losses = device_tensor(gpu(), f32, {c.N}), a_lse = device_tensor(gpu(), f32, {c.N});
            gpu().xent_fwd_bwd({.losses = g_losses, .lse = g_lse, .logits = g_fused, .targets = g_targets, .vocab = whole, .dloss = dloss});
            gpu().xent_fwd({.losses = a_losses, .lse = a_lse, .logits = g_apart, .targets = g_targets, .vocab = whole});
            gpu().xent_bwd({.dlogits = g_apart, .logits = g_apart, .targets = g_targets, .lse = a_lse, .vocab = whole, .dloss = dloss});
            expect_matches("losses", gpu(), g_losses, losses, f32_loss_tolerance);
            expect_matches("dlogits", gpu(), g_fused, dlogits, elementwise_tolerance(dt));
            expect_bitwise_equal("losses against the two ops", download_bytes(gpu(), g_losses), download_bytes(gpu(), a_losses), 4);
            expect_bitwise_equal("dlogits against the two ops", download_bytes(gpu(), g_fused), download_bytes(gpu(), g_apart), 2);
        }
}

// The residual add and the norm after it in one pass: sum and out against the CPU, and
// bitwise the GPU's add then layernorm_fwd / rmsnorm_fwd; sum aliasing a (the model's use).
TEST_F(CudaOps, AddNormFwd_LayerAndRms_MatchCpuAndAreBitwiseTheTwoOps) {
    for (const DType dt : {bf16, f16})
        for (const NormCase c : kNormCases)
            for (const bool rms : {false, true}) {
                SCOPED_TRACE(cat(dtype_name(dt), " N ", c.N, " C ", c.C, rms ? " rms" : " layer"));
                const OwnedTensor a = random_input(dt, {c.N, c.C}, 7200, -2, 3), b = random_input(dt, {c.N, c.C}, 7201, -1, 1);
                const OwnedTensor w = random_input(dt, {c.C}, 7202, -1.5, 1.5), bias = random_input(dt, {c.C}, 7203);
                const OwnedTensor sum(f32, {c.N, c.C}), out(f32, {c.N, c.C}), mean(f32, {c.N}), rstd(f32, {c.N});
                const OwnedTensor sum_rounded(f32, {c.N, c.C});
                cpu().add(sum, a, b);
                for (int64_t i = 0; i < sum.view().numel(); ++i) sum_rounded.data<float>()[i] = round_to(dt, sum.data<float>()[i]);
                if (rms) cpu().rmsnorm_fwd({.out = out, .rstd = rstd, .x = sum_rounded, .w = w, .eps = kNormEps});
                else cpu().layernorm_fwd({.out = out, .mean = mean, .rstd = rstd, .x = sum_rounded, .w = w, .b = bias, .eps = kNormEps});

                const OwnedTensor g_w = to_device(gpu(), w, dt), g_bias = to_device(gpu(), bias, dt), g_b = to_device(gpu(), b, dt);
                const OwnedTensor g_fused = to_device(gpu(), a, dt), g_apart = to_device(gpu(), a, dt);
                const auto stats = [&] { return std::array<OwnedTensor, 3>{device_tensor(gpu(), dt, {c.N, c.C}), device_tensor(gpu(), f32, {c.N}), device_tensor(gpu(), f32, {c.N})}; };
                const std::array<OwnedTensor, 3> f = stats(), p = stats();
                gpu().add_norm_fwd({.sum = g_fused, .out = f[0], .mean = rms ? Tensor() : f[1].view(), .rstd = f[2], .a = g_fused, .b = g_b, .w = g_w,
                                    .bias = rms ? Tensor() : g_bias.view(), .eps = kNormEps, .rms = rms});
                gpu().add(g_apart, g_apart, g_b);
                if (rms) gpu().rmsnorm_fwd({.out = p[0], .rstd = p[2], .x = g_apart, .w = g_w, .eps = kNormEps});
                else gpu().layernorm_fwd({.out = p[0], .mean = p[1], .rstd = p[2], .x = g_apart, .w = g_w, .b = g_bias, .eps = kNormEps});
                expect_matches("sum", gpu(), g_fused, sum, elementwise_tolerance(dt));
                expect_matches("out", gpu(), f[0], out, elementwise_tolerance(dt));
                expect_bitwise_equal("sum against the two ops", download_bytes(gpu(), g_fused), download_bytes(gpu(), g_apart), 2);
                expect_bitwise_equal("out against the two ops", download_bytes(gpu(), f[0]), download_bytes(gpu(), p[0]), 2);
                expect_bitwise_equal("rstd against the two ops", download_bytes(gpu(), f[2]), download_bytes(gpu(), p[2]), 4);
            }
}

// The max of 16-bit values, widened to f32: exact. One case has only negative logits (a max
// that starts from 0 would be wrong there).
TEST_F(CudaOps, LogitsRowMax_Bf16_EqualsCpuExactly) {
    struct Case {
        int64_t N, V;
        double lo, hi;
    };
    uint64_t seed = 4000;
    for (const Case& c : {Case{1, 37, -6, 6}, Case{33, 1000, -9, -3}, Case{4, 50257, -6, 6}, Case{7, 8, 1, 2}, Case{5, 1003, -6, 6}})
        for (DType dt : {bf16, f16}) {
            SCOPED_TRACE(cat(dtype_name(dt), " N ", c.N, " V ", c.V));
            const OwnedTensor logits = random_input(dt, {c.N, c.V}, ++seed, c.lo, c.hi), row_max(f32, {c.N});
            cpu().logits_row_max(row_max, logits, {});
            const OwnedTensor g_logits = to_device(gpu(), logits, dt), g_max = device_tensor(gpu(), f32, {c.N});
            gpu().logits_row_max(g_max, g_logits, {});
            expect_matches("row_max", gpu(), g_max, row_max, Tolerance{0, 0});
        }
}

TEST_F(CudaOps, XentPartial_Bf16_MatchesCpuOnWholeRowsAndVocabShards) {
    xent_partial_case(bf16, 33, 37, 0, 37, {}, 4100);
    xent_partial_case(bf16, 33, 37, 17, 20, {17, 37}, 4110);
    xent_partial_case(bf16, 16, 1000, 300, 357, {300, 1000}, 4120);
    xent_partial_case(bf16, 4, 50257, 25128, 25129, {25128, 50257}, 4130);
    xent_partial_case(f16, 16, 1000, 0, 500, {0, 1000}, 4140);
}

// 257 -> 258 in halves (tp 2), 257 -> 384 in shards of 64 (one holding 1 real class, one
// padding only), 50257 -> 50304 in halves, and 37 -> 48 in shards of 8 (5 real + 3 padding,
// then padding only).
TEST_F(CudaOps, Xent_Bf16_PaddedVocabularyMasksThePaddingLikeCpu) {
    xent_padded_case(bf16, 9, 257, 258, 129, 4300);
    xent_padded_case(bf16, 5, 257, 384, 64, 4310);
    xent_padded_case(bf16, 3, 50257, 50304, 25152, 4320);
    xent_padded_case(bf16, 7, 37, 48, 8, 4330);
}

TEST_F(CudaOps, Xent_F16_PaddedVocabularyMasksThePaddingLikeCpu) { xent_padded_case(f16, 9, 257, 384, 64, 4400); }

TEST_F(CudaOps, XentCombine_F32_MatchesCpu) {
    for (int64_t N : {1, 37, 513}) {
        SCOPED_TRACE(cat("N ", N));
        const OwnedTensor sums = random_tensor(f32, {N}, 4200 + static_cast<uint64_t>(N), 1, 1000);
        const OwnedTensor target_logits = random_tensor(f32, {N}, 4201 + static_cast<uint64_t>(N), -5, 5);
        const OwnedTensor row_max = random_tensor(f32, {N}, 4202 + static_cast<uint64_t>(N), -5, 5), partial(f32, {N, 2});
        for (int64_t n = 0; n < N; ++n) {
            partial.data<float>()[2 * n] = sums.data<float>()[n];
            partial.data<float>()[2 * n + 1] = target_logits.data<float>()[n];
        }
        const OwnedTensor losses(f32, {N}), lse(f32, {N});
        cpu().xent_combine({.losses = losses, .lse = lse, .partial = partial, .row_max = row_max});
        const OwnedTensor g_partial = to_device(gpu(), partial, f32), g_max = to_device(gpu(), row_max, f32);
        const OwnedTensor g_losses = device_tensor(gpu(), f32, {N}), g_lse = device_tensor(gpu(), f32, {N});
        gpu().xent_combine({.losses = g_losses, .lse = g_lse, .partial = g_partial, .row_max = g_max});
        // lse = m + log(S), one fp32 logf against the CPU's double: a few ulps.
        expect_matches("losses", gpu(), g_losses, losses, f32_loss_tolerance);
        expect_matches("lse", gpu(), g_lse, lse, f32_loss_tolerance);
    }
}

// ---- optimizer ----

// fp32 on both sides (the CPU computes each element in double, CUDA in fp32 from the same
// constants): a few ulps per step, 1e-5 leaves room for three steps.
TEST_F(CudaOps, AdamW_F32_MatchesCpuOverThreeSteps) {
    const Tolerance tol{1e-5, 1e-5};
    uint64_t seed = 4300;
    for (const Shape& shape : {Shape{1}, Shape{7}, Shape{33, 10}, Shape{4099}}) {
        SCOPED_TRACE(shape.str());
        const OwnedTensor p0 = random_tensor(f32, shape, ++seed), m0 = random_tensor(f32, shape, ++seed, -0.1, 0.1);
        const OwnedTensor v0 = random_tensor(f32, shape, ++seed, 0.0, 0.1);
        const OwnedTensor p = copy_of(p0), m = copy_of(m0), v = copy_of(v0);
        const OwnedTensor g_p = to_device(gpu(), p0, f32), g_m = to_device(gpu(), m0, f32), g_v = to_device(gpu(), v0, f32);
        for (int64_t t = 1; t <= 3; ++t) {
            SCOPED_TRACE(cat("step ", t));
            AdamWStep s;
            s.lr = 1e-2;
            s.weight_decay = 0.1;
            s.grad_scale = 0.5;
            s.step = t;
            const OwnedTensor grad = random_tensor(f32, shape, ++seed, -2, 2), g_grad = to_device(gpu(), grad, f32);
            cpu().adamw({.param = p, .grad = grad, .m = m, .v = v, .param_copy = Tensor(), .step = s});
            gpu().adamw({.param = g_p, .grad = g_grad, .m = g_m, .v = g_v, .param_copy = Tensor(), .step = s});
            expect_matches("param", gpu(), g_p, p, tol);
            expect_matches("m", gpu(), g_m, m, tol);
            expect_matches("v", gpu(), g_v, v, tol);
        }
    }
}

// The compute copy is the updated master rounded to nearest even, bit for bit, and writing
// it does not change the master's update.
TEST_F(CudaOps, AdamW_ParamCopy_EqualsTheUpdatedMasterRoundedToBf16AndF16) {
    const int64_t n = 4099;
    AdamWStep s;
    s.lr = 1e-2;
    s.weight_decay = 0.1;
    s.step = 2;
    const OwnedTensor p0 = random_tensor(f32, {n}, 4400), grad = random_tensor(f32, {n}, 4401), m0 = random_tensor(f32, {n}, 4402, -0.1, 0.1);
    const OwnedTensor v0 = random_tensor(f32, {n}, 4403, 0.0, 0.1);
    const OwnedTensor p = copy_of(p0), m = copy_of(m0), v = copy_of(v0);
    cpu().adamw({.param = p, .grad = grad, .m = m, .v = v, .param_copy = Tensor(), .step = s});
    for (DType dt : {bf16, f16}) {
        SCOPED_TRACE(dtype_name(dt));
        const OwnedTensor g_p = to_device(gpu(), p0, f32), g_grad = to_device(gpu(), grad, f32), g_m = to_device(gpu(), m0, f32);
        const OwnedTensor g_v = to_device(gpu(), v0, f32), g_copy = device_tensor(gpu(), dt, {n});
        gpu().adamw({.param = g_p, .grad = g_grad, .m = g_m, .v = g_v, .param_copy = g_copy, .step = s});
        expect_matches("param", gpu(), g_p, p, Tolerance{1e-5, 1e-5});
        const std::vector<double> master = download(gpu(), g_p);
        const std::vector<uint16_t> copy = download_bits(gpu(), g_copy);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
            const auto master_value = static_cast<float>(master[static_cast<size_t>(i)]);
            const uint16_t expected = dt == bf16 ? float_to_bf16(master_value) : float_to_f16(master_value);
            if (copy[static_cast<size_t>(i)] != expected && ++mismatches <= 5)
                ADD_FAILURE() << "param_copy[" << i << "] = 0x" << std::hex << copy[static_cast<size_t>(i)] << ", expected 0x" << expected << std::dec
                              << " (master " << master_value << ")";
        }
        EXPECT_EQ(mismatches, 0);
    }
}

// Both sides square and add in double (the interface's contract): only the order of the sums
// differs, far below 1e-9 relative; an fp32 accumulation would miss it.
TEST_F(CudaOps, SumSquares_F32_MatchesCpuInDoublePrecision) {
    for (int64_t n : {1, 7, 1000, 1000003}) {
        SCOPED_TRACE(cat("n ", n));
        const OwnedTensor x = random_tensor(f32, {n}, 4500 + static_cast<uint64_t>(n));
        const double reference = cpu().sum_squares(x);
        const OwnedTensor g_x = to_device(gpu(), x, f32);
        const double result = gpu().sum_squares(g_x);
        ASSERT_TRUE(std::isfinite(result));
        ASSERT_GT(result, 0.0);
        EXPECT_LE(std::abs(result - reference), 1e-9 * reference) << "gpu " << result << ", cpu " << reference;
    }
}

// optim.cu reads 16-byte quads when x is aligned and single elements otherwise, in the same
// order: the same values give the same sum at any alignment.
TEST_F(CudaOps, SumSquares_F32_IsBitwiseIndependentOfAlignment) {
    const int64_t n = 100003;
    const OwnedTensor x = random_tensor(f32, {n}, 4600);
    const OwnedTensor g_aligned = to_device(gpu(), x, f32), g_buffer = device_tensor(gpu(), f32, {n + 1});
    const Tensor g_misaligned = offset_view(g_buffer, 1, {n});
    upload_into(gpu(), g_misaligned, x);
    EXPECT_EQ(gpu().sum_squares(g_aligned), gpu().sum_squares(g_misaligned));
}

// ---- fill_zero and copy ----

TEST_F(CudaOps, FillZero_ZeroesItsRowsAndNothingElseInEveryDtype) {
    const int64_t rows = 12, cols = 37;
    for (DType dt : {bf16, f16, f32, i32}) {
        SCOPED_TRACE(dtype_name(dt));
        OwnedTensor host(i32, {rows, cols});
        if (dt == i32) {
            const OwnedTensor ids = random_tokens(rows * cols, 1000, 4701);
            for (int64_t i = 0; i < rows * cols; ++i) host.data<int32_t>()[i] = ids.data<int32_t>()[i] + 1;  // never 0
        } else {
            host = random_input(dt, {rows, cols}, 4700, 0.5, 1.5);
        }
        const std::vector<double> before = values_of(host);
        const OwnedTensor g = to_device(gpu(), host, dt);
        gpu().fill_zero(g.view().slice_rows(3, 5));
        const std::vector<double> after = download(gpu(), g);
        int64_t wrong = 0;
        for (int64_t i = 0; i < rows * cols; ++i) {
            const int64_t r = i / cols;
            const double expected = r >= 3 && r < 8 ? 0.0 : before[static_cast<size_t>(i)];
            if (after[static_cast<size_t>(i)] != expected && ++wrong <= 5)
                ADD_FAILURE() << "[" << r << ", " << i % cols << "] = " << after[static_cast<size_t>(i)] << ", expected " << expected;
        }
        EXPECT_EQ(wrong, 0);
        gpu().fill_zero(g);
        for (double value : download(gpu(), g)) ASSERT_EQ(value, 0.0);
    }
}

// f32 -> bf16 / f16 rounds to nearest even exactly as the host's float_to_bf16 / float_to_f16
// (ties, subnormals, overflow to infinity, signed zeros), and NaN stays NaN.
TEST_F(CudaOps, Copy_F32To16Bit_RoundsExactlyAsTheHostConversions) {
    std::vector<float> values = conversion_inputs(4800);
    const auto finite_count = static_cast<int64_t>(values.size());
    values.push_back(std::numeric_limits<float>::quiet_NaN());
    values.push_back(-std::numeric_limits<float>::quiet_NaN());
    const auto n = static_cast<int64_t>(values.size());
    const OwnedTensor g_in = device_tensor(gpu(), f32, {n});
    upload_raw(gpu(), g_in, values.data(), values.size() * sizeof(float));
    for (DType dt : {bf16, f16}) {
        SCOPED_TRACE(dtype_name(dt));
        const OwnedTensor g_out = device_tensor(gpu(), dt, {n});
        gpu().copy(g_out, g_in);
        const std::vector<uint16_t> bits = download_bits(gpu(), g_out);
        int64_t wrong = 0;
        for (int64_t i = 0; i < finite_count; ++i) {
            const float v = values[static_cast<size_t>(i)];
            const uint16_t expected = dt == bf16 ? float_to_bf16(v) : float_to_f16(v);
            if (bits[static_cast<size_t>(i)] != expected && ++wrong <= 5)
                ADD_FAILURE() << "input 0x" << std::hex << bits_of(v) << " (" << std::dec << v << "): 0x" << std::hex << bits[static_cast<size_t>(i)]
                              << ", expected 0x" << expected << std::dec;
        }
        EXPECT_EQ(wrong, 0);
        for (int64_t i = finite_count; i < n; ++i) EXPECT_TRUE(is_nan_16(dt, bits[static_cast<size_t>(i)])) << "NaN became 0x" << std::hex << bits[static_cast<size_t>(i)];
    }
}

// bf16 / f16 -> f32 is exact: every one of the 65536 bit patterns widens to the host's value
// bit for bit (NaNs to a NaN).
TEST_F(CudaOps, Copy_16BitToF32_IsExactForEveryBitPattern) {
    std::vector<uint16_t> patterns(65536);
    for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
    const auto n = static_cast<int64_t>(patterns.size());
    for (DType dt : {bf16, f16}) {
        SCOPED_TRACE(dtype_name(dt));
        const OwnedTensor g_in = device_tensor(gpu(), dt, {n}), g_out = device_tensor(gpu(), f32, {n});
        upload_raw(gpu(), g_in, patterns.data(), patterns.size() * sizeof(uint16_t));
        gpu().copy(g_out, g_in);
        std::vector<float> out(patterns.size());
        gpu().copy_to_host(out.data(), g_out);
        int64_t wrong = 0;
        for (size_t i = 0; i < patterns.size(); ++i) {
            const float expected = dt == bf16 ? bf16_to_float(patterns[i]) : f16_to_float(patterns[i]);
            const bool ok = is_nan_16(dt, patterns[i]) ? std::isnan(out[i]) : bits_of(out[i]) == bits_of(expected);
            if (!ok && ++wrong <= 5)
                ADD_FAILURE() << "0x" << std::hex << patterns[i] << " widened to 0x" << bits_of(out[i]) << ", expected 0x" << bits_of(expected) << std::dec;
        }
        EXPECT_EQ(wrong, 0);
    }
}

// Same dtype: a byte copy, also between shapes of the same element count.
TEST_F(CudaOps, Copy_SameDtype_IsBitwiseAcrossShapes) {
    for (DType dt : {bf16, f16, f32, i32}) {
        SCOPED_TRACE(dtype_name(dt));
        const OwnedTensor host = dt == i32 ? random_tokens(42, 1000, 4901) : random_input(dt, {6, 7}, 4900, -3, 3);
        const OwnedTensor g_in = to_device(gpu(), host, dt), g_out = device_tensor(gpu(), dt, {42});
        gpu().copy(g_out, g_in);
        expect_bitwise_equal("copy", download_bytes(gpu(), g_out), download_bytes(gpu(), g_in), dtype_size(dt));
    }
}

// ---- determinism: two runs on the same inputs give the same bits ----

namespace {

class CudaDeterminism : public CudaVsCpuTest {
protected:
    // Runs `backward` twice (each time from fresh copies of the starting gradients, which it
    // creates itself) and requires every output to be bitwise the same.
    void expect_two_runs_identical(const std::function<std::vector<OwnedTensor>()>& backward) {
        const std::vector<OwnedTensor> first = backward(), second = backward();
        ASSERT_EQ(first.size(), second.size());
        for (size_t i = 0; i < first.size(); ++i)
            expect_bitwise_equal(cat("output ", i), download_bytes(gpu(), first[i]), download_bytes(gpu(), second[i]), dtype_size(first[i].view().dtype()));
    }
};

}  // namespace

TEST_F(CudaDeterminism, EmbeddingBwd_TwoRunsAreBitwiseEqual) {
    const int64_t B = 4, T = 128, V = 37, C = 768, N = B * T;  // every token repeats ~14 times
    const OwnedTensor tokens = random_tokens(N, V, 5000), dout = random_input(bf16, {N, C}, 5001);
    const OwnedTensor dwte0 = random_tensor(f32, {V, C}, 5002), dwpe0 = random_tensor(f32, {T, C}, 5003);
    const OwnedTensor g_tokens = to_device(gpu(), tokens, i32), g_dout = to_device(gpu(), dout, bf16);
    expect_two_runs_identical([&] {
        std::vector<OwnedTensor> g;
        g.push_back(to_device(gpu(), dwte0, f32));
        g.push_back(to_device(gpu(), dwpe0, f32));
        gpu().embedding_bwd({.dwte = g[0], .dwpe = g[1], .dout = g_dout, .tokens = g_tokens, .seq_len = T, .vocab = {}, .doc_starts = Tensor(), .positions = Tensor()});
        return g;
    });
}

TEST_F(CudaDeterminism, LayerNormBwd_TwoRunsAreBitwiseEqual) {
    const int64_t N = 512, C = 768;
    const OwnedTensor x = random_input(bf16, {N, C}, 5100, -2, 3), w = random_input(bf16, {C}, 5101), b = random_input(bf16, {C}, 5102);
    const OwnedTensor dout = random_input(bf16, {N, C}, 5103), dw0 = random_tensor(f32, {C}, 5104), db0 = random_tensor(f32, {C}, 5105);
    const OwnedTensor g_x = to_device(gpu(), x, bf16), g_w = to_device(gpu(), w, bf16), g_b = to_device(gpu(), b, bf16), g_dout = to_device(gpu(), dout, bf16);
    const OwnedTensor g_out = device_tensor(gpu(), bf16, {N, C}), g_mean = device_tensor(gpu(), f32, {N}), g_rstd = device_tensor(gpu(), f32, {N});
    gpu().layernorm_fwd({.out = g_out, .mean = g_mean, .rstd = g_rstd, .x = g_x, .w = g_w, .b = g_b, .eps = kNormEps});
    expect_two_runs_identical([&] {
        std::vector<OwnedTensor> g;
        g.push_back(device_tensor(gpu(), bf16, {N, C}));
        g.push_back(to_device(gpu(), dw0, f32));
        g.push_back(to_device(gpu(), db0, f32));
        gpu().layernorm_bwd({.dx = g[0], .dw = g[1], .db = g[2], .dout = g_dout, .x = g_x, .w = g_w, .mean = g_mean, .rstd = g_rstd,
                             .accumulate_dx = false});
        return g;
    });
}

TEST_F(CudaDeterminism, MatmulBwd_TwoRunsAreBitwiseEqual) {
    const int64_t N = 512, IC = 768, OC = 768;
    const OwnedTensor x = random_input(bf16, {N, IC}, 5200), w = random_input(bf16, {OC, IC}, 5201), dout = random_input(bf16, {N, OC}, 5202);
    const OwnedTensor dw0 = random_tensor(f32, {OC, IC}, 5203), db0 = random_tensor(f32, {OC}, 5204);
    const OwnedTensor g_x = to_device(gpu(), x, bf16), g_w = to_device(gpu(), w, bf16), g_dout = to_device(gpu(), dout, bf16);
    expect_two_runs_identical([&] {
        std::vector<OwnedTensor> g;
        g.push_back(device_tensor(gpu(), bf16, {N, IC}));
        g.push_back(to_device(gpu(), dw0, f32));
        g.push_back(to_device(gpu(), db0, f32));
        gpu().matmul_bwd({.dx = g[0], .dw = g[1], .dbias = g[2], .dout = g_dout, .x = g_x, .w = g_w});
        return g;
    });
}

TEST_F(CudaDeterminism, AttentionBwd_TwoRunsAreBitwiseEqual) {
    for (const AttentionShape& s : {AttentionShape{2, 256, 4, 2, 64}, AttentionShape{1, 200, 4, 1, 128}}) {
        SCOPED_TRACE(describe(s));
        const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 5300, -2, 2), dout = random_input(bf16, {s.rows(), s.out_width()}, 5301);
        const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_dout = to_device(gpu(), dout, bf16);
        const OwnedTensor g_out = device_tensor(gpu(), bf16, {s.rows(), s.out_width()}), g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = Tensor()});
        expect_two_runs_identical([&] {
            std::vector<OwnedTensor> g;
            g.push_back(device_tensor(gpu(), bf16, {s.rows(), s.qkv_width()}));
            gpu().attention_bwd({.dqkv = g[0], .dout = g_dout, .qkv = g_qkv, .out = g_out, .saved = g_saved, .shape = s, .doc_starts = Tensor()});
            return g;
        });
    }
}

// A block of rank 1 of cp 2 (T = 96: three key tiles, rows in two chunks) against its own
// keys, forward and backward from zeroed accumulators.
TEST_F(CudaDeterminism, AttentionBlockFwdBwd_TwoRunsAreBitwiseEqual) {
    const AttentionShape s{2, 48, 4, 2, 64};
    const int64_t KV = 2 * s.n_kv_heads * s.head_dim;
    const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 5350, -2, 2), dout = random_input(bf16, {s.rows(), s.out_width()}, 5351);
    const OwnedTensor kv = column_block(qkv, s.n_heads * s.head_dim, KV);
    const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_dout = to_device(gpu(), dout, bf16), g_kv = to_device(gpu(), kv, bf16);
    const OwnedTensor g_pos = to_device(gpu(), i32_host(cp_rows(96, 2, 1)), i32);
    expect_two_runs_identical([&] {
        std::vector<OwnedTensor> g;
        g.push_back(device_tensor(gpu(), f32, {s.rows(), s.out_width()}));
        g.push_back(device_tensor(gpu(), f32, {s.batch, s.n_heads, s.seq_len}));
        g.push_back(device_tensor(gpu(), bf16, {s.rows(), s.out_width()}));
        g.push_back(device_tensor(gpu(), f32, {s.rows(), s.out_width()}));
        g.push_back(device_tensor(gpu(), f32, {s.rows(), KV}));
        gpu().attention_block_fwd({.acc = g[0], .lse = g[1], .qkv = g_qkv, .kv = g_kv, .shape = s, .kv_len = s.seq_len, .q_positions = g_pos,
                                   .kv_positions = g_pos, .q_first = Tensor(), .first = true});
        gpu().copy_columns({.dst = g[2], .dst_col = 0, .src = g[0], .src_col = 0, .cols = s.out_width()});
        gpu().fill_zero(g[3]);
        gpu().fill_zero(g[4]);
        gpu().attention_block_bwd({.dq = g[3], .dkv = g[4], .dout = g_dout, .out = g[2], .lse = g[1], .qkv = g_qkv, .kv = g_kv, .shape = s,
                                   .kv_len = s.seq_len, .q_positions = g_pos, .kv_positions = g_pos, .q_first = Tensor()});
        return g;
    });
}

TEST_F(CudaDeterminism, SumSquares_TwoRunsAreBitwiseEqual) {
    const int64_t n = (int64_t{1} << 22) + 5;
    const OwnedTensor x = random_tensor(f32, {n}, 5400), g_x = to_device(gpu(), x, f32);
    const double first = gpu().sum_squares(g_x), second = gpu().sum_squares(g_x);
    EXPECT_EQ(first, second);
    EXPECT_GT(first, 0.0);
}

// ---- cuDNN's fused attention (model.attention = "cudnn") ----
// The same checks as the native kernels' against the CPU reference and the double-precision
// log-sum-exps, at head dims 64 and 128, with and without grouped-query heads; then against
// the native kernels themselves, and bitwise across two runs. Skipped where libcudnn cannot
// be loaded (a GPU without it, the CUDA emulation).

namespace {

const std::vector<AttentionShape> kCudnnShapes = {
    {2, 64, 4, 4, 64},    // MHA, head dim 64
    {2, 128, 8, 2, 64},   // GQA 4:1
    {1, 100, 4, 1, 64},   // MQA, a partial tile
    {2, 128, 4, 4, 128},  // head dim 128
    {1, 256, 8, 2, 128},  // GQA at 128
};

class CudnnOps : public CudaOps {
protected:
    AttentionImpl attention() const override { return AttentionImpl::cudnn; }
    // cudnn refuses a shape it cannot plan, so a test that ran used cuDNN; the description
    // names the engines for the log.
    void expect_cudnn_runs(const AttentionShape& s, DType dt) {
        const std::string how = gpu().describe_attention(s, dt);
        EXPECT_EQ(how.rfind("cuDNN", 0), 0u) << how;
        std::printf("%s %s: %s\n", describe(s).c_str(), dtype_name(dt), how.c_str());
    }
};

class CudnnDeterminism : public CudaDeterminism {
protected:
    AttentionImpl attention() const override { return AttentionImpl::cudnn; }
};

}  // namespace

TEST_F(CudnnOps, AttentionFwd_Bf16_MatchesCpuAtHeadDims64And128WithAndWithoutGqa) {
    for (size_t i = 0; i < kCudnnShapes.size(); ++i) {
        expect_cudnn_runs(kCudnnShapes[i], bf16);
        attention_fwd_case(bf16, kCudnnShapes[i], 6100 + 10 * i);
    }
}

TEST_F(CudnnOps, AttentionFwd_F16_MatchesCpuAtHeadDims64And128WithAndWithoutGqa) {
    for (size_t i = 0; i < kCudnnShapes.size(); ++i) attention_fwd_case(f16, kCudnnShapes[i], 6200 + 10 * i);
}

TEST_F(CudnnOps, AttentionBwd_Bf16_MatchesCpuAtHeadDims64And128WithAndWithoutGqa) {
    for (size_t i = 0; i < kCudnnShapes.size(); ++i) attention_bwd_case(bf16, kCudnnShapes[i], 6300 + 10 * i);
}

TEST_F(CudnnOps, AttentionBwd_F16_MatchesCpuAtHeadDims64And128WithAndWithoutGqa) {
    for (size_t i = 0; i < kCudnnShapes.size(); ++i) attention_bwd_case(f16, kCudnnShapes[i], 6400 + 10 * i);
}

// Both implementations save the same log-sum-exp rows: each one's backward may follow the
// other's forward, and their results agree within the 16-bit tolerance.
TEST_F(CudnnOps, AttentionFwdBwd_MatchTheNativeKernelsAndShareTheSavedRows) {
    std::unique_ptr<Backend> native;
    make_cuda_backend_or_skip(native, AttentionImpl::native);
    if (!native) return;
    for (const AttentionShape& s : {AttentionShape{2, 128, 8, 2, 64}, AttentionShape{1, 192, 4, 4, 128}}) {
        SCOPED_TRACE(describe(s));
        const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 6500, -2, 2), dout = random_input(bf16, {s.rows(), s.out_width()}, 6501);
        const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_dout = to_device(gpu(), dout, bf16);
        struct Run {
            OwnedTensor out, saved, dqkv;
        };
        const auto run = [&](Backend& be) {
            Run r{device_tensor(be, bf16, {s.rows(), s.out_width()}), device_tensor(be, f32, be.attention_saved_shape(s)),
                  device_tensor(be, bf16, {s.rows(), s.qkv_width()})};
            be.attention_fwd({.out = r.out, .saved = r.saved, .qkv = g_qkv, .shape = s, .doc_starts = Tensor()});
            be.attention_bwd({.dqkv = r.dqkv, .dout = g_dout, .qkv = g_qkv, .out = r.out, .saved = r.saved, .shape = s, .doc_starts = Tensor()});
            be.synchronize();
            return r;
        };
        const Run c = run(gpu()), n = run(*native);
        const std::vector<double> c_out = download(gpu(), c.out), n_out = download(*native, n.out);
        expect_matches("out", c_out, n_out, attention_tolerance(bf16));
        expect_matches("lse", download(gpu(), c.saved), download(*native, n.saved), f32_sum_tolerance);
        const std::vector<double> c_d = download(gpu(), c.dqkv), n_d = download(*native, n.dqkv);
        expect_matches("dqkv", c_d, n_d, attention_tolerance(bf16), {1e-2 * max_abs(n_d), false});
        // cuDNN's backward from the native forward's saved rows gives cuDNN's own result.
        const OwnedTensor cross = device_tensor(gpu(), bf16, {s.rows(), s.qkv_width()});
        gpu().attention_bwd({.dqkv = cross, .dout = g_dout, .qkv = g_qkv, .out = n.out, .saved = n.saved, .shape = s, .doc_starts = Tensor()});
        expect_matches("dqkv after the native forward", download(gpu(), cross), n_d, attention_tolerance(bf16), {1e-2 * max_abs(n_d), false});
    }
}

TEST_F(CudnnDeterminism, AttentionBwd_TwoRunsAreBitwiseEqual) {
    for (const AttentionShape& s : {AttentionShape{2, 256, 4, 2, 64}, AttentionShape{1, 256, 8, 2, 128}}) {
        SCOPED_TRACE(describe(s));
        const OwnedTensor qkv = random_input(bf16, {s.rows(), s.qkv_width()}, 6600, -2, 2), dout = random_input(bf16, {s.rows(), s.out_width()}, 6601);
        const OwnedTensor g_qkv = to_device(gpu(), qkv, bf16), g_dout = to_device(gpu(), dout, bf16);
        const OwnedTensor g_out = device_tensor(gpu(), bf16, {s.rows(), s.out_width()}), g_saved = device_tensor(gpu(), f32, gpu().attention_saved_shape(s));
        gpu().attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = Tensor()});
        expect_two_runs_identical([&] {
            std::vector<OwnedTensor> g;
            g.push_back(device_tensor(gpu(), bf16, {s.rows(), s.qkv_width()}));
            gpu().attention_bwd({.dqkv = g[0], .dout = g_dout, .qkv = g_qkv, .out = g_out, .saved = g_saved, .shape = s, .doc_starts = Tensor()});
            return g;
        });
    }
}

// Where libcudnn cannot be loaded, model.attention = "auto" runs the native kernels and says
// so, and "cudnn" is refused naming the library and where to point the loader.
TEST(CudaAttentionChoice, WithoutLibcudnn_AutoRunsTheNativeKernelsAndCudnnIsRefused) {
    const char* before = std::getenv("LLMTRAIN_CUDNN_LIBRARY");
    const std::string saved = before ? before : "";
    setenv("LLMTRAIN_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
    std::unique_ptr<Backend> automatic;
    make_cuda_backend_or_skip(automatic, AttentionImpl::automatic);
    if (automatic) {
        const AttentionShape s{1, 16, 2, 2, 64};
        EXPECT_EQ(automatic->describe_attention(s, bf16).rfind("native flash kernels", 0), 0u) << automatic->describe_attention(s, bf16);
        const OwnedTensor g_qkv = to_device(*automatic, random_input(bf16, {s.rows(), s.qkv_width()}, 6700), bf16);
        const OwnedTensor g_out = device_tensor(*automatic, bf16, {s.rows(), s.out_width()}), g_saved = device_tensor(*automatic, f32, automatic->attention_saved_shape(s));
        automatic->attention_fwd({.out = g_out, .saved = g_saved, .qkv = g_qkv, .shape = s, .doc_starts = Tensor()});
        EXPECT_GT(max_abs(download(*automatic, g_out)), 0.0);
        try {
            make_cuda_backend(0, AttentionImpl::cudnn);
            ADD_FAILURE() << "model.attention = \"cudnn\" was accepted without libcudnn";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::unsupported);
            EXPECT_NE(std::string(e.what()).find("model.attention = \"cudnn\": /nonexistent/libcudnn.so.9 (cuDNN) cannot be loaded"), std::string::npos)
                << e.what();
        }
    }
    if (before) setenv("LLMTRAIN_CUDNN_LIBRARY", saved.c_str(), 1);
    else unsetenv("LLMTRAIN_CUDNN_LIBRARY");
}

// Causal self-attention with grouped-query heads on the CPU, one head at a time.
//   S = q k^T / sqrt(D), masked to first(t) <= s <= t;  P = softmax over each row of S;  out = P v,
// first(t) = 0 (causal), or the start of t's document (a document mask: doc_starts).
// saved [B, H, T, T] holds P (zeros outside the mask). Without a document boundary the loops
// run over exactly the causal range, so the result is bitwise the causal one.
// Backward, with dP = dout v^T and dS = P (dP - rowsum(P dP)):
//   dq = dS k / sqrt(D),  dk = dS^T q / sqrt(D),  dv = P^T dout,
// where dk and dv of a key/value head sum over its group of query heads. Backward runs one
// task per (batch, kv head) that walks the group's query heads in order: no two tasks write
// the same element and every sum has a fixed order, so the result is deterministic.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// Element offsets of the heads inside the packed QKV rows and the output rows.
struct AttentionLayout {
    int64_t T, H, Hkv, D;
    const int32_t* doc_starts = nullptr;  // [B*T] or none
    // The first key query t of sequence b sees.
    int64_t first_key(int64_t b, int64_t t) const { return doc_starts ? doc_starts[b * T + t] : 0; }
    int64_t qkv_row(int64_t b, int64_t t) const { return (b * T + t) * (H + 2 * Hkv) * D; }
    int64_t q(int64_t b, int64_t t, int64_t h) const { return qkv_row(b, t) + h * D; }
    int64_t k(int64_t b, int64_t t, int64_t g) const { return qkv_row(b, t) + (H + g) * D; }
    int64_t v(int64_t b, int64_t t, int64_t g) const { return qkv_row(b, t) + (H + Hkv + g) * D; }
    int64_t out(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H * D + h * D; }
    int64_t probs(int64_t b, int64_t h) const { return (b * H + h) * T * T; }
    int64_t group() const { return H / Hkv; }
    double scale() const { return 1.0 / std::sqrt(static_cast<double>(D)); }
};

// A dot product in eight interleaved partial sums, added in a fixed order at the end:
// the compiler turns the lanes into SIMD registers (a single running sum would have to be
// added element by element), and the result still does not depend on threads or runs.
template <class T>
double dot(const T* a, const T* b, int64_t n) {
    constexpr int64_t lanes = 8;
    T partial[lanes] = {};
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes)
        for (int64_t j = 0; j < lanes; ++j) partial[j] += a[i + j] * b[i + j];
    T acc = 0;
    for (; i < n; ++i) acc += a[i] * b[i];
    for (int64_t j = 0; j < lanes; ++j) acc += partial[j];
    return static_cast<double>(acc);
}

template <class T>
void attention_fwd_head(T* out, T* saved, const T* qkv, const AttentionLayout& L, int64_t b, int64_t h, std::vector<double>& scores) {
    const int64_t seq = L.T, D = L.D, g = h / L.group();
    for (int64_t t = 0; t < seq; ++t) {
        const T* q = qkv + L.q(b, t, h);
        const int64_t first = L.first_key(b, t);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t s = first; s <= t; ++s) {
            scores[static_cast<size_t>(s)] = dot(q, qkv + L.k(b, s, g), D) * L.scale();
            max_score = std::max(max_score, scores[static_cast<size_t>(s)]);
        }
        double sum = 0;
        for (int64_t s = first; s <= t; ++s) sum += (scores[static_cast<size_t>(s)] = std::exp(scores[static_cast<size_t>(s)] - max_score));
        T* p = saved + L.probs(b, h) + t * seq;
        for (int64_t s = 0; s < seq; ++s) p[s] = s >= first && s <= t ? static_cast<T>(scores[static_cast<size_t>(s)] / sum) : T(0);
        T* o = out + L.out(b, t, h);
        for (int64_t d = 0; d < D; ++d) o[d] = 0;
        for (int64_t s = first; s <= t; ++s) {
            const T* v = qkv + L.v(b, s, g);
            for (int64_t d = 0; d < D; ++d) o[d] += p[s] * v[d];
        }
    }
}

// dq of query head h; dk and dv of its kv head g accumulate (the caller zeroed them).
template <class T>
void attention_bwd_head(T* dqkv, const T* dout, const T* qkv, const T* saved, const AttentionLayout& L, int64_t b, int64_t h, std::vector<double>& dp) {
    const int64_t seq = L.T, D = L.D, g = h / L.group();
    for (int64_t t = 0; t < seq; ++t) {
        const T* p = saved + L.probs(b, h) + t * seq;
        const T* dout_t = dout + L.out(b, t, h);
        const T* q = qkv + L.q(b, t, h);
        const int64_t first = L.first_key(b, t);
        double p_dot_dp = 0;
        for (int64_t s = first; s <= t; ++s) {
            dp[static_cast<size_t>(s)] = dot(dout_t, qkv + L.v(b, s, g), D);
            p_dot_dp += static_cast<double>(p[s]) * dp[static_cast<size_t>(s)];
        }
        T* dq = dqkv + L.q(b, t, h);
        for (int64_t d = 0; d < D; ++d) dq[d] = 0;
        for (int64_t s = first; s <= t; ++s) {
            const T ds = static_cast<T>(static_cast<double>(p[s]) * (dp[static_cast<size_t>(s)] - p_dot_dp) * L.scale());
            const T* k = qkv + L.k(b, s, g);
            T* dk = dqkv + L.k(b, s, g);
            T* dv = dqkv + L.v(b, s, g);
            for (int64_t d = 0; d < D; ++d) {
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
                dv[d] += p[s] * dout_t[d];
            }
        }
    }
}

template <class T>
void attention_fwd_all(T* out, T* saved, const T* qkv, const AttentionLayout& L, int64_t batch, int threads) {
    const int64_t tasks = batch * L.H;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
        std::vector<double> scores(static_cast<size_t>(L.T));
        attention_fwd_head(out, saved, qkv, L, task / L.H, task % L.H, scores);
    }
}

template <class T>
void attention_bwd_all(T* dqkv, const T* dout, const T* qkv, const T* saved, const AttentionLayout& L, int64_t batch, int threads) {
    const int64_t tasks = batch * L.Hkv;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / L.Hkv, g = task % L.Hkv;
        for (int64_t t = 0; t < L.T; ++t) {
            T* dk = dqkv + L.k(b, t, g);
            T* dv = dqkv + L.v(b, t, g);
            for (int64_t d = 0; d < L.D; ++d) dk[d] = dv[d] = 0;
        }
        std::vector<double> dp(static_cast<size_t>(L.T));
        for (int64_t h = g * L.group(); h < (g + 1) * L.group(); ++h) attention_bwd_head(dqkv, dout, qkv, saved, L, b, h, dp);
    }
}

AttentionLayout expect_attention_shape(const char* op, const AttentionShape& s) {
    if (s.batch < 1 || s.seq_len < 1 || s.n_heads < 1 || s.n_kv_heads < 1 || s.head_dim < 1)
        fail(ErrorKind::shape, op, ": attention shape (batch ", s.batch, ", seq_len ", s.seq_len, ", n_heads ", s.n_heads, ", n_kv_heads ", s.n_kv_heads,
             ", head_dim ", s.head_dim, ") has a non-positive size");
    if (s.n_heads % s.n_kv_heads != 0)
        fail(ErrorKind::shape, op, ": n_heads ", s.n_heads, " is not a multiple of n_kv_heads ", s.n_kv_heads);
    return {s.seq_len, s.n_heads, s.n_kv_heads, s.head_dim};
}

}  // namespace

void CpuBackend::attention_fwd(const AttentionFwd& a) {
    const Tensor &out = a.out, &saved = a.saved, &qkv = a.qkv;
    const AttentionShape& shape = a.shape;
    cpu::OpTimer timer(profile_, Op::attention_fwd);
    const char* op = timer.name();
    AttentionLayout L = expect_attention_shape(op, shape);
    L.doc_starts = cpu::document_starts(op, a.doc_starts, shape.rows(), shape.seq_len);
    cpu::dispatch_float(op, "qkv", qkv, [&]<class T>() {
        const DType dt = qkv.dtype();
        cpu::expect_tensor(op, "qkv", qkv, {shape.rows(), shape.qkv_width()}, dt);
        cpu::expect_tensor(op, "out", out, {shape.rows(), shape.out_width()}, dt);
        cpu::expect_tensor(op, "saved", saved, attention_saved_shape(shape), dt);
        attention_fwd_all(out.data<T>(), saved.data<T>(), qkv.data<T>(), L, shape.batch, threads_);
    });
}

void CpuBackend::attention_bwd(const AttentionBwd& a) {
    const Tensor &dqkv = a.dqkv, &dout = a.dout, &qkv = a.qkv, &saved = a.saved;
    const AttentionShape& shape = a.shape;
    cpu::OpTimer timer(profile_, Op::attention_bwd);
    const char* op = timer.name();
    AttentionLayout L = expect_attention_shape(op, shape);
    L.doc_starts = cpu::document_starts(op, a.doc_starts, shape.rows(), shape.seq_len);
    cpu::dispatch_float(op, "qkv", qkv, [&]<class T>() {
        const DType dt = qkv.dtype();
        cpu::expect_tensor(op, "dqkv", dqkv, {shape.rows(), shape.qkv_width()}, dt);
        cpu::expect_tensor(op, "dout", dout, {shape.rows(), shape.out_width()}, dt);
        cpu::expect_tensor(op, "qkv", qkv, {shape.rows(), shape.qkv_width()}, dt);
        cpu::expect_tensor(op, "saved", saved, attention_saved_shape(shape), dt);
        attention_bwd_all(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), saved.data<T>(), L, shape.batch, threads_);
    });
}

}  // namespace llmtrain

// Context parallelism's attention blocks on the CPU (backend.h, AttentionBlockFwd): the
// queries of this rank's rows against one block of keys and values, positions explicit.
// Forward, for query t of head h and the keys s it sees in the block (mask: q_first <=
// kv_positions[s] <= q_positions[t]), with S_s = q . k_s / sqrt(D):
//   m = max_s S_s,  l = sum_s exp(S_s - m),  lse_b = m + log l,  o_b = sum_s exp(S_s - m) v_s / l
// then merged into the running (acc, lse) by their log-sum-exps. Backward recomputes
// P_s = exp(S_s - lse) from the merged lse, so every block's share is exact:
//   delta = dout . out,  dS_s = P_s (dout . v_s - delta),
//   dq += sum_s dS_s k_s / sqrt(D),  dk_s += dS_s q / sqrt(D),  dv_s += P_s dout.
// One task per (batch, kv head) in backward walks its query heads in order: no two tasks
// write one element and every sum has a fixed order (deterministic for any thread count).
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// Element offsets of the heads inside the packed rows of qkv, kv, out and lse.
struct BlockLayout {
    int64_t Tq, Tk, H, Hkv, D;
    const int32_t* q_pos = nullptr;   // [Tq]
    const int32_t* kv_pos = nullptr;  // [Tk]
    const int32_t* q_first = nullptr;  // [B*Tq] or none
    int64_t q(int64_t b, int64_t t, int64_t h) const { return (b * Tq + t) * (H + 2 * Hkv) * D + h * D; }
    int64_t k(int64_t b, int64_t s, int64_t g) const { return (b * Tk + s) * 2 * Hkv * D + g * D; }
    int64_t v(int64_t b, int64_t s, int64_t g) const { return (b * Tk + s) * 2 * Hkv * D + (Hkv + g) * D; }
    int64_t out(int64_t b, int64_t t, int64_t h) const { return (b * Tq + t) * H * D + h * D; }
    int64_t lse(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * Tq + t; }
    int64_t group() const { return H / Hkv; }
    double scale() const { return 1.0 / std::sqrt(static_cast<double>(D)); }
    bool sees(int64_t b, int64_t t, int64_t s) const {
        const int32_t key = kv_pos[s];
        return key <= q_pos[t] && key >= (q_first ? q_first[b * Tq + t] : 0);
    }
};

template <class T>
double dot(const T* a, const T* b, int64_t n) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return acc;
}

// One query row's block result merged into its running (acc, lse).
template <class T>
void block_fwd_row(T* acc, T* lse, const T* qkv, const T* kv, const BlockLayout& L, int64_t b, int64_t h, int64_t t, bool first,
                   std::vector<double>& scores, std::vector<double>& o) {
    const int64_t g = h / L.group();
    const T* q = qkv + L.q(b, t, h);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < L.Tk; ++s) {
        scores[static_cast<size_t>(s)] = L.sees(b, t, s) ? dot(q, kv + L.k(b, s, g), L.D) * L.scale() : -std::numeric_limits<double>::infinity();
        m = std::max(m, scores[static_cast<size_t>(s)]);
    }
    T* a = acc + L.out(b, t, h);
    T& row_lse = lse[L.lse(b, h, t)];
    const double previous = first ? -std::numeric_limits<double>::infinity() : static_cast<double>(row_lse);
    if (first)
        for (int64_t d = 0; d < L.D; ++d) a[d] = 0;
    if (m == -std::numeric_limits<double>::infinity()) {  // the block holds no key this query sees
        row_lse = static_cast<T>(previous);
        return;
    }
    std::fill(o.begin(), o.end(), 0.0);
    double l = 0;
    for (int64_t s = 0; s < L.Tk; ++s) {
        if (scores[static_cast<size_t>(s)] == -std::numeric_limits<double>::infinity()) continue;
        const double p = std::exp(scores[static_cast<size_t>(s)] - m);
        l += p;
        const T* v = kv + L.v(b, s, g);
        for (int64_t d = 0; d < L.D; ++d) o[static_cast<size_t>(d)] += p * static_cast<double>(v[d]);
    }
    const double block_lse = m + std::log(l);
    const double merged = previous == -std::numeric_limits<double>::infinity()
                              ? block_lse
                              : std::max(previous, block_lse) + std::log1p(std::exp(-std::abs(previous - block_lse)));
    const double keep = previous == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(previous - merged);
    const double add = std::exp(block_lse - merged) / l;
    for (int64_t d = 0; d < L.D; ++d) a[d] = static_cast<T>(static_cast<double>(a[d]) * keep + o[static_cast<size_t>(d)] * add);
    row_lse = static_cast<T>(merged);
}

template <class T>
void block_fwd_all(T* acc, T* lse, const T* qkv, const T* kv, const BlockLayout& L, int64_t batch, bool first, int threads) {
    const int64_t tasks = batch * L.H;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
        std::vector<double> scores(static_cast<size_t>(L.Tk)), o(static_cast<size_t>(L.D));
        for (int64_t t = 0; t < L.Tq; ++t) block_fwd_row(acc, lse, qkv, kv, L, task / L.H, task % L.H, t, first, scores, o);
    }
}

template <class T>
void block_bwd_all(T* dq, T* dkv, const T* dout, const T* out, const T* lse, const T* qkv, const T* kv, const BlockLayout& L, int64_t batch, int threads) {
    const int64_t tasks = batch * L.Hkv;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / L.Hkv, g = task % L.Hkv;
        for (int64_t h = g * L.group(); h < (g + 1) * L.group(); ++h)
            for (int64_t t = 0; t < L.Tq; ++t) {
                const T* q = qkv + L.q(b, t, h);
                const T* dout_t = dout + L.out(b, t, h);
                const double row_lse = static_cast<double>(lse[L.lse(b, h, t)]);
                if (row_lse == -std::numeric_limits<double>::infinity()) continue;
                const double delta = dot(dout_t, out + L.out(b, t, h), L.D);
                T* dq_t = dq + L.out(b, t, h);
                for (int64_t s = 0; s < L.Tk; ++s) {
                    if (!L.sees(b, t, s)) continue;
                    const T* k = kv + L.k(b, s, g);
                    const T* v = kv + L.v(b, s, g);
                    const double p = std::exp(dot(q, k, L.D) * L.scale() - row_lse);
                    const double ds = p * (dot(dout_t, v, L.D) - delta) * L.scale();
                    T* dk = dkv + L.k(b, s, g);
                    T* dv = dkv + L.v(b, s, g);
                    for (int64_t d = 0; d < L.D; ++d) {
                        dq_t[d] = static_cast<T>(static_cast<double>(dq_t[d]) + ds * static_cast<double>(k[d]));
                        dk[d] = static_cast<T>(static_cast<double>(dk[d]) + ds * static_cast<double>(q[d]));
                        dv[d] = static_cast<T>(static_cast<double>(dv[d]) + p * static_cast<double>(dout_t[d]));
                    }
                }
            }
    }
}

template <class Args>
BlockLayout expect_block(const char* op, const Args& a) {
    const AttentionShape& s = a.shape;
    if (s.batch < 1 || s.seq_len < 1 || a.kv_len < 1 || s.n_heads < 1 || s.n_kv_heads < 1 || s.head_dim < 1 || s.n_heads % s.n_kv_heads != 0)
        fail(ErrorKind::shape, op, ": block shape (batch ", s.batch, ", query rows ", s.seq_len, ", key rows ", a.kv_len, ", n_heads ", s.n_heads,
             ", n_kv_heads ", s.n_kv_heads, ", head_dim ", s.head_dim, ") is not positive with n_heads a multiple of n_kv_heads");
    cpu::expect_tensor(op, "q_positions", a.q_positions, {s.seq_len}, DType::i32);
    cpu::expect_tensor(op, "kv_positions", a.kv_positions, {a.kv_len}, DType::i32);
    if (!a.q_first.empty()) cpu::expect_tensor(op, "q_first", a.q_first, {s.rows()}, DType::i32);
    return {s.seq_len, a.kv_len, s.n_heads, s.n_kv_heads, s.head_dim, a.q_positions.template data<int32_t>(), a.kv_positions.template data<int32_t>(),
            a.q_first.empty() ? nullptr : a.q_first.template data<int32_t>()};
}

}  // namespace

void CpuBackend::attention_block_fwd(const AttentionBlockFwd& a) {
    cpu::OpTimer timer(profile_, Op::attention_block_fwd);
    const char* op = timer.name();
    const BlockLayout L = expect_block(op, a);
    const AttentionShape& s = a.shape;
    cpu::dispatch_float(op, "qkv", a.qkv, [&]<class T>() {
        const DType dt = a.qkv.dtype();
        cpu::expect_tensor(op, "qkv", a.qkv, {s.rows(), s.qkv_width()}, dt);
        cpu::expect_tensor(op, "kv", a.kv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, dt);
        cpu::expect_tensor(op, "acc", a.acc, {s.rows(), s.out_width()}, statistics_dtype(dt));
        cpu::expect_tensor(op, "lse", a.lse, {s.batch, s.n_heads, s.seq_len}, statistics_dtype(dt));
        block_fwd_all(a.acc.data<T>(), a.lse.data<T>(), a.qkv.data<T>(), a.kv.data<T>(), L, s.batch, a.first, threads_);
    });
}

void CpuBackend::attention_block_bwd(const AttentionBlockBwd& a) {
    cpu::OpTimer timer(profile_, Op::attention_block_bwd);
    const char* op = timer.name();
    const BlockLayout L = expect_block(op, a);
    const AttentionShape& s = a.shape;
    cpu::dispatch_float(op, "qkv", a.qkv, [&]<class T>() {
        const DType dt = a.qkv.dtype();
        cpu::expect_tensor(op, "qkv", a.qkv, {s.rows(), s.qkv_width()}, dt);
        cpu::expect_tensor(op, "kv", a.kv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, dt);
        cpu::expect_tensor(op, "dout", a.dout, {s.rows(), s.out_width()}, dt);
        cpu::expect_tensor(op, "out", a.out, {s.rows(), s.out_width()}, dt);
        cpu::expect_tensor(op, "lse", a.lse, {s.batch, s.n_heads, s.seq_len}, statistics_dtype(dt));
        cpu::expect_tensor(op, "dq", a.dq, {s.rows(), s.out_width()}, statistics_dtype(dt));
        cpu::expect_tensor(op, "dkv", a.dkv, {s.batch * a.kv_len, 2 * s.n_kv_heads * s.head_dim}, statistics_dtype(dt));
        block_bwd_all(a.dq.data<T>(), a.dkv.data<T>(), a.dout.data<T>(), a.out.data<T>(), a.lse.data<T>(), a.qkv.data<T>(), a.kv.data<T>(), L, s.batch,
                      threads_);
    });
}

namespace {
double read_float(const Tensor& t, int64_t i) {
    switch (t.dtype()) {
        case DType::f32: return static_cast<const float*>(t.raw())[i];
        case DType::f64: return static_cast<const double*>(t.raw())[i];
        default: fail(ErrorKind::shape, "copy_columns: src has dtype ", dtype_name(t.dtype()), ", expected f32 or f64");
    }
}
void write_float(const Tensor& t, int64_t i, double value) {
    switch (t.dtype()) {
        case DType::f32: static_cast<float*>(t.raw())[i] = static_cast<float>(value); return;
        case DType::f64: static_cast<double*>(t.raw())[i] = value; return;
        default: fail(ErrorKind::shape, "copy_columns: dst has dtype ", dtype_name(t.dtype()), ", expected f32 or f64");
    }
}
}  // namespace

void CpuBackend::copy_columns(const CopyColumns& a) {
    cpu::OpTimer timer(profile_, Op::copy_columns);
    const char* op = timer.name();
    cpu::expect_rank(op, "dst", a.dst, 2);
    cpu::expect_rank(op, "src", a.src, 2);
    const int64_t N = a.dst.dim(0);
    if (a.src.dim(0) != N || a.cols < 0 || a.dst_col < 0 || a.src_col < 0 || a.dst_col + a.cols > a.dst.dim(1) || a.src_col + a.cols > a.src.dim(1))
        fail(ErrorKind::shape, op, ": columns [", a.src_col, ", ", a.src_col + a.cols, ") of src ", a.src.shape().str(), " into [", a.dst_col, ", ",
             a.dst_col + a.cols, ") of dst ", a.dst.shape().str(), " do not fit");
    const int64_t dst_width = a.dst.dim(1), src_width = a.src.dim(1);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < a.cols; ++c) write_float(a.dst, n * dst_width + a.dst_col + c, read_float(a.src, n * src_width + a.src_col + c));
}

}  // namespace llmtrain

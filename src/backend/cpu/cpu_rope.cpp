// Rotary position embedding on the CPU, in place. For the first n_heads heads of row n
// (position pos = n % seq_len, less its document's start with doc_starts, or explicit positions[n]) and each pair (i, i + D/2), with c = cos, s = sin of the
// angle pos * theta^(-2i/D) from the table:
//   forward:  x_i' = x_i c - x_{i+D/2} s,  x_{i+D/2}' = x_{i+D/2} c + x_i s
//   backward: the transposed (inverse) rotation, the same with s negated.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// sign = +1 rotates forward, -1 applies the inverse rotation.
template <class T>
void rope_rows(T* x, const T* table, cpu::RowPositions position, int64_t rows, int64_t width, int64_t n_heads, int64_t head_dim, T sign, int threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const int64_t pos = position(n);
        const T* cos_row = table + pos * head_dim;
        const T* sin_row = cos_row + half;
        for (int64_t h = 0; h < n_heads; ++h) {
            T* x0 = x + n * width + h * head_dim;
            T* x1 = x0 + half;
            for (int64_t i = 0; i < half; ++i) {
                const T c = cos_row[i], s = sign * sin_row[i];
                const T a = x0[i], b = x1[i];
                x0[i] = a * c - b * s;
                x1[i] = b * c + a * s;
            }
        }
    }
}

void rope(OpProfile& profile, Op op_id, const Tensor& x, const Tensor& table, int64_t seq_len, int64_t n_heads, int64_t head_dim, const Tensor& doc_starts,
          const Tensor& positions, int threads) {
    cpu::OpTimer timer(profile, op_id);
    const char* op = timer.name();
    const bool forward = op_id == Op::rope_fwd;
    const char* x_name = forward ? "x" : "dx";
    cpu::expect_rank(op, x_name, x, 2);
    cpu::expect_rank(op, "table", table, 2);
    if (head_dim < 2 || head_dim % 2 != 0) fail(ErrorKind::shape, op, ": head_dim ", head_dim, " must be even and positive");
    if (n_heads < 0 || n_heads * head_dim > x.dim(1))
        fail(ErrorKind::shape, op, ": ", n_heads, " heads of ", head_dim, " do not fit in the ", x.dim(1), " columns of ", x_name);
    if (seq_len < 1 || table.dim(0) < seq_len)
        fail(ErrorKind::shape, op, ": seq_len ", seq_len, " must be positive and at most the table's ", table.dim(0), " positions");
    cpu::dispatch_float(op, x_name, x, [&]<class T>() {
        cpu::expect_tensor(op, "table", table, {table.dim(0), head_dim}, x.dtype());
        const cpu::RowPositions position = cpu::row_positions(op, doc_starts, positions, x.dim(0), seq_len, table.dim(0));
        rope_rows(x.data<T>(), table.data<T>(), position, x.dim(0), x.dim(1), n_heads, head_dim, forward ? T(1) : T(-1), threads);
    });
}

}  // namespace

void CpuBackend::rope_fwd(const Rope& a) { rope(profile_, Op::rope_fwd, a.x, a.table, a.seq_len, a.n_heads, a.head_dim, a.doc_starts, a.positions, threads_); }

void CpuBackend::rope_bwd(const Rope& a) { rope(profile_, Op::rope_bwd, a.x, a.table, a.seq_len, a.n_heads, a.head_dim, a.doc_starts, a.positions, threads_); }

}  // namespace llmtrain

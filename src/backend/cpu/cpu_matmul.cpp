// Linear layers on the CPU through BLAS (row-major, weights [OC, IC] as torch.nn.Linear):
//   forward:  out = x w^T + bias
//   backward: dx = dout w,  dw += dout^T x,  dbias += column sums of dout
// dx, dw and dbias may each be empty (not wanted). The bias gradient reduces over rows, so it runs over column blocks (deterministic).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// A row-major operand of a GEMM: its first element and the distance between its rows.
template <class T>
struct GemmOperand {
    const T* data;
    int64_t ld;
    bool trans;
};

// C[M, N] = op(A)[M, K] op(B)[K, N] + beta C, one single-threaded BLAS call.
template <class T>
void gemm_block(GemmOperand<T> a, GemmOperand<T> b, int64_t M, int64_t N, int64_t K, T beta, T* C, int64_t ldc) {
    const auto ta = a.trans ? CblasTrans : CblasNoTrans, tb = b.trans ? CblasTrans : CblasNoTrans;
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    const auto ld = [](int64_t v) { return static_cast<int>(std::max<int64_t>(1, v)); };
    if constexpr (std::is_same_v<T, float>) cblas_sgemm(CblasRowMajor, ta, tb, i(M), i(N), i(K), 1.0f, a.data, ld(a.ld), b.data, ld(b.ld), beta, C, ld(ldc));
    else cblas_dgemm(CblasRowMajor, ta, tb, i(M), i(N), i(K), 1.0, a.data, ld(a.ld), b.data, ld(b.ld), beta, C, ld(ldc));
}

// C = op(A) op(B) + beta C, row-major; op(A) is [M, K], op(B) is [K, N].
//
// One thread pool: BLAS runs single-threaded (CpuBackend's constructor) and the GEMM is
// cut into `threads` blocks of C's rows (or of its columns when C has few rows), one per
// OpenMP thread. With BLAS's own threads as well, the two pools alternate op by op and the
// idle one's threads spin-wait for work while the other computes: on a machine with as many
// cores as threads, the working pool then gets about half of each core (measured: 2 threads
// slower than 1 on 2 cores). Every element of C is still summed over all of K by one call.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T beta, T* C, int threads) {
    if (M == 0 || N == 0) return;
    for (int64_t dim : {M, N, K})
        if (dim > INT_MAX) fail(ErrorKind::unsupported, "matmul: dimension ", dim, " exceeds the BLAS integer range");
    const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
    constexpr int64_t min_block = 16;  // rows or columns per call below which splitting costs more than it gains
    const bool by_rows = M >= N || M >= min_block * threads;
    const int64_t extent = by_rows ? M : N;
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(threads, extent / min_block));
#pragma omp parallel for num_threads(static_cast<int>(blocks)) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t begin = extent * block / blocks, count = extent * (block + 1) / blocks - begin;
        if (by_rows) {
            // Rows [begin, begin + count) of op(A): rows of A, or columns of A^T.
            const T* a = trans_a ? A + begin : A + begin * lda;
            gemm_block<T>({a, lda, trans_a}, {B, ldb, trans_b}, count, N, K, beta, C + begin * N, N);
        } else {
            // Columns [begin, begin + count) of op(B): columns of B, or rows of B^T.
            const T* b = trans_b ? B + begin * ldb : B + begin;
            gemm_block<T>({A, lda, trans_a}, {b, ldb, trans_b}, M, count, K, beta, C + begin, N);
        }
    }
}

// BLAS sums a row of C in an order that can depend on the number of rows of the call (its
// kernels for few rows differ; measured with OpenBLAS), but not on where the operands lie.
// Given a row block R (keeps_row_blocks), the forward matmul calls it on blocks of R rows
// from row 0, so that any run of whole blocks is bitwise the same rows of a larger product,
// whatever the thread count. Each call re-packs w: blocks of 64 rows made the 50M model's
// GEMMs 3-40% slower (K = 512 to 2048), of 256 rows 0-8%; without R, the plain GEMM.
template <class T>
void gemm_row_blocks(int64_t R, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T beta, T* C, int threads) {
    if (R <= 0) return gemm<T>(false, true, M, N, K, A, B, beta, C, threads);
    for (int64_t dim : {M, N, K})
        if (dim > INT_MAX) fail(ErrorKind::unsupported, "matmul: dimension ", dim, " exceeds the BLAS integer range");
    const int64_t blocks = (M + R - 1) / R;
#pragma omp parallel for num_threads(static_cast<int>(std::min<int64_t>(threads, blocks))) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t begin = block * R, count = std::min(R, M - begin);
        gemm_block<T>({A + begin * K, K, false}, {B, K, true}, count, N, K, beta, C + begin * N, N);
    }
}

template <class T>
void broadcast_rows(T* out, const T* bias, int64_t rows, int64_t cols, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n)
        for (int64_t c = 0; c < cols; ++c) out[n * cols + c] = bias[c];
}

template <class T>
void add_column_sums(T* dbias, const T* dout, int64_t rows, int64_t cols, int threads) {
    const int64_t blocks = cpu::column_block_count(cols);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t c0 = block * cpu::column_block, c1 = cpu::column_block_end(block, cols);
        double acc[cpu::column_block] = {};
        for (int64_t n = 0; n < rows; ++n)
            for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(dout[n * cols + c]);
        for (int64_t c = c0; c < c1; ++c) dbias[c] += static_cast<T>(acc[c - c0]);
    }
}

}  // namespace

void CpuBackend::matmul_fwd(const MatmulFwd& a) {
    const Tensor &out = a.out, &x = a.x, &w = a.w, &bias = a.bias;
    cpu::OpTimer timer(profile_, Op::matmul_fwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "x", x, 2);
    cpu::expect_rank(op, "w", w, 2);
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const DType dt = x.dtype();
        cpu::expect_tensor(op, "w", w, {OC, IC}, dt);
        cpu::expect_tensor(op, "out", out, {N, OC}, dt);
        if (!bias.empty()) cpu::expect_tensor(op, "bias", bias, {OC}, dt);
        T beta = 0;
        if (!bias.empty()) {
            broadcast_rows(out.data<T>(), bias.data<T>(), N, OC, threads_);
            beta = 1;
        }
        gemm_row_blocks<T>(a.row_block, N, OC, IC, x.data<T>(), w.data<T>(), beta, out.data<T>(), threads_);
    });
}

void CpuBackend::matmul_bwd(const MatmulBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &dbias = a.dbias, &dout = a.dout, &x = a.x, &w = a.w;
    cpu::OpTimer timer(profile_, Op::matmul_bwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "x", x, 2);
    cpu::expect_rank(op, "w", w, 2);
    const int64_t N = x.dim(0), IC = x.dim(1), OC = w.dim(0);
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const DType dt = x.dtype();
        cpu::expect_tensor(op, "w", w, {OC, IC}, dt);
        cpu::expect_tensor(op, "dout", dout, {N, OC}, dt);
        if (!dx.empty()) cpu::expect_tensor(op, "dx", dx, {N, IC}, dt);
        if (!dw.empty()) cpu::expect_tensor(op, "dw", dw, {OC, IC}, dt);
        if (!dbias.empty()) cpu::expect_tensor(op, "dbias", dbias, {OC}, dt);
        if (!dx.empty()) gemm<T>(false, false, N, IC, OC, dout.data<T>(), w.data<T>(), T(0), dx.data<T>(), threads_);
        if (!dw.empty()) gemm<T>(true, false, OC, IC, N, dout.data<T>(), x.data<T>(), T(1), dw.data<T>(), threads_);
        if (!dbias.empty()) add_column_sums(dbias.data<T>(), dout.data<T>(), N, OC, threads_);
    });
}

}  // namespace llmtrain

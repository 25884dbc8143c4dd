// Linear layers on the CPU through BLAS (row-major, weights [OC, IC] as torch.nn.Linear):
//   forward:  out = x w^T + bias
//   backward: dx = dout w,  dw += dout^T x,  dbias += column sums of dout
// dx, dw and dbias may each be empty (not wanted). The bias gradient reduces over rows, so it runs over column blocks (deterministic).
#include <cblas.h>

#include <climits>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// C = alpha op(A) op(B) + beta C, row-major; op(A) is [M, K], op(B) is [K, N].
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T beta, T* C) {
    if (M == 0 || N == 0) return;
    for (int64_t dim : {M, N, K})
        if (dim > INT_MAX) fail(ErrorKind::unsupported, "matmul: dimension ", dim, " exceeds the BLAS integer range");
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
    const int lda = std::max(1, trans_a ? m : k), ldb = std::max(1, trans_b ? k : n), ldc = n;
    if constexpr (std::is_same_v<T, float>) cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, A, lda, B, ldb, beta, C, ldc);
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

void CpuBackend::matmul_fwd(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
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
        gemm<T>(false, true, N, OC, IC, x.data<T>(), w.data<T>(), beta, out.data<T>());
    });
}

void CpuBackend::matmul_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dout, const Tensor& x, const Tensor& w) {
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
        if (!dx.empty()) gemm<T>(false, false, N, IC, OC, dout.data<T>(), w.data<T>(), T(0), dx.data<T>());
        if (!dw.empty()) gemm<T>(true, false, OC, IC, N, dout.data<T>(), x.data<T>(), T(1), dw.data<T>());
        if (!dbias.empty()) add_column_sums(dbias.data<T>(), dout.data<T>(), N, OC, threads_);
    });
}

}  // namespace llmtrain

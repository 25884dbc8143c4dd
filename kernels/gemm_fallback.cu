// A plain GEMM for what cuBLASLt cannot take: a shape its heuristic has no algorithm for, a
// dimension of 1 (sampling a one-token prompt), a GELU aux matrix its epilogues refuse.
// Same semantics as the cuBLASLt call it replaces (column-major, transposes, leading
// dimensions, beta, epilogues):
//   P[i, j] = sum_p op(A)[i, p] op(B)[p, j]                      (fp32, p in order)
//   none / bias:   D = P + beta D (+ bias[i])
//   gelu_aux:      aux = P + beta D (+ bias[i]),  D = gelu(aux)
//   dgelu:         D = (P + beta D) * gelu'(aux);  bias_grad[i] += sum_j D[i, j] (if wanted)
// with op(A)[i, p] = A[p + i lda] when transposed, A[i + p lda] otherwise (B likewise), and
// gelu the tanh approximation of elementwise.cu. One thread per element of D, a grid-stride
// loop: slow, but these shapes are rare and small, and every sum has a fixed order.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int block_threads = 256;
constexpr int64_t max_blocks = 1 << 16;
constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float gelu_c = 0.044715f;

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.f + tanhf(gelu_k * (x + gelu_c * x * x * x))); }

__device__ __forceinline__ float gelu_grad(float x) {
    const float th = tanhf(gelu_k * (x + gelu_c * x * x * x));
    return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * gelu_k * (1.f + 3.f * gelu_c * x * x);
}

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
template <class T>
__device__ __forceinline__ float load(const T* p, int64_t i) { return to_float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
template <class T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) { p[i] = from_float<T>(v); }

// AB: the inputs' type; DT: D's (AB or float). Bias and aux are of type AB (D's 16-bit type).
template <class AB, class DT>
__global__ void gemm_fallback_kernel(FallbackGemm g) {
    const AB* a = static_cast<const AB*>(g.a);
    const AB* b = static_cast<const AB*>(g.b);
    DT* d = static_cast<DT*>(g.d);
    AB* aux = static_cast<AB*>(g.aux);
    const int64_t total = g.m * g.n, stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total; e += stride) {
        const int64_t i = e % g.m, j = e / g.m;
        float acc = 0.f;
        for (int64_t p = 0; p < g.k; ++p) {
            const float x = load(a, g.transpose_a ? p + i * g.lda : i + p * g.lda);
            const float y = load(b, g.transpose_b ? j + p * g.ldb : p + j * g.ldb);
            acc = fmaf(x, y, acc);
        }
        const int64_t at = i + j * g.ldd;
        if (g.accumulate) acc += load(d, at);
        if (g.bias) acc += load(static_cast<const AB*>(g.bias), i);
        if (g.gelu == FallbackGemm::Gelu::forward_aux) {
            store(aux, i + j * g.ld_aux, acc);
            acc = gelu(acc);
        } else if (g.gelu == FallbackGemm::Gelu::backward) {
            acc *= gelu_grad(load(aux, i + j * g.ld_aux));
        }
        store(d, at, acc);
    }
}

// bias_grad[i] += sum_j D[i, j] as stored, one thread per row i, j in order.
template <class DT>
__global__ void gemm_fallback_bias_grad_kernel(float* bias_grad, const DT* d, int64_t m, int64_t n, int64_t ldd) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < m; i += stride) {
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) sum += load(d, i + j * ldd);
        bias_grad[i] += sum;
    }
}

int grid_for(int64_t work) { return static_cast<int>(std::clamp<int64_t>(ceil_div(work, int64_t{block_threads}), 1, max_blocks)); }

}  // namespace

void launch_gemm_fallback(const FallbackGemm& g, cudaStream_t stream) {
    if (g.m <= 0 || g.n <= 0) return;
    dispatch_half(g.ab_type, [&]<class T>() {
        const auto run = [&]<class DT>() {
            gemm_fallback_kernel<T, DT><<<grid_for(g.m * g.n), block_threads, 0, stream>>>(g);
            check_launch("gemm_fallback");
            if (g.bias_grad) {
                gemm_fallback_bias_grad_kernel<DT><<<grid_for(g.m), block_threads, 0, stream>>>(g.bias_grad, static_cast<const DT*>(g.d), g.m, g.n, g.ldd);
                check_launch("gemm_fallback bias_grad");
            }
        };
        if (g.d_f32) run.template operator()<float>();
        else run.template operator()<T>();
    });
}

}  // namespace llmtrain::kernels

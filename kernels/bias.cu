// Bias gradient of a linear layer: dbias[c] += sum_n dout[n, c] (column sums, fp32), with the
// column sums of half_types.cuh. Atomics would make the sums depend on timing, so a first
// kernel writes per-(row chunk, column) partial sums to scratch, each column summed by a fixed
// thread over a fixed set of rows and then across the block's row groups in order, and a
// second kernel adds the chunks in order into dbias. Reads are coalesced: a warp covers 32*VEC
// adjacent columns of a row.
#include <algorithm>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

// Row n's terms for column_partials_kernel: dout[n, c..c+VEC), at element offset i = n * C + c.
template <class T, int VEC>
struct BiasRows {
    const T* dout;

    __device__ __forceinline__ void add(float (&acc)[1][VEC], int64_t, int64_t i) const { add_halves(acc[0], dout + i); }
};

__global__ void accumulate_kernel(float* acc, const float* x, int64_t n) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) acc[i] += x[i];
}

template <class T, int VEC>
void launch_bias_grad_typed(float* dbias, const void* dout, int64_t N, int64_t C, float* partial, cudaStream_t stream) {
    launch_column_sums<VEC, 1>({dbias}, partial, BiasRows<T, VEC>{static_cast<const T*>(dout)}, N, C, "bias_grad partials", "bias_grad add partials",
                               stream);
}

}  // namespace

size_t bias_grad_scratch_bytes(int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return 0;
    return static_cast<size_t>(column_chunk_count(N, C) * C) * sizeof(float);
}

void launch_bias_grad(Half t, float* dbias, const void* dout, int64_t N, int64_t C, void* scratch, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    // 8 columns per thread (16-byte loads) when every row allows it, else 1.
    const bool vec = C % 8 == 0 && aligned16(dout);
    float* partial = static_cast<float*>(scratch);
    dispatch_half(t, [&]<class T>() {
        if (vec) launch_bias_grad_typed<T, 8>(dbias, dout, N, C, partial, stream);
        else launch_bias_grad_typed<T, 1>(dbias, dout, N, C, partial, stream);
    });
}

void launch_accumulate(float* acc, const float* x, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    constexpr int threads = 256;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, int64_t{threads}), int64_t{1} << 16));
    accumulate_kernel<<<blocks, threads, 0, stream>>>(acc, x, n);
    check_launch("accumulate");
}

}  // namespace llmtrain::kernels

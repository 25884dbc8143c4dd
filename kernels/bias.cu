// Bias gradient of a linear layer: dbias[c] += sum_n dout[n, c] (column sums, fp32), with the
// column sums of half_types.cuh. Atomics would make the sums depend on timing, so a first
// kernel writes per-(row chunk, column) partial sums to scratch, each column summed by a fixed
// thread over a fixed set of rows and then across the block's row groups in order, and a
// second kernel adds the chunks in order into dbias. Reads are coalesced: a warp covers 32*VEC
// adjacent columns of a row.
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"

namespace llmtrain::kernels {

namespace {

// Row n's terms for column_partials_kernel: dout[n, c..c+VEC), at element offset i = n * C + c.
template <class T, int VEC>
struct BiasRows {
    const T* dout;

    __device__ __forceinline__ void add(float (&acc)[1][VEC], int64_t, int64_t i) const { add_halves(acc[0], dout + i); }
};

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

}  // namespace llmtrain::kernels

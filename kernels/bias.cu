// Bias gradient of a linear layer: dbias[c] += sum_n dout[n, c] (column sums, fp32).
// Atomics would make the sums depend on timing, so a first kernel writes per-(row chunk,
// column) partial sums to scratch, each column summed by a fixed thread over a fixed set of
// rows and then across the block's row groups in order, and a second kernel adds the chunks
// in order into dbias. Reads are coalesced: a warp covers 32*VEC adjacent columns of a row.
#include <algorithm>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int kThreads = 256;
// Blocks of 32 column threads x kRowGroups row groups; the rows are split into
// row_chunk_count(N, C) chunks, about kTargetBlocks blocks in all.
constexpr int kRowGroups = 8;
constexpr int64_t kTargetBlocks = 512;
constexpr int64_t kMinRowsPerChunk = 64;

template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <int VEC, class T>
__device__ __forceinline__ void add_halves(float (&f)[VEC], const T* p) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] += to_float(pk.v[i]);
}

// Block (32, kRowGroups) over columns [blockIdx.x*32*VEC, +32*VEC) and the rows of chunk
// blockIdx.y; thread (tx, ty) sums rows ty, ty + kRowGroups, ... of the chunk, then the row
// groups are added in order. partial [chunks, C]; the result does not depend on VEC.
template <class T, int VEC>
__global__ void __launch_bounds__(32 * kRowGroups) bias_partials_kernel(float* partial, const T* dout, int64_t N, int64_t C, int64_t rows_per_chunk) {
    __shared__ float shared[kRowGroups * VEC * 32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (int64_t{blockIdx.x} * 32 + tx) * VEC;
    const int64_t r0 = int64_t{blockIdx.y} * rows_per_chunk, r1 = std::min(N, r0 + rows_per_chunk);

    float acc[VEC] = {};
    if (c0 < C)
        for (int64_t n = r0 + ty; n < r1; n += kRowGroups) add_halves(acc, dout + n * C + c0);
#pragma unroll
    for (int i = 0; i < VEC; ++i) shared[(ty * VEC + i) * 32 + tx] = acc[i];
    __syncthreads();  // reached by every thread of the block
    if (ty != 0 || c0 >= C) return;
    float* out = partial + int64_t{blockIdx.y} * C + c0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        float sum = 0.0f;
        for (int g = 0; g < kRowGroups; ++g) sum += shared[(g * VEC + i) * 32 + tx];
        out[i] = sum;
    }
}

// dbias[c] += sum over chunks k = 0, 1, ... of partial[k, c], one thread per column.
__global__ void add_partials_kernel(float* dbias, const float* partial, int64_t chunks, int64_t C) {
    const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * C + c];
    dbias[c] += sum;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A function of N and C only, so the sums' order does not depend on the pointers or the device.
int64_t row_chunk_count(int64_t N, int64_t C) {
    const int64_t column_tiles = ceil_div(C, int64_t{32 * 8});
    const int64_t by_blocks = std::max<int64_t>(1, kTargetBlocks / column_tiles);
    return std::max<int64_t>(1, std::min(ceil_div(N, kMinRowsPerChunk), by_blocks));
}

template <class T, int VEC>
void launch_bias_grad_typed(float* dbias, const void* dout, int64_t N, int64_t C, float* partial, cudaStream_t stream) {
    const int64_t chunks = row_chunk_count(N, C);
    const dim3 grid(static_cast<unsigned>(ceil_div(C, int64_t{32 * VEC})), static_cast<unsigned>(chunks));
    bias_partials_kernel<T, VEC><<<grid, dim3(32, kRowGroups), 0, stream>>>(partial, static_cast<const T*>(dout), N, C, ceil_div(N, chunks));
    check_launch("bias_grad partials");
    add_partials_kernel<<<static_cast<unsigned>(ceil_div(C, int64_t{kThreads})), kThreads, 0, stream>>>(dbias, partial, chunks, C);
    check_launch("bias_grad add partials");
}

}  // namespace

size_t bias_grad_scratch_bytes(int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return 0;
    return static_cast<size_t>(row_chunk_count(N, C) * C) * sizeof(float);
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

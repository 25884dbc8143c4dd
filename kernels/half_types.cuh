// Device helpers shared by the kernel files: conversions between the 16-bit element types
// and fp32 (every sum is fp32; values are rounded to the element type once, on store), the
// host-side dispatch from the runtime `Half` tag to a template instantiation, ceil_div, vector
// packs (VEC elements moved as one access), and the deterministic column sums over rows behind
// the bias and norm parameter gradients.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Round to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}

// Calls fn.template operator()<__nv_bfloat16>() or <__half>() for the runtime type tag.
template <class Fn>
inline void dispatch_half(Half t, Fn&& fn) {
    if (t == Half::bf16) {
        fn.template operator()<__nv_bfloat16>();
    } else {
        fn.template operator()<__half>();
    }
}

// ceil(a / b) for positive integers; the result has the common type of a and b.
template <class A, class B>
__host__ __device__ constexpr auto ceil_div(A a, B b) {
    return (a + b - 1) / b;
}

// ---- Vector packs ----------------------------------------------------------------------------

// VEC consecutive elements, read or written as one access of sizeof(T) * VEC bytes (16 for
// 8 16-bit values); the launchers check the alignment before they choose VEC > 1.
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// f[i] = p[i] in fp32, i < VEC, from one pack.
template <int VEC, class T>
__device__ __forceinline__ void load_halves(float (&f)[VEC], const T* p) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = to_float(pk.v[i]);
}

// f[i] += p[i], i < VEC, from one pack.
template <int VEC, class T>
__device__ __forceinline__ void add_halves(float (&f)[VEC], const T* p) {
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] += to_float(pk.v[i]);
}

// p[i] = f[i] rounded to T, i < VEC, as one pack.
template <int VEC, class T>
__device__ __forceinline__ void store_halves(T* p, const float (&f)[VEC]) {
    Pack<T, VEC> pk;
#pragma unroll
    for (int i = 0; i < VEC; ++i) pk.v[i] = from_float<T>(f[i]);
    *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// VEC fp32 values; 16-byte accesses when VEC is a multiple of 4 (the launcher checks alignment).
template <int VEC>
__device__ __forceinline__ void load_floats(float (&f)[VEC], const float* p) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) {
            const float4 q = *reinterpret_cast<const float4*>(p + i);
            f[i] = q.x;
            f[i + 1] = q.y;
            f[i + 2] = q.z;
            f[i + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) f[i] = p[i];
    }
}

template <int VEC>
__device__ __forceinline__ void store_floats(float* p, const float (&f)[VEC]) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) p[i] = f[i];
    }
}

// ---- Column partial sums ---------------------------------------------------------------------
// grad_s[c] += sum over rows n of a per-row term, for SUMS gradients s at once (dbias; dw and
// db of a norm). Atomics would make the sums depend on timing, so column_partials_kernel
// writes per-(row chunk, column) partial sums to scratch, each column summed by a fixed
// thread over a fixed set of rows and then across the block's row groups in order, and
// add_partials_kernel adds the chunks in order into the gradient.

// Blocks of 32 column threads x kColumnRowGroups row groups; the rows are split into
// column_chunk_count(N, C) chunks, about 512 blocks in all.
inline constexpr int kColumnRowGroups = 8;

// A function of N and C only, so the sums' order does not depend on the pointers or the device.
inline int64_t column_chunk_count(int64_t N, int64_t C) {
    constexpr int64_t target_blocks = 512;
    constexpr int64_t min_rows_per_chunk = 64;
    const int64_t column_tiles = ceil_div(C, int64_t{32 * 8});
    const int64_t by_blocks = std::max<int64_t>(1, target_blocks / column_tiles);
    return std::max<int64_t>(1, std::min(ceil_div(N, min_rows_per_chunk), by_blocks));
}

// Block (32, kColumnRowGroups) over columns [blockIdx.x*32*VEC, +32*VEC) and the rows of chunk
// blockIdx.y. Thread (tx, ty) accumulates rows ty, ty + kColumnRowGroups, ... of the chunk for
// its VEC columns c: rows.add(acc, n, n * C + c) adds row n's terms to acc[s][0..VEC) for
// every s < SUMS. The row groups are then added in order 0..kColumnRowGroups-1 into partial
// [SUMS, chunks, C] (chunks = gridDim.y). The result does not depend on VEC.
template <int VEC, int SUMS, class Rows>
__global__ void __launch_bounds__(32 * kColumnRowGroups) column_partials_kernel(float* partial, Rows rows, int64_t N, int64_t C,
                                                                               int64_t rows_per_chunk) {
    __shared__ float shared[SUMS][kColumnRowGroups * VEC * 32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (int64_t{blockIdx.x} * 32 + tx) * VEC;
    const int64_t r0 = int64_t{blockIdx.y} * rows_per_chunk, r1 = std::min(N, r0 + rows_per_chunk);

    float acc[SUMS][VEC] = {};
    if (c0 < C)
        for (int64_t n = r0 + ty; n < r1; n += kColumnRowGroups) rows.add(acc, n, n * C + c0);
#pragma unroll
    for (int s = 0; s < SUMS; ++s)
#pragma unroll
        for (int i = 0; i < VEC; ++i) shared[s][(ty * VEC + i) * 32 + tx] = acc[s][i];
    __syncthreads();  // reached by every thread of the block
    if (ty != 0 || c0 >= C) return;
    float* out = partial + int64_t{blockIdx.y} * C + c0;
    const int64_t sum_stride = int64_t{gridDim.y} * C;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        float sum[SUMS] = {};
        for (int g = 0; g < kColumnRowGroups; ++g)
#pragma unroll
            for (int s = 0; s < SUMS; ++s) sum[s] += shared[s][(g * VEC + i) * 32 + tx];
#pragma unroll
        for (int s = 0; s < SUMS; ++s) out[s * sum_stride + i] = sum[s];
    }
}

// grad[c] += sum over chunks k = 0, 1, ... of partial[k, c], one thread per column. A template
// only because a header cannot define a non-template kernel (no `inline` for __global__).
template <int = 0>
__global__ void add_partials_kernel(float* grad, const float* partial, int64_t chunks, int64_t C) {
    const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * C + c];
    grad[c] += sum;
}

// grads[s][c] += the column sums of Rows' terms s, through partial (SUMS * chunks * C floats,
// chunks = column_chunk_count(N, C)); a null grads[s] is computed but not added. Each launch
// is checked under its name: `partials_name`, then `add_name` for each gradient added.
template <int VEC, int SUMS, class Rows>
void launch_column_sums(float* const (&grads)[SUMS], float* partial, const Rows& rows, int64_t N, int64_t C, const char* partials_name,
                        const char* add_name, cudaStream_t stream) {
    constexpr int add_threads = 256;
    const int64_t chunks = column_chunk_count(N, C);
    const dim3 grid(static_cast<unsigned>(ceil_div(C, int64_t{32 * VEC})), static_cast<unsigned>(chunks));
    column_partials_kernel<VEC, SUMS><<<grid, dim3(32, kColumnRowGroups), 0, stream>>>(partial, rows, N, C, ceil_div(N, chunks));
    check_launch(partials_name);
    for (int s = 0; s < SUMS; ++s) {
        if (!grads[s]) continue;
        add_partials_kernel<<<static_cast<unsigned>(ceil_div(C, int64_t{add_threads})), add_threads, 0, stream>>>(grads[s], partial + s * chunks * C,
                                                                                                                chunks, C);
        check_launch(add_name);
    }
}

}  // namespace llmtrain::kernels

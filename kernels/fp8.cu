// FP8 casts with per-tensor scales (core/fp8.h gives the formats and the rules):
//
//   amax:          amax = max |x|                                  (NaN when an element is NaN)
//   update scale:  scale = max_format / amax / 2^margin, kept when amax is 0 or not finite;
//                  scale_inv = 1 / scale                           (one thread: no host wait)
//   cast:          out = fp8(x * scale), rounded to nearest even and saturating at +-max;
//                  out_t = the same bytes transposed; amax = max |x| of this pass;
//                  counts += the elements saturated (rounding would leave the range: e4m3
//                  above 464, e5m2 from 61440) and flushed (x != 0, out +-0): per block a sum of integers, one f64 atomicAdd of each; sums of
//                  integers below 2^53 are exact in any order, so the result is deterministic
//   relayout:      x already FP8 (of out's format): out = x's bytes, out_t their transpose
//
// The cast works on 32 x 32 tiles: each block reads a tile of x once (coalesced), writes its
// FP8 bytes row-major, and through shared memory writes them again transposed (coalesced), so
// the bf16 tensor is read once for both layouts Hopper's FP8 GEMMs need. Maxima combine with
// an integer atomicMax on the float's bits: for non-negative floats the bit patterns order
// as the values (NaN above infinity), and a maximum does not depend on the order it is taken
// in, so the result is deterministic.
#include <cuda_runtime.h>

#include "kernels/half_types.cuh"

namespace llmtrain::kernels {

namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // threads per column of a tile: each handles kTile / kTileRows rows

struct Fp8Bits {
    int mantissa_bits, bias;
    uint32_t max_float_bits;  // the largest finite value as float bits
    uint8_t max_bits, nan_bits;
};

__host__ __device__ inline Fp8Bits fp8_bits(bool e4m3) {
    // 448 = 0x43e00000, 57344 = 0x47600000.
    return e4m3 ? Fp8Bits{3, 7, 0x43e00000u, 0x7e, 0x7f} : Fp8Bits{2, 15, 0x47600000u, 0x7b, 0x7e};
}

// Round to nearest even on the float's bits. Normal FP8 values keep the top mantissa bits (the
// rounding carry may step into the exponent, which is the right value); below the smallest
// normal the value is a multiple of the subnormal spacing, found by one exact scaling.
__device__ inline uint8_t float_to_fp8_bits(float value, bool e4m3) {
    const Fp8Bits f = fp8_bits(e4m3);
    const uint32_t bits = __float_as_uint(value);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return sign | f.nan_bits;
    if (magnitude >= f.max_float_bits) return sign | f.max_bits;  // saturate, infinities included
    const int exponent = static_cast<int>(magnitude >> 23) - 127;
    const int min_normal = 1 - f.bias;
    if (exponent < min_normal) {
        // |value| / 2^(min_normal - mantissa_bits): the count of subnormal steps (2^mantissa_bits
        // steps is the smallest normal, whose pattern is that same integer).
        const float steps = rintf(__uint_as_float(magnitude) * __uint_as_float(static_cast<uint32_t>(127 + f.mantissa_bits - min_normal) << 23));
        return sign | static_cast<uint8_t>(steps);
    }
    const int shift = 23 - f.mantissa_bits;
    const uint32_t rounded = (magnitude + ((1u << (shift - 1)) - 1u) + ((magnitude >> shift) & 1u)) >> shift;
    return sign | static_cast<uint8_t>(rounded - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits));
}

template <class T>
__device__ inline float load_float(const T* p, int64_t i) {
    return to_float(p[i]);
}
template <>
__device__ inline float load_float<float>(const float* p, int64_t i) {
    return p[i];
}

// Combines each thread's `mine` over the block (a warp's by shuffles, then the warps' by
// thread 0) and hands the block's value to thread 0's `done`. lanes: shared memory of one
// unsigned per warp of the block, used by no other reduction of the same kernel.
template <class Combine, class Done>
__device__ void block_reduce(unsigned mine, unsigned* lanes, Combine combine, Done done) {
    for (int offset = 16; offset > 0; offset /= 2) mine = combine(mine, __shfl_xor_sync(0xffffffffu, mine, offset));
    const int thread = threadIdx.x + threadIdx.y * blockDim.x;
    if (thread % 32 == 0) lanes[thread / 32] = mine;
    __syncthreads();
    if (thread == 0) {
        unsigned block = lanes[0];
        const int warps = static_cast<int>(blockDim.x * blockDim.y) / 32;
        for (int w = 1; w < warps; ++w) block = combine(block, lanes[w]);
        done(block);
    }
}

// The block's largest |x| bits into *amax (atomicMax; *amax starts at 0).
__device__ void block_max_into(unsigned* amax, unsigned mine, unsigned* lanes) {
    block_reduce(mine, lanes, [](unsigned a, unsigned b) { return max(a, b); }, [amax](unsigned block) { atomicMax(amax, block); });
}

// The block's sum of `mine` added to *total (one atomicAdd of an integer-valued double).
__device__ void block_sum_into(double* total, unsigned mine, unsigned* lanes) {
    block_reduce(mine, lanes, [](unsigned a, unsigned b) { return a + b; }, [total](unsigned block) {
        if (block > 0) atomicAdd(total, static_cast<double>(block));
    });
}

constexpr int kAmaxThreads = 256;

template <class T>
__global__ void __launch_bounds__(kAmaxThreads) fp8_amax_kernel(unsigned* amax, const T* x, int64_t n) {
    __shared__ unsigned lanes[kAmaxThreads / 32];
    unsigned mine = 0;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        mine = max(mine, __float_as_uint(load_float(x, i)) & 0x7fffffffu);
    block_max_into(amax, mine, lanes);
}

__global__ void __launch_bounds__(1) fp8_update_scale_kernel(float* scale, float* scale_inv, const float* amax, float format_max, float margin_factor) {
    constexpr float kLargest = 3.402823466e38f;  // FLT_MAX
    const float a = *amax;
    if (a > 0.0f && a <= kLargest) {  // neither zero, infinite nor NaN
        const float s = format_max / a / margin_factor;
        *scale = s < kLargest ? s : kLargest;  // a subnormal amax: the largest finite scale
    }
    *scale_inv = 1.0f / *scale;
}

template <class T>
__global__ void __launch_bounds__(kTile* kTileRows)
    fp8_cast_kernel(uint8_t* out, uint8_t* out_t, unsigned* amax, double* counts, const T* x, const float* scale, int64_t rows, int64_t cols, bool e4m3) {
    __shared__ uint8_t tile[kTile][kTile + 4];
    __shared__ unsigned lanes[kTile * kTileRows / 32];
    __shared__ unsigned count_lanes[2][kTile * kTileRows / 32];
    const float s = *scale;
    const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
    unsigned mine = 0, saturated = 0, flushed = 0;
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
        const int64_t row = row0 + r, col = col0 + threadIdx.x;
        if (row < rows && col < cols) {
            const float v = load_float(x, row * cols + col), scaled = v * s;
            mine = max(mine, __float_as_uint(v) & 0x7fffffffu);
            const uint8_t q = float_to_fp8_bits(scaled, e4m3);
            out[row * cols + col] = q;
            tile[r][threadIdx.x] = q;
            const float a = fabsf(scaled);
            saturated += e4m3 ? a > 464.0f : a >= 61440.0f;  // rounding would leave the range (backend.h)
            flushed += v != 0.0f && (q & 0x7f) == 0;
        }
    }
    if (amax) block_max_into(amax, mine, lanes);
    if (counts) {
        block_sum_into(counts, saturated, count_lanes[0]);
        block_sum_into(counts + 1, flushed, count_lanes[1]);
    }
    if (!out_t) return;
    __syncthreads();
    // out_t is [cols, rows]: thread x walks a row of it (a column of the tile).
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
        const int64_t col = col0 + c, row = row0 + threadIdx.x;
        if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];
    }
}

// The cast's tiles without the cast: bytes in, the same bytes out and transposed.
__global__ void __launch_bounds__(kTile* kTileRows) fp8_relayout_kernel(uint8_t* out, uint8_t* out_t, const uint8_t* x, int64_t rows, int64_t cols) {
    __shared__ uint8_t tile[kTile][kTile + 4];
    const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
        const int64_t row = row0 + r, col = col0 + threadIdx.x;
        if (row < rows && col < cols) {
            const uint8_t q = x[row * cols + col];
            if (out != x) out[row * cols + col] = q;
            tile[r][threadIdx.x] = q;
        }
    }
    if (!out_t) return;
    __syncthreads();
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
        const int64_t col = col0 + c, row = row0 + threadIdx.x;
        if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];
    }
}

}  // namespace

namespace {

template <class T>
void amax_as(unsigned* bits, const void* x, int64_t n, cudaStream_t stream) {
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(n, kAmaxThreads), 1024));
    fp8_amax_kernel<T><<<blocks, kAmaxThreads, 0, stream>>>(bits, static_cast<const T*>(x), n);
}

template <class T>
void cast_as(const Fp8CastArgs& a, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(ceil_div(a.cols, kTile)), static_cast<unsigned>(ceil_div(a.rows, kTile))), block(kTile, kTileRows);
    fp8_cast_kernel<T><<<grid, block, 0, stream>>>(a.out, a.out_t, reinterpret_cast<unsigned*>(a.amax), a.counts, static_cast<const T*>(a.x), a.scale, a.rows,
                                                   a.cols, a.e4m3);
}

}  // namespace

void launch_fp8_amax(float* amax, const void* x, Fp8Source type, int64_t n, cudaStream_t stream) {
    cudaMemsetAsync(amax, 0, sizeof(float), stream);
    if (n == 0) return;
    auto* bits = reinterpret_cast<unsigned*>(amax);
    switch (type) {
        case Fp8Source::bf16: amax_as<__nv_bfloat16>(bits, x, n, stream); break;
        case Fp8Source::f16: amax_as<__half>(bits, x, n, stream); break;
        case Fp8Source::f32: amax_as<float>(bits, x, n, stream); break;
    }
    check_launch("fp8_amax");
}

void launch_fp8_update_scale(float* scale, float* scale_inv, const float* amax, float format_max, int margin, cudaStream_t stream) {
    fp8_update_scale_kernel<<<1, 1, 0, stream>>>(scale, scale_inv, amax, format_max, static_cast<float>(1 << margin));
    check_launch("fp8_update_scale");
}

void launch_fp8_cast(const Fp8CastArgs& a, cudaStream_t stream) {
    if (a.amax) cudaMemsetAsync(a.amax, 0, sizeof(float), stream);
    if (a.rows == 0 || a.cols == 0) return;
    switch (a.source) {
        case Fp8Source::bf16: cast_as<__nv_bfloat16>(a, stream); break;
        case Fp8Source::f16: cast_as<__half>(a, stream); break;
        case Fp8Source::f32: cast_as<float>(a, stream); break;
    }
    check_launch("fp8_cast");
}

void launch_fp8_relayout(uint8_t* out, uint8_t* out_t, const uint8_t* x, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)), static_cast<unsigned>(ceil_div(rows, kTile))), block(kTile, kTileRows);
    fp8_relayout_kernel<<<grid, block, 0, stream>>>(out, out_t, x, rows, cols);
    check_launch("fp8_cast");
}

}  // namespace llmtrain::kernels

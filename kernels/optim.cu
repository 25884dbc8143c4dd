// The optimizer-side kernels: the AdamW update and the sum of squares behind the global
// gradient norm.
//   AdamW (decoupled weight decay), per element, in fp32 (the CPU reference, cpu_optim.cpp,
//   uses double; its constants come in as fp32 here):
//     g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//     p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p )
//   and, when asked, the updated p rounded to the 16-bit compute copy.
//   sum_squares: sum_i x_i^2 in double, deterministic with no atomics: a grid whose size
//   depends only on n; thread j of the grid sums the quads (4 elements) j, j + grid, ... in
//   order, the block sums its threads in a fixed tree into one double partial, and a single
//   block adds the partials the same way. The quads are read as float4 when x is 16-byte
//   aligned and one element at a time otherwise, in the same order, so the result does not
//   depend on the alignment either.
//   reduce_into: the same over a list of ranges in one launch (each range its own blocks,
//   as many as sum_squares would give it), of x_i or x_i^2, added into a device total:
//   the step's loss sum and its gradient norm never leave the device until the step ends.
#include <algorithm>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int adamw_threads = 256;
constexpr int64_t adamw_max_blocks = 16384;  // the grid-stride loop covers the rest
constexpr int quad = 4;                      // 4 floats = 16 bytes

constexpr int sum_threads = 512;
constexpr int64_t sum_max_blocks = 1024;
constexpr int64_t sum_elems_per_thread = 16;  // below this much work per thread, fewer blocks
constexpr int finish_threads = 256;
constexpr int warp_size = 32;

__device__ __forceinline__ float adamw_param(float p, float grad, float& m, float& v, const AdamWArgs& a) {
    const float g = grad * a.grad_scale;
    m = a.beta1 * m + (1.f - a.beta1) * g;
    v = a.beta2 * v + (1.f - a.beta2) * g * g;
    const float update = (m / a.bias_correction1) / (sqrtf(v / a.bias_correction2) + a.eps) + a.weight_decay * p;
    return p - a.lr * update;
}

// Elements [0, 4 quads) as float4 quads (every pointer aligned: 16 bytes, copy 8 bytes),
// then [4 quads, n) one at a time. copy may be null.
template <class T>
__global__ void __launch_bounds__(adamw_threads)
    adamw_kernel(float* param, const float* grad, float* m, float* v, T* copy, int64_t n, int64_t quads, AdamWArgs a) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    for (int64_t q = first; q < quads; q += stride) {
        float4 p = reinterpret_cast<const float4*>(param)[q];
        const float4 g = reinterpret_cast<const float4*>(grad)[q];
        float4 mq = reinterpret_cast<const float4*>(m)[q];
        float4 vq = reinterpret_cast<const float4*>(v)[q];
        p.x = adamw_param(p.x, g.x, mq.x, vq.x, a);
        p.y = adamw_param(p.y, g.y, mq.y, vq.y, a);
        p.z = adamw_param(p.z, g.z, mq.z, vq.z, a);
        p.w = adamw_param(p.w, g.w, mq.w, vq.w, a);
        reinterpret_cast<float4*>(param)[q] = p;
        reinterpret_cast<float4*>(m)[q] = mq;
        reinterpret_cast<float4*>(v)[q] = vq;
        // The 4 rounded values as one 8-byte write.
        if (copy) reinterpret_cast<Pack<T, quad>*>(copy)[q] = {from_float<T>(p.x), from_float<T>(p.y), from_float<T>(p.z), from_float<T>(p.w)};
    }
    for (int64_t i = quads * quad + first; i < n; i += stride) {
        float mi = m[i], vi = v[i];
        const float p = adamw_param(param[i], grad[i], mi, vi, a);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (copy) copy[i] = from_float<T>(p);
    }
}

__device__ __forceinline__ double square(float x) { return static_cast<double>(x) * static_cast<double>(x); }

// Sum over the block in a fixed tree; the result is valid in thread 0. Called by all threads.
__device__ double block_sum(double x) {
    __shared__ double part[warp_size];
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
#pragma unroll
    for (int offset = warp_size / 2; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
    if (lane == 0) part[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < static_cast<int>(blockDim.x / warp_size) ? part[lane] : 0.0;
#pragma unroll
        for (int offset = warp_size / 2; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
    }
    return x;
}

// partial[block] = sum of x_i^2 over the quads this block's threads own (see the top).
__global__ void __launch_bounds__(sum_threads) sum_squares_partial_kernel(double* partial, const float* x, int64_t n, bool aligned) {
    const int64_t quads = ceil_div(n, int64_t{quad});
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    double acc = 0.0;
    for (int64_t q = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += stride) {
        const int64_t begin = q * quad;
        if (aligned && begin + quad <= n) {
            const float4 f = reinterpret_cast<const float4*>(x)[q];
            acc += square(f.x);
            acc += square(f.y);
            acc += square(f.z);
            acc += square(f.w);
        } else {
            for (int64_t i = begin; i < min(begin + quad, n); ++i) acc += square(x[i]);
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *result = the partials added in a fixed order (0 when there are none).
__global__ void __launch_bounds__(finish_threads) sum_squares_finish_kernel(double* result, const double* partial, int64_t count) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *result = acc;
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// partial[b] = the sum over range p's quads that block b - first_block[p] of its blocks owns,
// of x_i^2 (Squares) or x_i, for the range p whose blocks hold b.
template <bool Squares>
__global__ void __launch_bounds__(sum_threads) reduce_pieces_partial_kernel(double* partial, ReducePieces pieces) {
    int p = 0;
    while (p + 1 < pieces.count && int64_t{blockIdx.x} >= pieces.first_block[p + 1]) ++p;
    const float* x = pieces.x[p];
    const int64_t n = pieces.n[p], block = int64_t{blockIdx.x} - pieces.first_block[p];
    const int64_t stride = (pieces.first_block[p + 1] - pieces.first_block[p]) * blockDim.x;
    const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const auto term = [](float v) { return Squares ? square(v) : static_cast<double>(v); };
    double acc = 0.0;
    for (int64_t q = block * blockDim.x + threadIdx.x; q < ceil_div(n, int64_t{quad}); q += stride) {
        const int64_t begin = q * quad;
        if (aligned && begin + quad <= n) {
            const float4 f = reinterpret_cast<const float4*>(x)[q];
            acc += term(f.x);
            acc += term(f.y);
            acc += term(f.z);
            acc += term(f.w);
        } else {
            for (int64_t i = begin; i < min(begin + quad, n); ++i) acc += term(x[i]);
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *total += scale * (the partials added in a fixed order).
__global__ void __launch_bounds__(finish_threads) reduce_pieces_finish_kernel(double* total, const double* partial, int64_t count, double scale) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *total += scale * acc;
}

// The partial-sum grid: a function of n only, so the order of the sum is too.
int64_t sum_blocks(int64_t n) {
    if (n <= 0) return 0;
    return std::clamp<int64_t>(ceil_div(n, int64_t{sum_threads} * sum_elems_per_thread), 1, sum_max_blocks);
}

}  // namespace

void launch_adamw(float* param, const float* grad, float* m, float* v, void* copy, Half copy_type, int64_t n, const AdamWArgs& args,
                  cudaStream_t stream) {
    if (n <= 0) return;
    const bool vectorize = aligned_to(param, 16) && aligned_to(grad, 16) && aligned_to(m, 16) && aligned_to(v, 16) && aligned_to(copy, 8);
    const int64_t quads = vectorize ? n / quad : 0;
    const int64_t work = std::max(quads, n - quads * quad);
    const int blocks = static_cast<int>(std::clamp<int64_t>(ceil_div(work, int64_t{adamw_threads}), 1, adamw_max_blocks));
    dispatch_half(copy_type, [&]<class T>() {
        adamw_kernel<T><<<blocks, adamw_threads, 0, stream>>>(param, grad, m, v, static_cast<T*>(copy), n, quads, args);
        check_launch("adamw");
    });
}

size_t sum_squares_scratch_bytes(int64_t n) { return static_cast<size_t>(sum_blocks(n)) * sizeof(double); }

// n = 0 still launches the finishing kernel, which writes *result = 0.
void launch_sum_squares(double* result, const float* x, int64_t n, void* scratch, cudaStream_t stream) {
    const int64_t blocks = sum_blocks(n);
    double* partial = static_cast<double*>(scratch);
    if (blocks > 0) {
        sum_squares_partial_kernel<<<static_cast<int>(blocks), sum_threads, 0, stream>>>(partial, x, n, aligned_to(x, 16));
        check_launch("sum_squares_partial");
    }
    sum_squares_finish_kernel<<<1, finish_threads, 0, stream>>>(result, partial, blocks);
    check_launch("sum_squares_finish");
}

int64_t reduce_pieces_blocks(const ReducePieces& pieces) {
    int64_t blocks = 0;
    for (int i = 0; i < pieces.count; ++i) blocks += sum_blocks(pieces.n[i]);
    return blocks;
}

size_t reduce_into_scratch_bytes(const ReducePieces& pieces) { return static_cast<size_t>(reduce_pieces_blocks(pieces)) * sizeof(double); }

void launch_reduce_into(double* total, ReducePieces pieces, bool squares, double scale, void* scratch, cudaStream_t stream) {
    if (pieces.count < 0 || pieces.count > ReducePieces::max_pieces) fail(ErrorKind::runtime, "reduce_into: ", pieces.count, " ranges in one launch");
    pieces.first_block[0] = 0;
    for (int i = 0; i < pieces.count; ++i) pieces.first_block[i + 1] = pieces.first_block[i] + sum_blocks(pieces.n[i]);
    const int64_t blocks = pieces.count > 0 ? pieces.first_block[pieces.count] : 0;
    double* partial = static_cast<double*>(scratch);
    if (blocks > 0) {
        if (squares) reduce_pieces_partial_kernel<true><<<static_cast<unsigned>(blocks), sum_threads, 0, stream>>>(partial, pieces);
        else reduce_pieces_partial_kernel<false><<<static_cast<unsigned>(blocks), sum_threads, 0, stream>>>(partial, pieces);
        check_launch("reduce_into_partial");
    }
    reduce_pieces_finish_kernel<<<1, finish_threads, 0, stream>>>(total, partial, blocks, scale);
    check_launch("reduce_into_finish");
}

}  // namespace llmtrain::kernels

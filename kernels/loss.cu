// Softmax cross-entropy over rows of logits [N, V], one block per row:
//   forward:  loss[n] = lse[n] - logits[n, t],  lse[n] = logsumexp(logits[n]),  t = targets[n]
//             (lse kept when asked for: the backward then reads each logit once, with no reduction)
//   backward: dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v + vocab_begin == t]) dloss
//   fused (a training step's classifier): both, the gradient written over the logits, the
//             row read from memory once and reread from L2 (two passes fewer than apart)
// The row is read in chunks and never copied to fp32: each thread keeps an online (max, sum)
// over its elements (the sum rescaled by exp(old max - new max) when the max grows), and the
// block merges the threads' pairs in a fixed tree, so the result is deterministic.
// The backward with lse given reads each element once and writes it back from the same
// thread; without lse it first reduces the row, and the reduction's barriers order every read
// of the row before any write: dlogits may alias logits either way.
//
// Vocabulary-parallel form (each rank holds logits of a slice of the vocabulary): m = max over
// ranks of logits_row_max; partial = (sum_v exp(logits - m), the target's logit or 0) summed
// over ranks; xent_combine gives lse = m + log(sum) and loss = lse - target logit.
//
// The row is split into a head (elements before the first 16-byte boundary), 16-byte packs of
// 8 elements and a tail, so any V (37, 50257, 151936) reads with vector loads.
//
// Padded vocabulary: only a row's first V_real columns are real classes; the columns
// [V_real, V) are padding (the vocabulary rounded up so that tp divides it). The reductions
// read the first V_real columns only and the backward writes 0 to the padded ones, so the
// loss and the real classes' gradients are those of the unpadded rows. V_real = 0 (a shard of
// padding only) gives row_max -inf and sum 0, which add nothing across shards.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int row_threads = 512;
constexpr int warp_size = 32;
constexpr int64_t max_row_blocks = 1 << 16;  // blocks loop over rows beyond this
constexpr int pack_elems = 8;                // 8 x 16 bits = 16 bytes
constexpr int combine_threads = 256;

// Elements [0, head) one at a time, then `packs` packs of 8 from a 16-byte boundary, then
// elements [head + 8 packs, V) one at a time.
struct RowSplit {
    int64_t head, packs;
};

__device__ RowSplit split_row(const void* row, int64_t V, int64_t elem_bytes, bool vectorize) {
    if (!vectorize) return {V, 0};
    const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % 16);
    const int64_t head = min(V, misaligned == 0 ? int64_t{0} : (16 - misaligned) / elem_bytes);
    return {head, (V - head) / pack_elems};
}

// fn(v, logits[v] as fp32) for this thread's elements of the row.
template <class T, class Fn>
__device__ __forceinline__ void for_each_logit(const T* row, int64_t V, RowSplit s, Fn&& fn) {
    for (int64_t v = threadIdx.x; v < s.head; v += blockDim.x) fn(v, to_float(row[v]));
    const Pack<T, pack_elems>* body = reinterpret_cast<const Pack<T, pack_elems>*>(row + s.head);
    for (int64_t p = threadIdx.x; p < s.packs; p += blockDim.x) {
        const Pack<T, pack_elems> x = body[p];
#pragma unroll
        for (int k = 0; k < pack_elems; ++k) fn(s.head + p * pack_elems + k, to_float(x.v[k]));
    }
    for (int64_t v = s.head + s.packs * pack_elems + threadIdx.x; v < V; v += blockDim.x) fn(v, to_float(row[v]));
}

// Online softmax statistics of a set of logits: max and sum of exp(logit - max).
struct MaxSum {
    float max, sum;
};

constexpr float neg_inf = -INFINITY;

__device__ __forceinline__ void add_logit(MaxSum& a, float x) {
    if (x > a.max) {
        a.sum = a.sum * expf(a.max - x) + 1.f;  // a.max = -inf: a.sum is 0 and stays 0
        a.max = x;
    } else if (a.max != neg_inf) {
        a.sum += expf(x - a.max);
    }
}

// Symmetric in a and b (so every lane of a butterfly holds the same bits); an empty side
// (max = -inf) adds nothing instead of exp(-inf - -inf) = NaN.
struct MergeMaxSum {
    __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
        const float mx = fmaxf(a.max, b.max);
        const float sa = a.max == neg_inf ? 0.f : a.sum * expf(a.max - mx);
        const float sb = b.max == neg_inf ? 0.f : b.sum * expf(b.max - mx);
        return {mx, sa + sb};
    }
};

struct MergeMax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct MergeSum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

__device__ __forceinline__ float shuffle_xor(float x, int lane_mask) { return __shfl_xor_sync(0xffffffffu, x, lane_mask); }

__device__ __forceinline__ MaxSum shuffle_xor(MaxSum x, int lane_mask) {
    return {shuffle_xor(x.max, lane_mask), shuffle_xor(x.sum, lane_mask)};
}

template <class T, class Merge>
__device__ __forceinline__ T warp_reduce(T x, Merge merge) {
#pragma unroll
    for (int mask = warp_size / 2; mask > 0; mask /= 2) x = merge(x, shuffle_xor(x, mask));
    return x;
}

// Reduces x over the block in a fixed tree; every thread gets the result. Called by all
// threads of the block (it holds barriers); the last barrier lets the next call reuse `part`.
template <class T, class Merge>
__device__ T block_reduce(T x, Merge merge, T identity) {
    __shared__ T part[warp_size];
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    x = warp_reduce(x, merge);
    if (lane == 0) part[warp] = x;
    __syncthreads();
    x = lane < static_cast<int>(blockDim.x / warp_size) ? part[lane] : identity;
    x = warp_reduce(x, merge);
    __syncthreads();
    return x;
}

// (max, sum of exp(logit - max)) of the whole row, in every thread.
template <class T>
__device__ MaxSum row_max_sum(const T* row, int64_t V) {
    MaxSum acc{neg_inf, 0.f};
    for_each_logit(row, V, split_row(row, V, sizeof(T), true), [&](int64_t, float x) { add_logit(acc, x); });
    return block_reduce(acc, MergeMaxSum{}, MaxSum{neg_inf, 0.f});
}

int row_grid(int64_t N) { return static_cast<int>(std::min(N, max_row_blocks)); }

// Rows are block-uniform (row loops step by gridDim.x), so the barriers in block_reduce are
// reached by the whole block.
template <class T>
__global__ void __launch_bounds__(row_threads) xent_fwd_kernel(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                                                               int64_t V_real) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T* row = logits + n * V;
        const MaxSum r = row_max_sum(row, V_real);
        if (threadIdx.x == 0) {
            // The host cannot check the targets without a sync: one outside [0, V_real) gives a
            // NaN loss rather than a read outside the row.
            const int64_t target = targets[n];
            const float row_lse = r.max + logf(r.sum);
            if (lse) lse[n] = row_lse;
            losses[n] = target >= 0 && target < V_real ? row_lse - to_float(row[target]) : __int_as_float(0x7fffffff);
        }
    }
}

// A padded column (v >= V_real) is outside the softmax: its gradient is 0.
template <class T>
__device__ __forceinline__ T xent_grad(int64_t v, float x, float lse, int64_t target, float dloss, int64_t V_real) {
    if (v >= V_real) return from_float<T>(0.f);
    return from_float<T>((expf(x - lse) - (v == target ? 1.f : 0.f)) * dloss);
}

// Writes the gradient of one row; each element is read and written by the same thread.
template <class T>
__device__ void write_row_grad(T* drow, const T* row, int64_t V, int64_t V_real, RowSplit s, float lse, int64_t target, float dloss) {
    for (int64_t v = threadIdx.x; v < s.head; v += blockDim.x) drow[v] = xent_grad<T>(v, to_float(row[v]), lse, target, dloss, V_real);
    const Pack<T, pack_elems>* body = reinterpret_cast<const Pack<T, pack_elems>*>(row + s.head);
    Pack<T, pack_elems>* dbody = reinterpret_cast<Pack<T, pack_elems>*>(drow + s.head);
    for (int64_t p = threadIdx.x; p < s.packs; p += blockDim.x) {
        const Pack<T, pack_elems> x = body[p];
        Pack<T, pack_elems> d;
#pragma unroll
        for (int k = 0; k < pack_elems; ++k) d.v[k] = xent_grad<T>(s.head + p * pack_elems + k, to_float(x.v[k]), lse, target, dloss, V_real);
        dbody[p] = d;
    }
    for (int64_t v = s.head + s.packs * pack_elems + threadIdx.x; v < V; v += blockDim.x)
        drow[v] = xent_grad<T>(v, to_float(row[v]), lse, target, dloss, V_real);
}

// same_alignment: dlogits and logits have the same address mod 16, so a row's packs start
// 16-byte aligned in both; otherwise the rows go one element at a time.
template <class T>
__global__ void __launch_bounds__(row_threads) xent_bwd_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse, int64_t N,
                                                               int64_t V, int64_t V_real, int64_t vocab_begin, float dloss, bool same_alignment) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T* row = logits + n * V;
        float row_lse;
        if (lse) {
            row_lse = lse[n];
        } else {
            const MaxSum r = row_max_sum(row, V_real);  // ends with a barrier: all reads of the row done
            row_lse = r.max + logf(r.sum);
        }
        const int64_t target = int64_t{targets[n]} - vocab_begin;  // outside [0, V): no one-hot here
        write_row_grad(dlogits + n * V, row, V, V_real, split_row(row, V, sizeof(T), same_alignment), row_lse, target, dloss);
    }
}

// The fused classifier: the row's (max, sum) and loss as xent_fwd_kernel, then its gradient
// written over it as xent_bwd_kernel; the reduction's closing barrier orders every read of
// the first pass before any write (the second pass rereads the row, mostly from L2).
template <class T>
__global__ void __launch_bounds__(row_threads) xent_fwd_bwd_kernel(float* losses, float* lse, T* logits, const int32_t* targets, int64_t N, int64_t V,
                                                                   int64_t V_real, float dloss) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        T* row = logits + n * V;
        const MaxSum r = row_max_sum(row, V_real);
        const float row_lse = r.max + logf(r.sum);
        const int64_t target = targets[n];
        if (threadIdx.x == 0) {
            if (lse) lse[n] = row_lse;
            losses[n] = target >= 0 && target < V_real ? row_lse - to_float(row[target]) : __int_as_float(0x7fffffff);
        }
        __syncthreads();  // thread 0's read of the target logit before the row is overwritten
        write_row_grad(row, row, V, V_real, split_row(row, V, sizeof(T), true), row_lse, target, dloss);
    }
}

template <class T>
__global__ void __launch_bounds__(row_threads) logits_row_max_kernel(float* row_max, const T* logits, int64_t N, int64_t V, int64_t V_real) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T* row = logits + n * V;
        float mx = neg_inf;
        for_each_logit(row, V_real, split_row(row, V_real, sizeof(T), true), [&](int64_t, float x) { mx = fmaxf(mx, x); });
        mx = block_reduce(mx, MergeMax{}, neg_inf);
        if (threadIdx.x == 0) row_max[n] = mx;
    }
}

template <class T>
__global__ void __launch_bounds__(row_threads) xent_partial_kernel(float* partial, const T* logits, const int32_t* targets, const float* row_max,
                                                                   int64_t N, int64_t V, int64_t V_real, int64_t vocab_begin) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const T* row = logits + n * V;
        const float mx = row_max[n];
        float sum = 0.f;
        for_each_logit(row, V_real, split_row(row, V_real, sizeof(T), true), [&](int64_t, float x) { sum += expf(x - mx); });
        sum = block_reduce(sum, MergeSum{}, 0.f);
        if (threadIdx.x == 0) {
            const int64_t target = int64_t{targets[n]} - vocab_begin;
            partial[2 * n] = sum;
            partial[2 * n + 1] = target >= 0 && target < V_real ? to_float(row[target]) : 0.f;
        }
    }
}

__global__ void xent_combine_kernel(float* losses, float* lse, const float* partial, const float* row_max, int64_t N) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < N; n += stride) {
        const float value = row_max[n] + logf(partial[2 * n]);
        if (lse) lse[n] = value;
        losses[n] = value - partial[2 * n + 1];
    }
}

}  // namespace

void launch_xent_fwd(Half t, float* losses, float* lse, const void* logits, const int32_t* targets, int64_t N, int64_t V, int64_t V_real, cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    dispatch_half(t, [&]<class T>() {
        xent_fwd_kernel<T><<<row_grid(N), row_threads, 0, stream>>>(losses, lse, static_cast<const T*>(logits), targets, N, V, V_real);
        check_launch("xent_fwd");
    });
}

void launch_xent_bwd(Half t, void* dlogits, const void* logits, const int32_t* targets, const float* lse, int64_t N, int64_t V, int64_t V_real,
                     int64_t vocab_begin, float dloss, cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    const bool same_alignment = reinterpret_cast<uintptr_t>(dlogits) % 16 == reinterpret_cast<uintptr_t>(logits) % 16;
    dispatch_half(t, [&]<class T>() {
        xent_bwd_kernel<T><<<row_grid(N), row_threads, 0, stream>>>(static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, lse, N, V,
                                                                     V_real, vocab_begin, dloss, same_alignment);
        check_launch("xent_bwd");
    });
}

void launch_xent_fwd_bwd(Half t, float* losses, float* lse, void* logits, const int32_t* targets, int64_t N, int64_t V, int64_t V_real, float dloss,
                         cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    dispatch_half(t, [&]<class T>() {
        xent_fwd_bwd_kernel<T><<<row_grid(N), row_threads, 0, stream>>>(losses, lse, static_cast<T*>(logits), targets, N, V, V_real, dloss);
        check_launch("xent_fwd_bwd");
    });
}

void launch_logits_row_max(Half t, float* row_max, const void* logits, int64_t N, int64_t V, int64_t V_real, cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    dispatch_half(t, [&]<class T>() {
        logits_row_max_kernel<T><<<row_grid(N), row_threads, 0, stream>>>(row_max, static_cast<const T*>(logits), N, V, V_real);
        check_launch("logits_row_max");
    });
}

void launch_xent_partial(Half t, float* partial, const void* logits, const int32_t* targets, const float* row_max, int64_t N, int64_t V,
                         int64_t V_real, int64_t vocab_begin, cudaStream_t stream) {
    if (N <= 0 || V <= 0) return;
    dispatch_half(t, [&]<class T>() {
        xent_partial_kernel<T><<<row_grid(N), row_threads, 0, stream>>>(partial, static_cast<const T*>(logits), targets, row_max, N, V, V_real,
                                                                         vocab_begin);
        check_launch("xent_partial");
    });
}

void launch_xent_combine(float* losses, float* lse, const float* partial, const float* row_max, int64_t N, cudaStream_t stream) {
    if (N <= 0) return;
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(N, int64_t{combine_threads}), max_row_blocks));
    xent_combine_kernel<<<blocks, combine_threads, 0, stream>>>(losses, lse, partial, row_max, N);
    check_launch("xent_combine");
}

}  // namespace llmtrain::kernels

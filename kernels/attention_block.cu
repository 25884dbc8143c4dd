// Context parallelism's attention blocks (backend.h, AttentionBlockFwd / AttentionBlockBwd):
// the queries of this rank's rows against one block of keys and values whose positions are
// explicit, merged into a running fp32 (acc, lse) by log-sum-exp; and copy_columns.
//
// Query t of sequence b (head h, kv head g = h / (H / Hkv)) sees key s of the block iff
// first(b, t) <= kv_pos[s] <= q_pos[t] (first = q_first[b*Tq + t], or 0). With S = scale q.k
// (scale = 1/sqrt(D)), the forward walks the block's keys with an online softmax (running max
// m and sum l per row, rescaled by exp(m_old - m_new)), then merges:
//   lse_b = m + log l,  o_b = sum_s exp(S_s - m) v_s / l,
//   lse' = log(exp(lse) + exp(lse_b)),  acc' = acc exp(lse - lse') + o_b exp(lse_b - lse').
// The backward takes the merged (out, lse): P = exp(S - lse), delta = rowsum(dout * out),
// dS = P (dout.v - delta), dq += scale dS k, dk += scale dS^T q, dv += P^T dout.
//
// Design: plain fp32 arithmetic on CUDA cores, one warp per query row (forward, dq) or per
// key (dk, dv), the other side walked in tiles of 32 staged through shared memory, one lane
// per element of the tile: lane j computes the score of tile element j with a full D-long dot
// product against a padded shared row (no bank conflicts), the warp reduces max/sum with
// shuffles, and each lane owns D/32 output columns, adding the tile's 32 terms from a shared
// buffer of probabilities. A block (4 warps) shares its K/V (or Q/dout) tiles between 16
// (forward), 8 (dq) or 8 (dk/dv) rows. Cost against the flash kernels (kernels/attention.cu):
// the same flops, but on fp32 CUDA cores instead of tensor cores, and every multiply-add of
// a dot product reads two shared-memory operands, so shared-memory bandwidth bounds it at
// about an eighth of the fp32 peak: an estimate (not measured) of a few TFLOP/s on an H100,
// tens of times below the flash kernels per block. K/V are also re-read from global memory
// once per 16 or 8 query rows rather than per 64.
// Tiles that the mask excludes for every row of a block (a __syncthreads_or over the tile's
// positions against the block's rows' [first, last] windows) are skipped before they are
// loaded: the blocks of the causal ring that lie wholly in the future cost a read of their
// positions.
//
// Deterministic, no atomics: the forward and dq own their query rows; dk and dv are owned by
// the block of their keys, which walks the kv head's query heads and the query tiles in order.
// dq's kernel also writes delta per query row to scratch for the dk/dv kernel.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 32;       // keys (forward, dq) or queries (dk/dv) per tile: one per lane
constexpr int kFwdRows = 16;    // query rows per forward block
constexpr int kDqRows = 8;      // query rows per dq block
constexpr int kDkvKeys = 8;     // keys per dk/dv block
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int32_t kNoFirst = 1, kNoLast = 0;  // the [first, last] window of a padding row: sees no key

// The block's geometry; D is the kernels' template parameter.
struct BlockGeometry {
    int64_t Tq, Tk, H, Hkv;
    const int32_t* q_pos;    // [Tq]
    const int32_t* kv_pos;   // [Tk]
    const int32_t* q_first;  // [B*Tq] or null
    float scale;
    __device__ int64_t group() const { return H / Hkv; }
    __device__ int64_t qkv_width(int64_t D) const { return (H + 2 * Hkv) * D; }
    __device__ int64_t kv_width(int64_t D) const { return 2 * Hkv * D; }
    __device__ int64_t lse_index(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * Tq + t; }
    // The key positions query t of sequence b sees: [first, last].
    __device__ int32_t first_of(int64_t b, int64_t t) const { return q_first ? q_first[b * Tq + t] : 0; }
};

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}
// The butterfly leaves the same sum (bitwise) in every lane: each step adds two equal pairs.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

template <int D>
__device__ __forceinline__ float dot_rows(const float* a, const float* b) {
    float sum = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) sum += a[d] * b[d];
    return sum;
}

// The union of the windows of `rows` rows (padding rows have first > last): the smallest
// first and the largest last.
__device__ __forceinline__ void window_union(const int32_t* first, const int32_t* last, int rows, int32_t& lo, int32_t& hi) {
    lo = INT32_MAX;
    hi = INT32_MIN;
    for (int r = 0; r < rows; ++r)
        if (first[r] <= last[r]) {
            lo = min(lo, first[r]);
            hi = max(hi, last[r]);
        }
}

// grid (ceil(Tq / kFwdRows), H, B). Warp w owns rows w, w + 4, ... of the block's 16.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) block_fwd_kernel(float* acc, float* lse, const T* qkv, const T* kv, BlockGeometry geo, bool first) {
    constexpr int per_lane = D / 32;
    constexpr int rows_per_warp = kFwdRows / kWarps;
    __shared__ float q_tile[kFwdRows][D];
    __shared__ float k_tile[kTile][D + 1];
    __shared__ float v_tile[kTile][D];
    __shared__ float probs[kWarps][kTile];
    __shared__ int32_t row_first[kFwdRows];
    __shared__ int32_t row_last[kFwdRows];
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int64_t b = blockIdx.z, h = blockIdx.y, t0 = int64_t{blockIdx.x} * kFwdRows;
    const int64_t g = h / geo.group();
    const int64_t qkv_width = geo.qkv_width(D), kv_width = geo.kv_width(D);

    for (int i = static_cast<int>(threadIdx.x); i < kFwdRows * D; i += kThreads) {
        const int r = i / D, d = i % D;
        const int64_t t = t0 + r;
        q_tile[r][d] = t < geo.Tq ? to_float(qkv[(b * geo.Tq + t) * qkv_width + h * D + d]) : 0.f;
    }
    if (threadIdx.x < kFwdRows) {
        const int64_t t = t0 + threadIdx.x;
        row_first[threadIdx.x] = t < geo.Tq ? geo.first_of(b, t) : kNoFirst;
        row_last[threadIdx.x] = t < geo.Tq ? geo.q_pos[t] : kNoLast;
    }
    __syncthreads();
    int32_t block_lo, block_hi;
    window_union(row_first, row_last, kFwdRows, block_lo, block_hi);

    float m[rows_per_warp], l[rows_per_warp], o[rows_per_warp][per_lane];
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < per_lane; ++e) o[i][e] = 0.f;
    }
    for (int64_t s0 = 0; s0 < geo.Tk; s0 += kTile) {
        const int64_t s = s0 + lane;
        const int32_t key = s < geo.Tk ? geo.kv_pos[s] : 0;
        if (!__syncthreads_or(s < geo.Tk && key >= block_lo && key <= block_hi)) continue;  // no row of the block sees the tile
        for (int i = static_cast<int>(threadIdx.x); i < kTile * D; i += kThreads) {
            const int j = i / D, d = i % D;
            const bool in = s0 + j < geo.Tk;
            const T* row = kv + (b * geo.Tk + s0 + j) * kv_width;
            k_tile[j][d] = in ? to_float(row[g * D + d]) : 0.f;
            v_tile[j][d] = in ? to_float(row[(geo.Hkv + g) * D + d]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < rows_per_warp; ++i) {
            const int r = warp + i * kWarps;
            const bool visible = s < geo.Tk && key >= row_first[r] && key <= row_last[r];
            const float score = visible ? dot_rows<D>(q_tile[r], k_tile[lane]) * geo.scale : -INFINITY;
            const float tile_max = warp_max(score);
            if (tile_max == -INFINITY) continue;  // the row sees no key of the tile (the same in every lane)
            const float m_new = fmaxf(m[i], tile_max);
            const float rescale = expf(m[i] - m_new);  // 0 while m is -inf
            const float p = visible ? expf(score - m_new) : 0.f;
            l[i] = l[i] * rescale + warp_sum(p);
            m[i] = m_new;
            probs[warp][lane] = p;
            __syncwarp();
#pragma unroll
            for (int e = 0; e < per_lane; ++e) {
                float sum = 0.f;
                for (int j = 0; j < kTile; ++j) sum += probs[warp][j] * v_tile[j][lane + 32 * e];
                o[i][e] = o[i][e] * rescale + sum;
            }
            __syncwarp();  // probs are rewritten for the next row
        }
        __syncthreads();  // the tiles are rewritten for the next keys
    }

#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
        const int64_t t = t0 + warp + i * kWarps;
        if (t >= geo.Tq) continue;
        float* acc_row = acc + (b * geo.Tq + t) * geo.H * D + h * D;
        float* row_lse = lse + geo.lse_index(b, h, t);
        const float previous = first ? -INFINITY : *row_lse;
        __syncwarp();  // every lane has read the old lse before lane 0 writes it
        if (l[i] == 0.f) {  // the block holds no key this row sees: (acc, lse) unchanged
            if (first) {
#pragma unroll
                for (int e = 0; e < per_lane; ++e) acc_row[lane + 32 * e] = 0.f;
                if (lane == 0) *row_lse = -INFINITY;
            }
            continue;
        }
        const float block_lse = m[i] + logf(l[i]);
        const bool none_before = previous == -INFINITY;
        const float merged = none_before ? block_lse : fmaxf(previous, block_lse) + log1pf(expf(-fabsf(previous - block_lse)));
        const float keep = none_before ? 0.f : expf(previous - merged);
        const float add = expf(block_lse - merged) / l[i];
#pragma unroll
        for (int e = 0; e < per_lane; ++e) {
            float& a = acc_row[lane + 32 * e];
            a = (none_before ? 0.f : a * keep) + o[i][e] * add;
        }
        if (lane == 0) *row_lse = merged;
    }
}

// grid (ceil(Tq / kDqRows), H, B). Warp w owns rows w and w + 4 of the block's 8; writes
// delta [B, H, Tq] for the dk/dv kernel.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) block_dq_kernel(float* dq, float* delta_out, const T* dout, const T* out, const float* lse, const T* qkv,
                                                            const T* kv, BlockGeometry geo) {
    constexpr int per_lane = D / 32;
    constexpr int rows_per_warp = kDqRows / kWarps;
    __shared__ float q_tile[kDqRows][D];
    __shared__ float dout_tile[kDqRows][D];
    __shared__ float k_tile[kTile][D + 1];
    __shared__ float v_tile[kTile][D + 1];
    __shared__ float dscores[kWarps][kTile];
    __shared__ float row_lse[kDqRows];
    __shared__ float row_delta[kDqRows];
    __shared__ int32_t row_first[kDqRows];
    __shared__ int32_t row_last[kDqRows];
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int64_t b = blockIdx.z, h = blockIdx.y, t0 = int64_t{blockIdx.x} * kDqRows;
    const int64_t g = h / geo.group();
    const int64_t qkv_width = geo.qkv_width(D), kv_width = geo.kv_width(D), out_width = geo.H * D;

    for (int i = static_cast<int>(threadIdx.x); i < kDqRows * D; i += kThreads) {
        const int r = i / D, d = i % D;
        const int64_t t = t0 + r;
        q_tile[r][d] = t < geo.Tq ? to_float(qkv[(b * geo.Tq + t) * qkv_width + h * D + d]) : 0.f;
        dout_tile[r][d] = t < geo.Tq ? to_float(dout[(b * geo.Tq + t) * out_width + h * D + d]) : 0.f;
    }
    // delta = rowsum(dout * out), one warp per row; a row no block showed any key (lse = -inf)
    // has P = 0 everywhere and gets no window.
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
        const int r = warp + i * kWarps;
        const int64_t t = t0 + r;
        if (t >= geo.Tq) {
            if (lane == 0) {
                row_first[r] = kNoFirst;
                row_last[r] = kNoLast;
                row_lse[r] = 0.f;
                row_delta[r] = 0.f;
            }
            continue;
        }
        float partial = 0.f;
        for (int d = lane; d < D; d += 32) {
            const int64_t at = (b * geo.Tq + t) * out_width + h * D + d;
            partial += to_float(dout[at]) * to_float(out[at]);
        }
        const float delta = warp_sum(partial);
        if (lane == 0) {
            const float row = lse[geo.lse_index(b, h, t)];
            const bool seen = row != -INFINITY;
            row_first[r] = seen ? geo.first_of(b, t) : kNoFirst;
            row_last[r] = seen ? geo.q_pos[t] : kNoLast;
            row_lse[r] = seen ? row : 0.f;
            row_delta[r] = delta;
            delta_out[geo.lse_index(b, h, t)] = delta;
        }
    }
    __syncthreads();
    int32_t block_lo, block_hi;
    window_union(row_first, row_last, kDqRows, block_lo, block_hi);

    float grad[rows_per_warp][per_lane] = {};
    for (int64_t s0 = 0; s0 < geo.Tk; s0 += kTile) {
        const int64_t s = s0 + lane;
        const int32_t key = s < geo.Tk ? geo.kv_pos[s] : 0;
        if (!__syncthreads_or(s < geo.Tk && key >= block_lo && key <= block_hi)) continue;
        for (int i = static_cast<int>(threadIdx.x); i < kTile * D; i += kThreads) {
            const int j = i / D, d = i % D;
            const bool in = s0 + j < geo.Tk;
            const T* row = kv + (b * geo.Tk + s0 + j) * kv_width;
            k_tile[j][d] = in ? to_float(row[g * D + d]) : 0.f;
            v_tile[j][d] = in ? to_float(row[(geo.Hkv + g) * D + d]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < rows_per_warp; ++i) {
            const int r = warp + i * kWarps;
            const bool visible = s < geo.Tk && key >= row_first[r] && key <= row_last[r];
            if (!__any_sync(kFullMask, visible)) continue;
            float ds = 0.f;
            if (visible) {
                const float p = expf(dot_rows<D>(q_tile[r], k_tile[lane]) * geo.scale - row_lse[r]);
                ds = p * (dot_rows<D>(dout_tile[r], v_tile[lane]) - row_delta[r]) * geo.scale;
            }
            dscores[warp][lane] = ds;
            __syncwarp();
#pragma unroll
            for (int e = 0; e < per_lane; ++e)
                for (int j = 0; j < kTile; ++j) grad[i][e] += dscores[warp][j] * k_tile[j][lane + 32 * e];
            __syncwarp();
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < rows_per_warp; ++i) {
        const int64_t t = t0 + warp + i * kWarps;
        if (t >= geo.Tq) continue;
        float* dq_row = dq + (b * geo.Tq + t) * out_width + h * D;
#pragma unroll
        for (int e = 0; e < per_lane; ++e) dq_row[lane + 32 * e] += grad[i][e];
    }
}

// grid (ceil(Tk / kDkvKeys), Hkv, B). Warp w owns keys w and w + 4 of the block's 8 and walks
// the kv head's query heads, then the query tiles, in order.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) block_dkv_kernel(float* dkv, const float* delta, const T* dout, const float* lse, const T* qkv, const T* kv,
                                                             BlockGeometry geo) {
    constexpr int per_lane = D / 32;
    constexpr int keys_per_warp = kDkvKeys / kWarps;
    __shared__ float k_rows[kDkvKeys][D];
    __shared__ float v_rows[kDkvKeys][D];
    __shared__ float q_tile[kTile][D + 1];
    __shared__ float dout_tile[kTile][D + 1];
    __shared__ float query_lse[kTile];
    __shared__ float query_delta[kTile];
    __shared__ int32_t query_first[kTile];
    __shared__ int32_t query_last[kTile];
    __shared__ int32_t key_pos[kDkvKeys];
    __shared__ float probs[kWarps][kTile];
    __shared__ float dscores[kWarps][kTile];
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int64_t b = blockIdx.z, g = blockIdx.y, s0 = int64_t{blockIdx.x} * kDkvKeys;
    const int64_t qkv_width = geo.qkv_width(D), kv_width = geo.kv_width(D), out_width = geo.H * D;

    for (int i = static_cast<int>(threadIdx.x); i < kDkvKeys * D; i += kThreads) {
        const int k = i / D, d = i % D;
        const bool in = s0 + k < geo.Tk;
        const T* row = kv + (b * geo.Tk + s0 + k) * kv_width;
        k_rows[k][d] = in ? to_float(row[g * D + d]) : 0.f;
        v_rows[k][d] = in ? to_float(row[(geo.Hkv + g) * D + d]) : 0.f;
    }
    if (threadIdx.x < kDkvKeys) key_pos[threadIdx.x] = s0 + threadIdx.x < geo.Tk ? geo.kv_pos[s0 + threadIdx.x] : 0;
    __syncthreads();
    int32_t keys_lo = INT32_MAX, keys_hi = INT32_MIN;
    for (int k = 0; k < kDkvKeys && s0 + k < geo.Tk; ++k) {
        keys_lo = min(keys_lo, key_pos[k]);
        keys_hi = max(keys_hi, key_pos[k]);
    }

    float dk[keys_per_warp][per_lane] = {}, dv[keys_per_warp][per_lane] = {};
    for (int64_t h = g * geo.group(); h < (g + 1) * geo.group(); ++h)
        for (int64_t t0 = 0; t0 < geo.Tq; t0 += kTile) {
            // Query t0 + j (j = threadIdx.x < 32) of the tile: its window, empty when it lies
            // past the tile's end or saw no key at all (lse = -inf).
            int32_t first_j = kNoFirst, last_j = kNoLast;
            float lse_j = 0.f;
            if (threadIdx.x < kTile && t0 + threadIdx.x < geo.Tq) {
                const int64_t t = t0 + threadIdx.x;
                lse_j = lse[geo.lse_index(b, h, t)];
                if (lse_j != -INFINITY) {
                    first_j = geo.first_of(b, t);
                    last_j = geo.q_pos[t];
                } else {
                    lse_j = 0.f;
                }
            }
            const bool overlaps = first_j <= last_j && first_j <= keys_hi && keys_lo <= last_j;
            if (!__syncthreads_or(overlaps)) continue;  // no query of the tile sees a key of the block
            if (threadIdx.x < kTile) {
                const int64_t t = t0 + threadIdx.x;
                query_first[threadIdx.x] = first_j;
                query_last[threadIdx.x] = last_j;
                query_lse[threadIdx.x] = lse_j;
                query_delta[threadIdx.x] = t < geo.Tq ? delta[geo.lse_index(b, h, t)] : 0.f;
            }
            for (int i = static_cast<int>(threadIdx.x); i < kTile * D; i += kThreads) {
                const int j = i / D, d = i % D;
                const int64_t t = t0 + j;
                q_tile[j][d] = t < geo.Tq ? to_float(qkv[(b * geo.Tq + t) * qkv_width + h * D + d]) : 0.f;
                dout_tile[j][d] = t < geo.Tq ? to_float(dout[(b * geo.Tq + t) * out_width + h * D + d]) : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < keys_per_warp; ++i) {
                const int k = warp + i * kWarps;
                if (s0 + k >= geo.Tk) continue;
                const bool visible = key_pos[k] >= query_first[lane] && key_pos[k] <= query_last[lane];
                if (!__any_sync(kFullMask, visible)) continue;
                float p = 0.f, ds = 0.f;
                if (visible) {
                    p = expf(dot_rows<D>(q_tile[lane], k_rows[k]) * geo.scale - query_lse[lane]);
                    ds = p * (dot_rows<D>(dout_tile[lane], v_rows[k]) - query_delta[lane]) * geo.scale;
                }
                probs[warp][lane] = p;
                dscores[warp][lane] = ds;
                __syncwarp();
#pragma unroll
                for (int e = 0; e < per_lane; ++e)
                    for (int j = 0; j < kTile; ++j) {
                        dk[i][e] += dscores[warp][j] * q_tile[j][lane + 32 * e];
                        dv[i][e] += probs[warp][j] * dout_tile[j][lane + 32 * e];
                    }
                __syncwarp();
            }
            __syncthreads();
        }
#pragma unroll
    for (int i = 0; i < keys_per_warp; ++i) {
        const int64_t s = s0 + warp + i * kWarps;
        if (s >= geo.Tk) continue;
        float* row = dkv + (b * geo.Tk + s) * kv_width;
#pragma unroll
        for (int e = 0; e < per_lane; ++e) {
            row[g * D + lane + 32 * e] += dk[i][e];
            row[(geo.Hkv + g) * D + lane + 32 * e] += dv[i][e];
        }
    }
}

BlockGeometry geometry(const AttentionBlockDims& dims, const int32_t* q_positions, const int32_t* kv_positions, const int32_t* q_first) {
    return {dims.Tq, dims.Tk, dims.H, dims.Hkv, q_positions, kv_positions, q_first, 1.0f / std::sqrt(static_cast<float>(dims.D))};
}

// Calls fn.template operator()<D>() for the head dims the kernels are instantiated for.
template <class Fn>
void dispatch_head_dim(const char* op, int64_t D, Fn&& fn) {
    switch (D) {
        case 32: return fn.template operator()<32>();
        case 64: return fn.template operator()<64>();
        case 128: return fn.template operator()<128>();
        default: fail(ErrorKind::unsupported, op, ": head_dim ", D, "; the attention block kernels take 32, 64 or 128");
    }
}

template <class T>
__device__ __forceinline__ float element_to_float(T v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return to_float(v);
}
template <class T>
__device__ __forceinline__ T element_from_float(float v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return from_float<T>(v);
}

// One thread per copied element, grid-stride.
template <class Dst, class Src>
__global__ void copy_columns_kernel(Dst* dst, int64_t dst_width, const Src* src, int64_t src_width, int64_t rows, int64_t cols) {
    const int64_t total = rows * cols;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t n = i / cols, c = i % cols;
        dst[n * dst_width + c] = element_from_float<Dst>(element_to_float(src[n * src_width + c]));
    }
}

template <class Fn>
void dispatch_element(Element e, Fn&& fn) {
    switch (e) {
        case Element::f32: return fn.template operator()<float>();
        case Element::bf16: return fn.template operator()<__nv_bfloat16>();
        case Element::f16: return fn.template operator()<__half>();
    }
}

}  // namespace

void launch_attention_block_fwd(Half t, float* acc, float* lse, const void* qkv, const void* kv, const AttentionBlockDims& dims, const int32_t* q_positions,
                                const int32_t* kv_positions, const int32_t* q_first, bool first, cudaStream_t stream) {
    if (dims.B <= 0 || dims.Tq <= 0 || dims.Tk <= 0) return;
    const BlockGeometry geo = geometry(dims, q_positions, kv_positions, q_first);
    const dim3 grid(static_cast<unsigned>(ceil_div(dims.Tq, int64_t{kFwdRows})), static_cast<unsigned>(dims.H), static_cast<unsigned>(dims.B));
    dispatch_half(t, [&]<class E>() {
        dispatch_head_dim("attention_block_fwd", dims.D, [&]<int HD>() {
            block_fwd_kernel<E, HD><<<grid, kThreads, 0, stream>>>(acc, lse, static_cast<const E*>(qkv), static_cast<const E*>(kv), geo, first);
            check_launch("attention_block_fwd");
        });
    });
}

size_t attention_block_bwd_scratch_bytes(const AttentionBlockDims& dims) { return static_cast<size_t>(dims.B * dims.H * dims.Tq) * sizeof(float); }

void launch_attention_block_bwd(Half t, float* dq, float* dkv, const void* dout, const void* out, const float* lse, const void* qkv, const void* kv,
                                const AttentionBlockDims& dims, const int32_t* q_positions, const int32_t* kv_positions, const int32_t* q_first,
                                void* scratch, cudaStream_t stream) {
    if (dims.B <= 0 || dims.Tq <= 0 || dims.Tk <= 0) return;
    const BlockGeometry geo = geometry(dims, q_positions, kv_positions, q_first);
    auto* delta = static_cast<float*>(scratch);
    const dim3 dq_grid(static_cast<unsigned>(ceil_div(dims.Tq, int64_t{kDqRows})), static_cast<unsigned>(dims.H), static_cast<unsigned>(dims.B));
    const dim3 dkv_grid(static_cast<unsigned>(ceil_div(dims.Tk, int64_t{kDkvKeys})), static_cast<unsigned>(dims.Hkv), static_cast<unsigned>(dims.B));
    dispatch_half(t, [&]<class E>() {
        dispatch_head_dim("attention_block_bwd", dims.D, [&]<int HD>() {
            const auto* q = static_cast<const E*>(qkv);
            const auto* k = static_cast<const E*>(kv);
            const auto* d_out = static_cast<const E*>(dout);
            block_dq_kernel<E, HD><<<dq_grid, kThreads, 0, stream>>>(dq, delta, d_out, static_cast<const E*>(out), lse, q, k, geo);
            check_launch("attention_block_bwd dq");
            block_dkv_kernel<E, HD><<<dkv_grid, kThreads, 0, stream>>>(dkv, delta, d_out, lse, q, k, geo);
            check_launch("attention_block_bwd dk dv");
        });
    });
}

void launch_copy_columns(Element dst_type, void* dst, int64_t dst_width, Element src_type, const void* src, int64_t src_width, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    constexpr int threads = 256;
    const auto blocks = static_cast<unsigned>(std::min(ceil_div(rows * cols, int64_t{threads}), int64_t{1} << 20));
    dispatch_element(dst_type, [&]<class Dst>() {
        dispatch_element(src_type, [&]<class Src>() {
            copy_columns_kernel<Dst, Src><<<blocks, threads, 0, stream>>>(static_cast<Dst*>(dst), dst_width, static_cast<const Src*>(src), src_width, rows, cols);
            check_launch("copy_columns");
        });
    });
}

}  // namespace llmtrain::kernels

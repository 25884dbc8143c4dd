// Causal flash attention with grouped-query heads on tensor cores (WMMA 16x16x16, fp32
// accumulators), never holding a T x T matrix in global memory.
//
// Query head h reads kv head g = h / (H / Hkv) from the packed qkv rows [q heads | k heads | v heads].
// Forward, per query row t (scores in fp32, scale = 1/sqrt(D)):
//   S_ts = scale * q_t . k_s for first(t) <= s <= t,  lse_t = log sum_s exp(S_ts),  out_t = sum_s exp(S_ts - lse_t) v_s.
// It walks the key blocks with an online softmax: running max m and denominator l per row; when
// m grows, l and the output accumulator are rescaled by exp(m_old - m_new).
// Backward, with P = exp(S - lse), dP = dout v^T, Delta_t = rowsum(dout_t * out_t) (= rowsum(P dP)):
//   dS = P (dP - Delta),  dq = scale * dS k,  dk = scale * dS^T q,  dv = P^T dout,
// where dk and dv of a kv head sum over its group of query heads. Deterministic without atomics:
// one kernel owns a key block and loops over the group's query heads and the query blocks at or
// after it (dk, dv); another owns a query block and loops over the key blocks up to the diagonal
// (dq). Every sum has a fixed order.
//
// first(t) = 0 (causal), or with a document mask the start of t's document (doc_starts, non-
// decreasing within a sequence): then the key tiles before the first start of a query tile, and
// the query tiles whose first start lies past a key tile, are wholly masked and skipped.
//
// Tiles are 64 query rows x 64 keys. The 16-bit tiles (q, k, v, dout) are staged in shared
// memory; score tiles go through shared memory in fp32 so that plain threads apply the causal
// mask and the softmax, then back as 16-bit probabilities for the next WMMA. Rows past the end
// of the sequence are zero-filled on load, masked in the scores and never written. The tiles a
// loop step loads (k and v, or q, dout and the row statistics) are fetched into registers one
// step ahead, so global-memory latency overlaps the tensor-core work of the step before.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "core/attention_head_dims.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int tile_rows = 64;             // query rows and keys per tile
constexpr int score_ld = tile_rows + 4;   // fp32 score tile row stride: padding spreads the banks
constexpr int prob_ld = tile_rows + 8;    // 16-bit probability tile row stride
constexpr int fwd_threads = 128;          // 4 warps, each owning 16 query rows
constexpr int bwd_threads = 256;          // 8 warps sharing every tile

// Row strides and sizes in shared memory for head dim D; every buffer starts 128-byte aligned
// and every 16x16 fragment 32-byte aligned, as WMMA requires.
template <int D>
struct TileShape {
    static constexpr int half_ld = D + 8;  // 16-bit q/k/v/dout tile stride (elements)
    static constexpr int acc_ld = D + 4;   // fp32 output accumulator tile stride
    static constexpr int half_bytes = tile_rows * half_ld * 2;
    static constexpr int score_bytes = tile_rows * score_ld * 4;
    static constexpr int acc_bytes = tile_rows * acc_ld * 4;
    // Forward: q, k, v, scores (the warp's probabilities overwrite its own scores), output.
    static constexpr int fwd_smem = 3 * half_bytes + score_bytes + acc_bytes;
    static constexpr int prob_bytes = tile_rows * prob_ld * 2;
    // Backward: four 16-bit tiles, the fp32 scores and dP, 16-bit dS, lse and Delta, then the
    // 16-bit P that only the dk/dv kernel needs.
    static constexpr int dq_smem = 4 * half_bytes + 2 * score_bytes + prob_bytes + 2 * tile_rows * 4;
    static constexpr int dkdv_smem = dq_smem + prob_bytes;
    static_assert(half_bytes % 128 == 0 && score_bytes % 128 == 0 && acc_bytes % 128 == 0 && prob_bytes % 128 == 0);
    static_assert(2 * half_bytes >= acc_bytes && 2 * score_bytes >= acc_bytes, "staging buffers overlay the tiles");
};

template <class T>
__device__ T from_float(float x);
template <>
__device__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Copies `rows` rows of D elements (16-byte vectors) from global memory into a shared tile of
// tile_rows rows; the rows past `rows` become zeros, so padded keys and queries contribute nothing
// (not even NaN * 0).
template <class T, int D>
__device__ void load_tile(T* tile, const T* src, int64_t src_ld, int rows, int tid, int threads) {
    constexpr int vecs = D / 8;
    for (int i = tid; i < tile_rows * vecs; i += threads) {
        const int r = i / vecs, c = (i % vecs) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows) v = *reinterpret_cast<const uint4*>(src + r * src_ld + c);
        *reinterpret_cast<uint4*>(tile + r * TileShape<D>::half_ld + c) = v;
    }
}

// The next step's 16-bit tile, fetched into registers while the current step computes and
// written to its shared buffer after the step's last read of it: the global-memory latency hides
// behind the tensor-core work instead of stalling every step between two barriers. The rows past
// `rows` become zeros, as in load_tile.
template <class T, int D, int threads>
struct TileInFlight {
    static constexpr int vecs_per_row = D / 8;
    static constexpr int per_thread = tile_rows * vecs_per_row / threads;
    static_assert(tile_rows * vecs_per_row % threads == 0, "every thread carries the same number of 16-byte vectors");
    uint4 v[per_thread];

    __device__ void fetch(const T* src, int64_t src_ld, int rows, int tid) {
        for (int i = 0; i < per_thread; ++i) {
            const int e = tid + i * threads, r = e / vecs_per_row, c = (e % vecs_per_row) * 8;
            v[i] = r < rows ? *reinterpret_cast<const uint4*>(src + r * src_ld + c) : make_uint4(0, 0, 0, 0);
        }
    }
    __device__ void store(T* tile, int tid) const {
        for (int i = 0; i < per_thread; ++i) {
            const int e = tid + i * threads, r = e / vecs_per_row, c = (e % vecs_per_row) * 8;
            *reinterpret_cast<uint4*>(tile + r * TileShape<D>::half_ld + c) = v[i];
        }
    }
};

// Writes the first `rows` rows of an fp32 tile (stride acc_ld), times `factor`, as 16-bit.
template <class T, int D>
__device__ void store_rows(T* dst, int64_t dst_ld, const float* tile, float factor, int rows, int tid, int threads) {
    constexpr int vecs = D / 8;
    for (int i = tid; i < tile_rows * vecs; i += threads) {
        const int r = i / vecs, c = (i % vecs) * 8;
        if (r >= rows) continue;
        alignas(16) T packed[8];
        for (int e = 0; e < 8; ++e) packed[e] = from_float<T>(tile[r * TileShape<D>::acc_ld + c + e] * factor);
        uint4 v;
        memcpy(&v, packed, sizeof v);  // not a type-punned load: packed holds T objects
        *reinterpret_cast<uint4*>(dst + r * dst_ld + c) = v;
    }
}

// Loads the per-row softmax statistics of a query tile; padded rows get zeros (they are masked).
__device__ void load_row_stats(float* lse_tile, float* delta_tile, const float* lse, const float* delta, int rows, int tid) {
    for (int r = tid; r < tile_rows; r += bwd_threads) {
        lse_tile[r] = r < rows ? lse[r] : 0.f;
        delta_tile[r] = r < rows ? delta[r] : 0.f;
    }
}

// The next step's lse and Delta of a query tile, in flight like TileInFlight: thread r < 64
// carries lse of row r, thread 64 + r its Delta (padded rows get zeros: they are masked).
struct RowStatsInFlight {
    float value = 0.f;
    __device__ void fetch(const float* lse, const float* delta, int rows, int tid) {
        const int r = tid % tile_rows;
        if (tid < 2 * tile_rows) value = r < rows ? (tid < tile_rows ? lse : delta)[r] : 0.f;
    }
    __device__ void store(float* lse_tile, float* delta_tile, int tid) const {
        if (tid < tile_rows) lse_tile[tid] = value;
        else if (tid < 2 * tile_rows) delta_tile[tid - tile_rows] = value;
    }
};
static_assert(bwd_threads >= 2 * tile_rows, "a thread per row statistic");

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

// acc[j] = A[16 rows] . B[16 rows j]^T over D columns for N column tiles: a 16 x 16N block of
// A B^T where A and B are row-major 16-bit tiles (stride half_ld), e.g. q k^T.
template <class T, int D, int N>
__device__ void mma_abt(Acc (&acc)[N], const T* a, const T* b) {
    constexpr int ld = TileShape<D>::half_ld;
    for (int j = 0; j < N; ++j) wmma::fill_fragment(acc[j], 0.f);
    for (int k = 0; k < D; k += 16) {
        FragA<T> fa;
        wmma::load_matrix_sync(fa, a + k, ld);
        for (int j = 0; j < N; ++j) {
            FragBCol<T> fb;
            wmma::load_matrix_sync(fb, b + 16 * j * ld + k, ld);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
    }
}

// acc[j] += P[16 rows, 64] . V[64, 16 columns j]: P a 16-bit probability tile (stride prob_ld),
// V a row-major 16-bit tile (stride half_ld) already offset to the first column tile.
template <class T, int D, int N>
__device__ void mma_pv(Acc (&acc)[N], const T* p, const T* v) {
    constexpr int ld = TileShape<D>::half_ld;
#pragma unroll 2
    for (int k = 0; k < tile_rows; k += 16) {
        FragA<T> fa;
        wmma::load_matrix_sync(fa, p + k, prob_ld);
        for (int j = 0; j < N; ++j) {
            FragBRow<T> fb;
            wmma::load_matrix_sync(fb, v + k * ld + 16 * j, ld);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
    }
}

struct Heads {
    int T, H, Hkv, group;  // group = H / Hkv
    int64_t qkv_ld, out_ld;
    float scale;
    const int32_t* doc_starts;  // [B*T], or null: causal
    // The first key row t of sequence b sees (t < T).
    __device__ int first_key(int b, int t) const { return doc_starts ? doc_starts[static_cast<int64_t>(b) * T + t] : 0; }
};

// ---------------------------------------------------------------- forward

// One block per (batch, query head, query tile); warp w owns query rows [16w, 16w + 16) of the
// tile from the scores to the output, so only the k/v loads need block barriers.
template <class T, int D>
__global__ void __launch_bounds__(fwd_threads) attention_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv, Heads hd) {
    using S = TileShape<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T* q_tile = reinterpret_cast<T*>(smem);
    T* k_tile = reinterpret_cast<T*>(smem + S::half_bytes);
    T* v_tile = reinterpret_cast<T*>(smem + 2 * S::half_bytes);
    float* scores = reinterpret_cast<float*>(smem + 3 * S::half_bytes);
    float* acc_tile = reinterpret_cast<float*>(smem + 3 * S::half_bytes + S::score_bytes);

    const int b = blockIdx.x / hd.H, h = blockIdx.x % hd.H, g = h / hd.group;
    const int qb = gridDim.y - 1 - blockIdx.y;  // the longest rows start first
    const int q0 = qb * tile_rows;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const T* seq = qkv + static_cast<int64_t>(b) * hd.T * hd.qkv_ld;
    load_tile<T, D>(q_tile, seq + q0 * hd.qkv_ld + h * D, hd.qkv_ld, min(tile_rows, hd.T - q0), tid, fwd_threads);

    // Lane pair (2r, 2r + 1) handles row r of the warp's 16 rows, the even / odd columns.
    const int row = lane / 2, part = lane % 2;
    const int query = q0 + 16 * warp + row;
    const int last_key = min(query, hd.T - 1);  // keys past it are masked (causal, or padding)
    const int first_key = hd.first_key(b, last_key);  // keys before it belong to earlier documents
    const int first_kb = hd.first_key(b, q0) / tile_rows;  // the tiles before it are masked for every row
    float* warp_scores = scores + 16 * warp * score_ld;
    T* warp_probs = reinterpret_cast<T*>(warp_scores);
    float* warp_acc = acc_tile + 16 * warp * S::acc_ld;
    for (int c = part; c < D; c += 2) warp_acc[row * S::acc_ld + c] = 0.f;
    float m = -INFINITY, l = 0.f;

    // k and v of key tile kb + 1 travel while tile kb computes.
    TileInFlight<T, D, fwd_threads> k_next, v_next;
    const auto fetch_keys = [&](int kb) {
        const int k0 = kb * tile_rows, rows = min(tile_rows, hd.T - k0);
        const T* keys = seq + k0 * hd.qkv_ld;
        k_next.fetch(keys + (hd.H + g) * D, hd.qkv_ld, rows, tid);
        v_next.fetch(keys + (hd.H + hd.Hkv + g) * D, hd.qkv_ld, rows, tid);
    };
    fetch_keys(first_kb);
    for (int kb = first_kb; kb <= qb; ++kb) {
        const int k0 = kb * tile_rows;
        __syncthreads();  // every warp is done with the previous k and v
        k_next.store(k_tile, tid);
        v_next.store(v_tile, tid);
        __syncthreads();
        if (kb < qb) fetch_keys(kb + 1);

        Acc s[tile_rows / 16];
        mma_abt<T, D>(s, q_tile + 16 * warp * S::half_ld, k_tile);
        for (int j = 0; j < tile_rows / 16; ++j) wmma::store_matrix_sync(warp_scores + 16 * j, s[j], score_ld, wmma::mem_row_major);
        __syncwarp();

        float p[tile_rows / 2];
        float block_max = -INFINITY;
        for (int j = 0; j < tile_rows / 2; ++j) {
            const int c = 2 * j + part;
            p[j] = k0 + c <= last_key && k0 + c >= first_key ? warp_scores[row * score_ld + c] * hd.scale : -INFINITY;
            block_max = fmaxf(block_max, p[j]);
        }
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
        const float m_new = fmaxf(m, block_max);
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row: exp(-inf - 0) = 0, never -inf - -inf
        const float alpha = expf(m - m_ref);
        float sum = 0.f;
        for (int j = 0; j < tile_rows / 2; ++j) sum += (p[j] = expf(p[j] - m_ref));
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();  // the whole warp has read its scores before the probabilities overwrite them
        for (int j = 0; j < tile_rows / 2; ++j) warp_probs[row * prob_ld + 2 * j + part] = from_float<T>(p[j]);
        for (int c = part; c < D; c += 2) warp_acc[row * S::acc_ld + c] *= alpha;
        __syncwarp();

        Acc o[D / 16];
        for (int j = 0; j < D / 16; ++j) wmma::load_matrix_sync(o[j], warp_acc + 16 * j, S::acc_ld, wmma::mem_row_major);
        mma_pv<T, D>(o, warp_probs, v_tile);
        for (int j = 0; j < D / 16; ++j) wmma::store_matrix_sync(warp_acc + 16 * j, o[j], S::acc_ld, wmma::mem_row_major);
    }
    __syncwarp();

    if (query >= hd.T) return;  // no barrier follows
    if (part == 0) lse[(static_cast<int64_t>(b) * hd.H + h) * hd.T + query] = m + logf(l);
    const float inv_l = 1.f / l;
    T* dst = out + (static_cast<int64_t>(b) * hd.T + query) * hd.out_ld + h * D;
    for (int c = part * (D / 2); c < (part + 1) * (D / 2); c += 8) {
        alignas(16) T packed[8];
        for (int e = 0; e < 8; ++e) packed[e] = from_float<T>(warp_acc[row * S::acc_ld + c + e] * inv_l);
        uint4 v;
        memcpy(&v, packed, sizeof v);
        *reinterpret_cast<uint4*>(dst + c) = v;
    }
}

// ---------------------------------------------------------------- backward

// delta[(b H + h) T + t] = sum_d dout[b T + t, h D + d] * out[b T + t, h D + d]: D / 8 lanes
// per (row, head) item, each reading 8 elements of both in one 16-byte load, summed in a
// fixed butterfly. Every lane of a warp reaches the shuffles; lanes past the last item
// contribute nothing and write nothing.
template <int D>
constexpr int delta_lanes = D / 8;

template <class T, int D>
__global__ void attention_bwd_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout, const T* __restrict__ out, int64_t rows, int T_len,
                                           int H) {
    constexpr int lanes = delta_lanes<D>;
    static_assert(32 % lanes == 0, "an item's lanes lie in one warp");
    const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lanes;  // row n, head h: n H + h
    const int part = static_cast<int>(threadIdx.x % lanes);
    const bool active = item < rows * H;
    float sum = 0.f;
    if (active) {
        // The rows of out and dout are [H heads x D]: (row, head) starts at item * D.
        const int64_t offset = item * D + part * 8;
        alignas(16) T a[8], b[8];
        const uint4 va = *reinterpret_cast<const uint4*>(dout + offset), vb = *reinterpret_cast<const uint4*>(out + offset);
        memcpy(a, &va, sizeof va);
        memcpy(b, &vb, sizeof vb);
        for (int e = 0; e < 8; ++e) sum += to_float(a[e]) * to_float(b[e]);
    }
    for (int mask = lanes / 2; mask > 0; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
    if (!active || part != 0) return;  // no barrier follows
    const int64_t n = item / H;
    const int h = static_cast<int>(item % H);
    delta[((n / T_len) * H + h) * T_len + n % T_len] = sum;
}

// Warp w of the 8 owns the 16-row strip w % 4 of a 64-row product and, of its columns, the half
// w / 4: two of the four 16-column score tiles, or D/32 of the D/16 head-dim tiles.
struct WarpTiles {
    int row, score_col, dim_col;
    template <int D>
    __device__ static WarpTiles of(int warp) {
        return {16 * (warp % 4), 32 * (warp / 4), (D / 2) * (warp / 4)};
    }
};

// The warp's 16 x 32 share of the 64 x 64 fp32 tile A B^T (A, B 16-bit 64 x D tiles), stored
// before the next product starts so that only one set of accumulators is live.
template <class T, int D>
__device__ void scores_of(float* dst, const T* a, const T* b, WarpTiles wt) {
    Acc acc[2];
    mma_abt<T, D>(acc, a + wt.row * TileShape<D>::half_ld, b + wt.score_col * TileShape<D>::half_ld);
    for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(dst + wt.row * score_ld + wt.score_col + 16 * j, acc[j], score_ld, wmma::mem_row_major);
}

// Two adjacent 16-bit elements from fp32, in one 4-byte store.
template <class T>
__device__ void store_pair(T* dst, float a, float b) {
    alignas(4) T packed[2] = {from_float<T>(a), from_float<T>(b)};
    uint32_t v;
    memcpy(&v, packed, sizeof v);
    *reinterpret_cast<uint32_t*>(dst) = v;
}

// Turns the fp32 score and dP tiles into the 16-bit P (when p_tile is not null) and dS tiles:
//   P = exp(scale S - lse) = 2^(log2(e) scale S - log2(e) lse),  dS = P (dP - Delta).
// Rows are keys and columns queries when keys_are_rows (the dk/dv kernel), the reverse
// otherwise. Each thread takes two adjacent columns (one 8-byte load from each fp32 tile, one
// 4-byte store into each 16-bit one) in every eighth row; a warp covers a row, so the loads
// and stores are contiguous. The row statistics of a thread's columns (keys_are_rows) or of
// its row are read once.
template <class T, bool keys_are_rows>
__device__ void probs_and_grads(T* p_tile, T* ds_tile, const float* scores, const float* dp, const float* lse_tile, const float* delta_tile, int q0,
                                int k0, int T_len, float scale, const int32_t* starts, int tid) {
    constexpr float log2e = 1.4426950408889634f;
    constexpr int pairs_per_row = tile_rows / 2, rows_per_pass = bwd_threads / pairs_per_row;
    static_assert(bwd_threads % pairs_per_row == 0 && tile_rows % rows_per_pass == 0, "every thread covers the same rows");
    const float scale2 = scale * log2e;
    const int c = 2 * (tid % pairs_per_row);
    float col_lse2[2] = {0.f, 0.f}, col_delta[2] = {0.f, 0.f};
    if constexpr (keys_are_rows)
        for (int e = 0; e < 2; ++e) col_lse2[e] = lse_tile[c + e] * log2e, col_delta[e] = delta_tile[c + e];
#pragma unroll 4
    for (int r = tid / pairs_per_row; r < tile_rows; r += rows_per_pass) {
        const float2 s = *reinterpret_cast<const float2*>(scores + r * score_ld + c);
        const float2 d = *reinterpret_cast<const float2*>(dp + r * score_ld + c);
        const float sv[2] = {s.x, s.y}, dv[2] = {d.x, d.y};
        const float row_lse2 = keys_are_rows ? 0.f : lse_tile[r] * log2e, row_delta = keys_are_rows ? 0.f : delta_tile[r];
        float p[2], ds[2];
        for (int e = 0; e < 2; ++e) {
            const int qi = keys_are_rows ? c + e : r, key = k0 + (keys_are_rows ? r : c + e), query = q0 + qi;
            const bool visible = key <= query && query < T_len && (!starts || key >= starts[query]);  // implies key < T_len
            p[e] = visible ? exp2f(sv[e] * scale2 - (keys_are_rows ? col_lse2[e] : row_lse2)) : 0.f;
            ds[e] = p[e] * (dv[e] - (keys_are_rows ? col_delta[e] : row_delta));
        }
        if (p_tile) store_pair(p_tile + r * prob_ld + c, p[0], p[1]);
        store_pair(ds_tile + r * prob_ld + c, ds[0], ds[1]);
    }
    __syncthreads();
}

// Backward buffers, in the order of TileShape: the two 16-bit tiles loaded once, the two loaded
// per step (contiguous, so an fp32 output tile can overlay them at the end), scores and dP
// (contiguous too), dS, lse, Delta and P.
template <class T, int D>
struct BwdSmem {
    T *fixed_a, *fixed_b, *step_a, *step_b;
    float *scores, *dp;
    T* ds;
    float *lse, *delta;
    T* p;
    __device__ static BwdSmem carve(unsigned char* smem) {
        using S = TileShape<D>;
        unsigned char* f = smem + 4 * S::half_bytes;
        unsigned char* stats = f + 2 * S::score_bytes + S::prob_bytes;
        return {reinterpret_cast<T*>(smem),
                reinterpret_cast<T*>(smem + S::half_bytes),
                reinterpret_cast<T*>(smem + 2 * S::half_bytes),
                reinterpret_cast<T*>(smem + 3 * S::half_bytes),
                reinterpret_cast<float*>(f),
                reinterpret_cast<float*>(f + S::score_bytes),
                reinterpret_cast<T*>(f + 2 * S::score_bytes),
                reinterpret_cast<float*>(stats),
                reinterpret_cast<float*>(stats) + tile_rows,
                reinterpret_cast<T*>(stats + 2 * tile_rows * 4)};
    }
};

// One block per (batch, kv head, key tile): dk and dv of its 64 keys, summed over the group's
// query heads (in order) and the query tiles at or after the key tile (in order), in registers.
template <class T, int D>
__global__ void __launch_bounds__(bwd_threads, D <= 64 ? 2 : 1)
    attention_bwd_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                              const float* __restrict__ delta, Heads hd) {
    using S = TileShape<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    const BwdSmem<T, D> sm = BwdSmem<T, D>::carve(smem);
    T *k_tile = sm.fixed_a, *v_tile = sm.fixed_b, *q_tile = sm.step_a, *dout_tile = sm.step_b;

    const int b = blockIdx.x / hd.Hkv, g = blockIdx.x % hd.Hkv;
    const int kb = blockIdx.y, k0 = kb * tile_rows;  // the first key tiles have the most work
    const int n_qb = (hd.T + tile_rows - 1) / tile_rows;
    const int tid = threadIdx.x;
    const WarpTiles wt = WarpTiles::of<D>(tid / 32);
    const int64_t seq_row = static_cast<int64_t>(b) * hd.T;
    const T* keys = qkv + (seq_row + k0) * hd.qkv_ld;
    load_tile<T, D>(k_tile, keys + (hd.H + g) * D, hd.qkv_ld, min(tile_rows, hd.T - k0), tid, bwd_threads);
    load_tile<T, D>(v_tile, keys + (hd.H + hd.Hkv + g) * D, hd.qkv_ld, min(tile_rows, hd.T - k0), tid, bwd_threads);

    Acc dk[D / 32], dv[D / 32];
    for (int j = 0; j < D / 32; ++j) {
        wmma::fill_fragment(dk[j], 0.f);
        wmma::fill_fragment(dv[j], 0.f);
    }
    // Step i is query head g * group + i / tiles_per_head and query tile kb + i % tiles_per_head:
    // the heads in order, and within a head the query tiles in order. Step i + 1's q, dout and
    // row statistics travel while step i computes.
    // Query tiles whose first row starts its document after this key tile's last key see none
    // of it, nor do the tiles after them (the starts do not decrease): they are skipped.
    int end_qb = n_qb;
    while (end_qb > kb + 1 && hd.first_key(b, (end_qb - 1) * tile_rows) > min(k0 + tile_rows, hd.T) - 1) --end_qb;
    const int tiles_per_head = end_qb - kb, steps = hd.group * tiles_per_head;
    const int32_t* starts = hd.doc_starts ? hd.doc_starts + seq_row : nullptr;
    TileInFlight<T, D, bwd_threads> q_next, dout_next;
    RowStatsInFlight stats_next;
    const auto fetch_queries = [&](int i) {
        const int h = g * hd.group + i / tiles_per_head, q0 = (kb + i % tiles_per_head) * tile_rows, rows = min(tile_rows, hd.T - q0);
        const int64_t stats = (static_cast<int64_t>(b) * hd.H + h) * hd.T + q0;
        q_next.fetch(qkv + (seq_row + q0) * hd.qkv_ld + h * D, hd.qkv_ld, rows, tid);
        dout_next.fetch(dout + (seq_row + q0) * hd.out_ld + h * D, hd.out_ld, rows, tid);
        stats_next.fetch(lse + stats, delta + stats, rows, tid);
    };
    fetch_queries(0);
    for (int i = 0; i < steps; ++i) {
        const int q0 = (kb + i % tiles_per_head) * tile_rows;
        __syncthreads();  // the previous step is done with q, dout, P, dS and the row statistics
        q_next.store(q_tile, tid);
        dout_next.store(dout_tile, tid);
        stats_next.store(sm.lse, sm.delta, tid);
        __syncthreads();
        if (i + 1 < steps) fetch_queries(i + 1);

        // S^T = k q^T and dP^T = v dout^T: rows are keys, columns queries.
        scores_of<T, D>(sm.scores, k_tile, q_tile, wt);
        scores_of<T, D>(sm.dp, v_tile, dout_tile, wt);
        __syncthreads();
        probs_and_grads<T, true>(sm.p, sm.ds, sm.scores, sm.dp, sm.lse, sm.delta, q0, k0, hd.T, hd.scale, starts, tid);

        // dv += P^T dout, dk += dS^T q.
        mma_pv<T, D>(dv, sm.p + wt.row * prob_ld, dout_tile + wt.dim_col);
        mma_pv<T, D>(dk, sm.ds + wt.row * prob_ld, q_tile + wt.dim_col);
    }

    // Stage both results in fp32 over the score and the q/dout buffers, then write the key rows.
    __syncthreads();
    float* dv_stage = sm.scores;
    float* dk_stage = reinterpret_cast<float*>(sm.step_a);
    for (int j = 0; j < D / 32; ++j) {
        wmma::store_matrix_sync(dv_stage + wt.row * S::acc_ld + wt.dim_col + 16 * j, dv[j], S::acc_ld, wmma::mem_row_major);
        wmma::store_matrix_sync(dk_stage + wt.row * S::acc_ld + wt.dim_col + 16 * j, dk[j], S::acc_ld, wmma::mem_row_major);
    }
    __syncthreads();
    T* dkeys = dqkv + (seq_row + k0) * hd.qkv_ld;
    const int rows = min(tile_rows, hd.T - k0);
    store_rows<T, D>(dkeys + (hd.H + g) * D, hd.qkv_ld, dk_stage, hd.scale, rows, tid, bwd_threads);
    store_rows<T, D>(dkeys + (hd.H + hd.Hkv + g) * D, hd.qkv_ld, dv_stage, 1.f, rows, tid, bwd_threads);
}

// One block per (batch, query head, query tile): dq of its 64 rows over the key tiles up to the
// diagonal (in order), in registers.
template <class T, int D>
__global__ void __launch_bounds__(bwd_threads, 2)
    attention_bwd_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                            const float* __restrict__ delta, Heads hd) {
    using S = TileShape<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    const BwdSmem<T, D> sm = BwdSmem<T, D>::carve(smem);
    T *q_tile = sm.fixed_a, *dout_tile = sm.fixed_b, *k_tile = sm.step_a, *v_tile = sm.step_b;

    const int b = blockIdx.x / hd.H, h = blockIdx.x % hd.H, g = h / hd.group;
    const int qb = gridDim.y - 1 - blockIdx.y, q0 = qb * tile_rows;  // the longest rows start first
    const int rows = min(tile_rows, hd.T - q0);
    const int tid = threadIdx.x;
    const WarpTiles wt = WarpTiles::of<D>(tid / 32);
    const int64_t seq_row = static_cast<int64_t>(b) * hd.T;
    const int64_t stats = (static_cast<int64_t>(b) * hd.H + h) * hd.T + q0;
    load_tile<T, D>(q_tile, qkv + (seq_row + q0) * hd.qkv_ld + h * D, hd.qkv_ld, rows, tid, bwd_threads);
    load_tile<T, D>(dout_tile, dout + (seq_row + q0) * hd.out_ld + h * D, hd.out_ld, rows, tid, bwd_threads);
    load_row_stats(sm.lse, sm.delta, lse + stats, delta + stats, rows, tid);

    Acc dq[D / 32];
    for (int j = 0; j < D / 32; ++j) wmma::fill_fragment(dq[j], 0.f);
    // k and v of key tile kb + 1 travel while tile kb computes.
    TileInFlight<T, D, bwd_threads> k_next, v_next;
    const auto fetch_keys = [&](int kb) {
        const int k0 = kb * tile_rows, key_rows = min(tile_rows, hd.T - k0);
        const T* keys = qkv + (seq_row + k0) * hd.qkv_ld;
        k_next.fetch(keys + (hd.H + g) * D, hd.qkv_ld, key_rows, tid);
        v_next.fetch(keys + (hd.H + hd.Hkv + g) * D, hd.qkv_ld, key_rows, tid);
    };
    const int first_kb = hd.first_key(b, q0) / tile_rows;  // earlier key tiles are masked for every row
    const int32_t* starts = hd.doc_starts ? hd.doc_starts + seq_row : nullptr;
    fetch_keys(first_kb);
    for (int kb = first_kb; kb <= qb; ++kb) {
        const int k0 = kb * tile_rows;
        __syncthreads();  // the previous step is done with k, v and dS
        k_next.store(k_tile, tid);
        v_next.store(v_tile, tid);
        __syncthreads();
        if (kb < qb) fetch_keys(kb + 1);

        // S = q k^T and dP = dout v^T: rows are queries, columns keys.
        scores_of<T, D>(sm.scores, q_tile, k_tile, wt);
        scores_of<T, D>(sm.dp, dout_tile, v_tile, wt);
        __syncthreads();
        probs_and_grads<T, false>(static_cast<T*>(nullptr), sm.ds, sm.scores, sm.dp, sm.lse, sm.delta, q0, k0, hd.T, hd.scale, starts, tid);

        // dq += dS k.
        mma_pv<T, D>(dq, sm.ds + wt.row * prob_ld, k_tile + wt.dim_col);
    }

    __syncthreads();
    float* dq_stage = sm.scores;
    for (int j = 0; j < D / 32; ++j)
        wmma::store_matrix_sync(dq_stage + wt.row * S::acc_ld + wt.dim_col + 16 * j, dq[j], S::acc_ld, wmma::mem_row_major);
    __syncthreads();
    store_rows<T, D>(dqkv + (seq_row + q0) * hd.qkv_ld + h * D, hd.qkv_ld, dq_stage, hd.scale, rows, tid, bwd_threads);
}

// ---------------------------------------------------------------- launchers

Heads heads_of(int64_t T, int64_t H, int64_t Hkv, int64_t D, const int32_t* doc_starts) {
    return {static_cast<int>(T), static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(H / Hkv), (H + 2 * Hkv) * D, H * D,
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), doc_starts};
}

// Calls f.template operator()<T, D>() for the 16-bit type and the head dim, one instantiation
// per entry of native_attention_head_dims (nothing for an empty batch: a grid of size 0 is a
// launch error).
template <class T, size_t... I, class F>
void with_head_dim(int64_t D, F&& f, std::index_sequence<I...>) {
    ((D == native_attention_head_dims[I] ? (f.template operator()<T, static_cast<int>(native_attention_head_dims[I])>(), true) : false) || ...);
}

template <class F>
void dispatch(const char* op, Half t, int64_t D, int64_t B, int64_t T, int64_t H, F&& f) {
    if (!native_attention_takes(D)) fail(ErrorKind::unsupported, op, ": head_dim ", D, " is not supported (", native_attention_head_dims_text(), ")");
    if (B * T * H == 0) return;
    const int64_t tiles = (T + tile_rows - 1) / tile_rows;  // grid y, at most 65535
    if (tiles > 65535 || B * H > INT32_MAX || (B * T * H + 7) / 8 > INT32_MAX)
        fail(ErrorKind::unsupported, op, ": batch ", B, ", seq_len ", T, ", heads ", H, " exceed the launch grid");
    constexpr auto dims = std::make_index_sequence<native_attention_head_dims.size()>{};
    if (t == Half::bf16) with_head_dim<__nv_bfloat16>(D, f, dims);
    else with_head_dim<__half>(D, f, dims);
}

template <class Kernel>
void allow_smem(Kernel kernel, int bytes, const char* name) {
    const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it so that later launch checks do not report it
        fail(ErrorKind::unsupported, name, ": ", bytes, " bytes of shared memory: ", cudaGetErrorString(status));
    }
}

}  // namespace

void launch_attention_fwd(Half t, void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                          const int32_t* doc_starts, cudaStream_t stream) {
    dispatch("attention_fwd", t, D, B, T, H, [&]<class E, int HD>() {
        constexpr int smem = TileShape<HD>::fwd_smem;
        allow_smem(attention_fwd_kernel<E, HD>, smem, "attention_fwd_kernel");
        const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((T + tile_rows - 1) / tile_rows));
        attention_fwd_kernel<E, HD><<<grid, fwd_threads, smem, stream>>>(static_cast<E*>(out), lse, static_cast<const E*>(qkv),
                                                                                 heads_of(T, H, Hkv, HD, doc_starts));
        check_launch("attention_fwd_kernel");
    });
}

size_t attention_bwd_scratch_bytes(int64_t B, int64_t T, int64_t H) { return static_cast<size_t>(B * H * T) * sizeof(float); }

void launch_attention_bwd(Half t, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, int64_t B, int64_t T, int64_t H,
                          int64_t Hkv, int64_t D, const int32_t* doc_starts, void* scratch, cudaStream_t stream) {
    dispatch("attention_bwd", t, D, B, T, H, [&]<class E, int HD>() {
        float* delta = static_cast<float*>(scratch);
        const Heads hd = heads_of(T, H, Hkv, HD, doc_starts);
        const int64_t delta_items = B * T * H;
        constexpr int delta_threads = 256;
        const int64_t delta_blocks = (delta_items * delta_lanes<HD> + delta_threads - 1) / delta_threads;
        attention_bwd_delta_kernel<E, HD>
            <<<static_cast<unsigned>(delta_blocks), delta_threads, 0, stream>>>(delta, static_cast<const E*>(dout), static_cast<const E*>(out), B * T,
                                                                                 static_cast<int>(T), static_cast<int>(H));
        check_launch("attention_bwd_delta_kernel");

        const unsigned tiles = static_cast<unsigned>((T + tile_rows - 1) / tile_rows);
        constexpr int dkdv_smem = TileShape<HD>::dkdv_smem, dq_smem = TileShape<HD>::dq_smem;
        allow_smem(attention_bwd_dkdv_kernel<E, HD>, dkdv_smem, "attention_bwd_dkdv_kernel");
        attention_bwd_dkdv_kernel<E, HD><<<dim3(static_cast<unsigned>(B * Hkv), tiles), bwd_threads, dkdv_smem, stream>>>(
            static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, delta, hd);
        check_launch("attention_bwd_dkdv_kernel");

        allow_smem(attention_bwd_dq_kernel<E, HD>, dq_smem, "attention_bwd_dq_kernel");
        attention_bwd_dq_kernel<E, HD><<<dim3(static_cast<unsigned>(B * H), tiles), bwd_threads, dq_smem, stream>>>(
            static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, delta, hd);
        check_launch("attention_bwd_dq_kernel");
    });
}

}  // namespace llmtrain::kernels

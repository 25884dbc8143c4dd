// LayerNorm and RMSNorm over the C channels of each row (token).
//   LayerNorm: xhat = (x - mean) rstd, rstd = 1 / sqrt(mean((x - mean)^2) + eps), out = xhat w + b
//   RMSNorm:   xhat = x rstd,          rstd = 1 / sqrt(mean(x^2) + eps),           out = xhat w
// Backward, with g = dout w (mean(g) taken as 0 for RMSNorm):
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw += sum_rows dout xhat,  db += sum_rows dout
// Row statistics: one warp per row, fp32, the variance in a second pass over the row (more
// accurate than E[x^2] - mean^2); mean and rstd are saved in fp32 and backward recomputes
// xhat from them exactly as forward did. add_norm_fwd first adds the residual (a + b, kept as
// the stream's next value) in the same pass.
// dw and db reduce over rows with the column sums of half_types.cuh. Atomics would make the
// sums depend on timing, so a first kernel writes per-(row chunk, column) partial sums to
// scratch (each column summed by a fixed thread over a fixed set of rows, then across the
// block's row groups in order) and a second adds the chunks in order into dw and db. They run
// before dx is written, so dx may alias dout. (A one-pass form, each warp adding its rows'
// terms in registers over 1024 warps, measured twice as slow on an H100: docs/performance.md.)
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // rows per block in the row kernels

// Butterfly sum: every lane gets the same total, in the same order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// One warp per row; lane l handles columns [l*VEC, l*VEC + VEC) + k*32*VEC. mean is null
// for RMSNorm (the statistics are then about 0), b may be null.
template <class T, int VEC, bool LAYER>
__global__ void __launch_bounds__(kThreads) norm_fwd_kernel(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N, int64_t C,
                                                            float eps) {
    const int lane = threadIdx.x % 32;
    const int64_t n = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (n >= N) return;  // whole warps leave; no block barrier below
    const T* xr = x + n * C;
    const int64_t step = 32 * VEC;

    float mu = 0.0f;
    if constexpr (LAYER) {
        float sum = 0.0f;
        for (int64_t c = lane * VEC; c < C; c += step) {
            float v[VEC];
            load_halves(v, xr + c);
#pragma unroll
            for (int i = 0; i < VEC; ++i) sum += v[i];
        }
        mu = warp_sum(sum) / static_cast<float>(C);
    }
    float sq = 0.0f;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float v[VEC];
        load_halves(v, xr + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) sq += (v[i] - mu) * (v[i] - mu);
    }
    const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
    if (lane == 0) {
        if (LAYER && mean) mean[n] = mu;
        rstd[n] = r;
    }

    T* o = out + n * C;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float v[VEC], wv[VEC], bv[VEC] = {};
        load_halves(v, xr + c);
        load_halves(wv, w + c);
        if (LAYER && b) load_halves(bv, b + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mu) * r * wv[i] + bv[i];
        store_halves(o + c, v);
    }
}

// The residual add before the norm, in the same row pass: sum = a + b rounded to T and
// stored, then the statistics and the output of that stored sum, exactly as norm_fwd_kernel
// computes them from a tensor holding it. sum may alias a or b: each element is read before
// its thread writes it, and later passes read sum only.
template <class T, int VEC, bool LAYER>
__global__ void __launch_bounds__(kThreads) add_norm_fwd_kernel(T* sum, T* out, float* mean, float* rstd, const T* a, const T* b, const T* w, const T* bias,
                                                                int64_t N, int64_t C, float eps) {
    const int lane = threadIdx.x % 32;
    const int64_t n = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (n >= N) return;  // whole warps leave; no block barrier below
    const int64_t step = 32 * VEC;
    T* xr = sum + n * C;
    float total = 0.0f;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float va[VEC], vb[VEC];
        load_halves(va, a + n * C + c);
        load_halves(vb, b + n * C + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) va[i] = to_float(from_float<T>(va[i] + vb[i]));
        store_halves(xr + c, va);
#pragma unroll
        for (int i = 0; i < VEC; ++i) total += va[i];
    }
    float mu = 0.0f;
    if constexpr (LAYER) mu = warp_sum(total) / static_cast<float>(C);
    float sq = 0.0f;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float v[VEC];
        load_halves(v, xr + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) sq += (v[i] - mu) * (v[i] - mu);
    }
    const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
    if (lane == 0) {
        if (LAYER && mean) mean[n] = mu;
        rstd[n] = r;
    }
    T* o = out + n * C;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float v[VEC], wv[VEC], bv[VEC] = {};
        load_halves(v, xr + c);
        load_halves(wv, w + c);
        if (LAYER && bias) load_halves(bv, bias + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mu) * r * wv[i] + bv[i];
        store_halves(o + c, v);
    }
}

// One warp per row. dx may alias dout: a warp reads the whole row (first pass) before the
// shuffles of warp_sum, and in the second pass each thread reads an element before it writes it.
template <class T, int VEC, bool LAYER>
__global__ void __launch_bounds__(kThreads) norm_bwd_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean, const float* rstd,
                                                               int64_t N, int64_t C, bool accumulate) {
    const int lane = threadIdx.x % 32;
    const int64_t n = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
    if (n >= N) return;  // whole warps leave; no block barrier below
    const T* dr = dout + n * C;
    const T* xr = x + n * C;
    const float mu = LAYER ? mean[n] : 0.0f, r = rstd[n];
    const int64_t step = 32 * VEC;

    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float d[VEC], v[VEC], wv[VEC];
        load_halves(d, dr + c);
        load_halves(v, xr + c);
        load_halves(wv, w + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const float g = d[i] * wv[i];
            sum_g += g;
            sum_gx += g * ((v[i] - mu) * r);
        }
    }
    const float mean_g = LAYER ? warp_sum(sum_g) / static_cast<float>(C) : 0.0f;
    const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);

    T* o = dx + n * C;
    for (int64_t c = lane * VEC; c < C; c += step) {
        float d[VEC], v[VEC], wv[VEC], prev[VEC] = {};
        load_halves(d, dr + c);
        load_halves(v, xr + c);
        load_halves(wv, w + c);
        if (accumulate) load_halves(prev, o + c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) d[i] = prev[i] + r * (d[i] * wv[i] - mean_g - ((v[i] - mu) * r) * mean_gx);
        store_halves(o + c, d);
    }
}

// The terms of dw (s = 0) and, when SUMS == 2, db (s = 1) for column_partials_kernel:
// dout xhat and dout of row n, for the VEC columns at element offset i = n * C + c.
template <class T, int VEC, bool LAYER, int SUMS>
struct NormParamRows {
    const T* dout;
    const T* x;
    const float* mean;
    const float* rstd;

    __device__ __forceinline__ void add(float (&acc)[SUMS][VEC], int64_t n, int64_t i) const {
        float d[VEC], v[VEC];
        load_halves(d, dout + i);
        load_halves(v, x + i);
        const float mu = LAYER ? mean[n] : 0.0f, r = rstd[n];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            acc[0][k] += d[k] * ((v[k] - mu) * r);
            if constexpr (SUMS == 2) acc[1][k] += d[k];
        }
    }
};

unsigned row_blocks(int64_t N) { return static_cast<unsigned>(ceil_div(N, int64_t{kWarps})); }

template <class T, int VEC, bool LAYER>
void launch_norm_fwd_typed(void* out, float* mean, float* rstd, const void* x, const void* w, const void* b, int64_t N, int64_t C, float eps,
                           cudaStream_t stream) {
    norm_fwd_kernel<T, VEC, LAYER><<<row_blocks(N), kThreads, 0, stream>>>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(x),
                                                                          static_cast<const T*>(w), static_cast<const T*>(b), N, C, eps);
    check_launch(LAYER ? "layernorm_fwd" : "rmsnorm_fwd");
}

// dw (and db) += column sums through scratch, then dx.
template <class T, int VEC, bool LAYER>
void launch_norm_bwd_typed(void* dx, float* dw, float* db, const void* dout, const void* x, const void* w, const float* mean, const float* rstd,
                           int64_t N, int64_t C, bool accumulate_dx, void* scratch, cudaStream_t stream) {
    const T* dout_t = static_cast<const T*>(dout);
    const T* x_t = static_cast<const T*>(x);
    if (dw || db) {
        // Partials [2, chunks, C]: dw's (computed even when only db is wanted), then db's.
        float* partial = static_cast<float*>(scratch);
        const char* partials_name = LAYER ? "layernorm_bwd partials" : "rmsnorm_bwd partials";
        if (db) {
            launch_column_sums<VEC, 2>({dw, db}, partial, NormParamRows<T, VEC, LAYER, 2>{dout_t, x_t, mean, rstd}, N, C, partials_name,
                                       "norm_bwd add partials", stream);
        } else {
            launch_column_sums<VEC, 1>({dw}, partial, NormParamRows<T, VEC, LAYER, 1>{dout_t, x_t, mean, rstd}, N, C, partials_name,
                                       "norm_bwd add partials", stream);
        }
    }
    norm_bwd_dx_kernel<T, VEC, LAYER><<<row_blocks(N), kThreads, 0, stream>>>(static_cast<T*>(dx), dout_t, x_t, static_cast<const T*>(w), mean, rstd, N, C,
                                                                             accumulate_dx);
    check_launch(LAYER ? "layernorm_bwd dx" : "rmsnorm_bwd dx");
}

// 8 channels per thread (16-byte loads) when every row and pointer allows it, else 1.
template <bool LAYER>
void norm_fwd(Half t, void* out, float* mean, float* rstd, const void* x, const void* w, const void* b, int64_t N, int64_t C, float eps,
              cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 8 == 0 && aligned16(out) && aligned16(x) && aligned16(w) && aligned16(b);
    dispatch_half(t, [&]<class T>() {
        if (vec) launch_norm_fwd_typed<T, 8, LAYER>(out, mean, rstd, x, w, b, N, C, eps, stream);
        else launch_norm_fwd_typed<T, 1, LAYER>(out, mean, rstd, x, w, b, N, C, eps, stream);
    });
}

template <bool LAYER>
void norm_bwd(Half t, void* dx, float* dw, float* db, const void* dout, const void* x, const void* w, const float* mean, const float* rstd, int64_t N,
              int64_t C, bool accumulate_dx, void* scratch, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 8 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w);
    dispatch_half(t, [&]<class T>() {
        if (vec) launch_norm_bwd_typed<T, 8, LAYER>(dx, dw, db, dout, x, w, mean, rstd, N, C, accumulate_dx, scratch, stream);
        else launch_norm_bwd_typed<T, 1, LAYER>(dx, dw, db, dout, x, w, mean, rstd, N, C, accumulate_dx, scratch, stream);
    });
}

}  // namespace

void launch_layernorm_fwd(Half t, void* out, float* mean, float* rstd, const void* x, const void* w, const void* b, int64_t N, int64_t C, float eps,
                          cudaStream_t stream) {
    norm_fwd<true>(t, out, mean, rstd, x, w, b, N, C, eps, stream);
}

void launch_rmsnorm_fwd(Half t, void* out, float* rstd, const void* x, const void* w, int64_t N, int64_t C, float eps, cudaStream_t stream) {
    norm_fwd<false>(t, out, nullptr, rstd, x, w, nullptr, N, C, eps, stream);
}

void launch_add_norm_fwd(Half t, bool rms, void* sum, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w, const void* bias,
                        int64_t N, int64_t C, float eps, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % 8 == 0 && aligned16(sum) && aligned16(out) && aligned16(a) && aligned16(b) && aligned16(w) && aligned16(bias);
    dispatch_half(t, [&]<class T>() {
        const auto launch = [&]<int VEC, bool LAYER>() {
            add_norm_fwd_kernel<T, VEC, LAYER><<<row_blocks(N), kThreads, 0, stream>>>(static_cast<T*>(sum), static_cast<T*>(out), mean, rstd,
                                                                                     static_cast<const T*>(a), static_cast<const T*>(b),
                                                                                     static_cast<const T*>(w), static_cast<const T*>(bias), N, C, eps);
            check_launch(rms ? "add_rmsnorm_fwd" : "add_layernorm_fwd");
        };
        if (vec && rms) launch.template operator()<8, false>();
        else if (vec) launch.template operator()<8, true>();
        else if (rms) launch.template operator()<1, false>();
        else launch.template operator()<1, true>();
    });
}

// Partials for dw and db: [2, chunks, C] fp32.
size_t norm_bwd_scratch_bytes(int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return 0;
    return static_cast<size_t>(2 * column_chunk_count(N, C) * C) * sizeof(float);
}

void launch_layernorm_bwd(Half t, void* dx, float* dw, float* db, const void* dout, const void* x, const void* w, const float* mean, const float* rstd,
                          int64_t N, int64_t C, bool accumulate_dx, void* scratch, cudaStream_t stream) {
    norm_bwd<true>(t, dx, dw, db, dout, x, w, mean, rstd, N, C, accumulate_dx, scratch, stream);
}

void launch_rmsnorm_bwd(Half t, void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dx, void* scratch, cudaStream_t stream) {
    norm_bwd<false>(t, dx, dw, nullptr, dout, x, w, nullptr, rstd, N, C, accumulate_dx, scratch, stream);
}

}  // namespace llmtrain::kernels

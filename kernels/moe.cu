// Mixture-of-Experts routing (backend.h states each op's math; the CPU reference is
// src/backend/cpu/cpu_moe.cpp). N tokens, E experts, k chosen per token; router tensors fp32,
// activations 16-bit, every sum in fp32 in a fixed order, no floating-point atomics.
//
//  - Router (route, its backward, the aux- and z-loss backwards): one thread per token, the
//    token's E logits in a loop (E is tens to hundreds). Top-k without a mask: the j-th
//    choice is the best expert that comes after the (j-1)-th in the order (value descending,
//    index ascending), so ties go to the lower index as on the CPU. A NaN value orders as
//    -inf, so k distinct experts are always chosen.
//  - Load statistics: a block per (group, 32 experts), its 8 warps summing every 8th token
//    of the group, the 8 partial sums then added in warp order.
//  - z loss: one block of 256 threads, each summing lse^2 over every 256th token (in double),
//    then a fixed tree.
//  - Permutation plan, a stable counting sort of the N k assignments in chunks of 256:
//      1. per chunk c and expert e, the chunk's assignments to e (chunk_counts[c, e]);
//      2. per expert (a block each), the exclusive scan of its counts over the chunks: the
//         position of the chunk's first assignment to e among all of e's;
//      3. per expert (one thread), kept = min(total, capacity) (or total), dropped, and the
//         first row of its block (capacity: e capacity; dropless: the kept rows before it);
//      4. per assignment, its rank among the chunk's earlier assignments to the same expert
//         added to the chunk's position gives p; kept if p < capacity, row = start[e] + p.
//    Integer counts only: the result is the same on every run and equals the CPU's.
//    An expert index outside [0, E) (never produced by route) is not counted and not routed.
//  - Permute, combine and their backwards: one block per row, the columns across threads;
//    every index is bounds-checked, so no bad row or source writes outside the buffers.
#include <cmath>
#include <cstdint>

#include "kernels/half_types.cuh"
#include "kernels/kernels.h"
#include "kernels/launch_check.h"

namespace llmtrain::kernels {

namespace {

constexpr int token_threads = 128;  // router kernels: one thread per token
constexpr int row_threads = 128;    // permute and combine: one block per row
constexpr int chunk = 256;          // assignments per chunk of the permutation plan
constexpr int stats_experts = 32;   // load statistics: experts per block
constexpr int stats_rows = 8;       //                  token strides per block
constexpr int reduce_threads = 256;

int64_t token_blocks(int64_t N) { return ceil_div(N, int64_t{token_threads}); }

__device__ __forceinline__ float ordered(float v) { return v != v ? -INFINITY : v; }  // NaN orders as -inf

// Whether (v, e) comes before (best_v, best) in the order value descending, index ascending.
__device__ __forceinline__ bool ahead(float v, int e, float best_v, int best) { return v > best_v || (v == best_v && e < best); }

__global__ void __launch_bounds__(token_threads)
    route_fwd_kernel(int32_t* experts, float* gates, float* scores, const float* logits, const float* bias, int64_t N, int E, int k, bool sigmoid,
                     bool normalize) {
    const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float* l = logits + t * E;
    float* s = scores + t * E;
    if (sigmoid) {
        for (int e = 0; e < E; ++e) s[e] = 1.f / (1.f + expf(-l[e]));
    } else {
        float mx = l[0];
        for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
        float sum = 0;
        for (int e = 0; e < E; ++e) sum += expf(l[e] - mx);
        for (int e = 0; e < E; ++e) s[e] = expf(l[e] - mx) / sum;
    }
    int prev = -1;
    float prev_v = INFINITY, total = 0;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        float best_v = -INFINITY;
        for (int e = 0; e < E; ++e) {
            const float v = ordered(bias ? s[e] + bias[e] : s[e]);
            const bool after_prev = prev < 0 || ahead(prev_v, prev, v, e);
            if (after_prev && (best < 0 || ahead(v, e, best_v, best))) {
                best = e;
                best_v = v;
            }
        }
        experts[t * k + j] = best;
        gates[t * k + j] = s[best];
        total += s[best];
        prev = best;
        prev_v = best_v;
    }
    if (normalize)
        for (int j = 0; j < k; ++j) gates[t * k + j] /= total;
}

// d_logits[t] (=, or += when accumulate) from the dense d_scores of the chosen experts:
// ds(e) is the sum of the d_scores of the slots j with experts[t, j] = e.
template <class DScore>
__device__ void score_backward(float* d_logits, const float* s, int E, bool sigmoid, bool accumulate, DScore&& ds) {
    float inner = 0;
    if (!sigmoid)
        for (int e = 0; e < E; ++e) inner += s[e] * ds(e);
    for (int e = 0; e < E; ++e) {
        const float d = sigmoid ? ds(e) * s[e] * (1.f - s[e]) : s[e] * (ds(e) - inner);
        d_logits[e] = accumulate ? d_logits[e] + d : d;
    }
}

__global__ void __launch_bounds__(token_threads)
    route_bwd_kernel(float* d_logits, const float* d_gates, const float* gates, const float* scores, const int32_t* experts, int64_t N, int E, int k,
                     bool sigmoid, bool normalize, bool accumulate) {
    const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float* s = scores + t * E;
    const int32_t* chosen = experts + t * k;
    const float* dg = d_gates + t * k;
    float sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) {
        if (chosen[j] >= 0 && chosen[j] < E) sum += s[chosen[j]];
        dot += dg[j] * gates[t * k + j];
    }
    auto ds = [&](int e) {
        float d = 0;
        for (int j = 0; j < k; ++j)
            if (chosen[j] == e) d += normalize ? (dg[j] - dot) / sum : dg[j];
        return d;
    };
    score_backward(d_logits + t * E, s, E, sigmoid, accumulate, ds);
}

// Block (g, expert tile): thread (row r = threadIdx.x / 32, expert lane) sums tokens g S + r,
// + 8, ... of the group; the 8 partials are added in row order.
__global__ void __launch_bounds__(stats_experts * stats_rows)
    load_stats_kernel(int32_t* counts, float* score_sums, const int32_t* experts, const float* scores, int64_t S, int E, int k) {
    __shared__ float part_sum[stats_rows][stats_experts];
    __shared__ int32_t part_count[stats_rows][stats_experts];
    const int lane = static_cast<int>(threadIdx.x) % stats_experts, r = static_cast<int>(threadIdx.x) / stats_experts;
    const int e = static_cast<int>(blockIdx.y) * stats_experts + lane;
    const int64_t first = int64_t{blockIdx.x} * S;
    float sum = 0;
    int32_t count = 0;
    if (e < E)
        for (int64_t t = first + r; t < first + S; t += stats_rows) {
            sum += scores[t * E + e];
            for (int j = 0; j < k; ++j) count += experts[t * k + j] == e;
        }
    part_sum[r][lane] = sum;
    part_count[r][lane] = count;
    __syncthreads();
    if (r != 0 || e >= E) return;
    for (int i = 1; i < stats_rows; ++i) {
        sum += part_sum[i][lane];
        count += part_count[i][lane];
    }
    counts[blockIdx.x * E + e] = count;
    score_sums[blockIdx.x * E + e] = sum;
}

__global__ void aux_loss_fwd_kernel(float* loss, const int32_t* counts, const float* score_sums, int64_t G, int64_t E, double tokens, double top_k,
                                    double coeff) {
    double total = 0;
    for (int64_t i = 0; i < G * E; ++i) total += static_cast<double>(counts[i]) / (tokens * top_k) * (static_cast<double>(score_sums[i]) / tokens);
    loss[0] = static_cast<float>(coeff * static_cast<double>(E) / static_cast<double>(G) * total);
}

__global__ void __launch_bounds__(token_threads)
    aux_loss_bwd_kernel(float* d_logits, const float* scores, const int32_t* counts, int64_t N, int E, int64_t S, float scale, bool sigmoid) {
    const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const int32_t* c = counts + (t / S) * E;
    score_backward(d_logits + t * E, scores + t * E, E, sigmoid, true, [&](int e) { return scale * static_cast<float>(c[e]); });
}

__device__ float row_logsumexp(const float* l, int E) {
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += expf(l[e] - mx);
    return mx + logf(sum);
}

__global__ void __launch_bounds__(reduce_threads) z_loss_fwd_kernel(float* loss, const float* logits, int64_t N, int E, double coeff) {
    __shared__ double part[reduce_threads];
    double sum = 0;
    for (int64_t t = threadIdx.x; t < N; t += reduce_threads) {
        const double lse = row_logsumexp(logits + t * E, E);
        sum += lse * lse;
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = reduce_threads / 2; half > 0; half /= 2) {
        if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = N > 0 ? static_cast<float>(coeff * part[0] / static_cast<double>(N)) : 0.f;
}

__global__ void __launch_bounds__(token_threads) z_loss_bwd_kernel(float* d_logits, const float* logits, int64_t N, int E, float scale) {
    const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float* l = logits + t * E;
    const float lse = row_logsumexp(l, E);
    for (int e = 0; e < E; ++e) d_logits[t * E + e] += scale * lse * expf(l[e] - lse);
}

// ---- the permutation plan ----

// The chunk's assignments, -1 past the end.
__device__ void load_chunk(int32_t (&mine)[chunk], const int32_t* experts, int64_t assignments) {
    const int64_t i = int64_t{blockIdx.x} * chunk + threadIdx.x;
    mine[threadIdx.x] = i < assignments ? experts[i] : -1;
    __syncthreads();
}

__global__ void __launch_bounds__(chunk) chunk_counts_kernel(int32_t* chunk_counts, const int32_t* experts, int64_t assignments, int E) {
    __shared__ int32_t mine[chunk];
    load_chunk(mine, experts, assignments);
    for (int e = static_cast<int>(threadIdx.x); e < E; e += chunk) {
        int32_t count = 0;
        for (int i = 0; i < chunk; ++i) count += mine[i] == e;
        chunk_counts[int64_t{blockIdx.x} * E + e] = count;
    }
}

// Block e: chunk_counts[:, e] replaced by its exclusive scan over the chunks; totals[e] = the sum.
__global__ void __launch_bounds__(reduce_threads) expert_scan_kernel(int32_t* chunk_counts, int32_t* totals, int64_t chunks, int E) {
    __shared__ int32_t base[reduce_threads];
    const int64_t e = blockIdx.x, per = ceil_div(chunks, int64_t{reduce_threads});
    const int64_t begin = std::min(chunks, int64_t{threadIdx.x} * per), end = std::min(chunks, begin + per);
    int32_t sum = 0;
    for (int64_t c = begin; c < end; ++c) sum += chunk_counts[c * E + e];
    base[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t running = 0;
        for (int i = 0; i < reduce_threads; ++i) {
            const int32_t own = base[i];
            base[i] = running;
            running += own;
        }
        totals[e] = running;
    }
    __syncthreads();
    int32_t running = base[threadIdx.x];
    for (int64_t c = begin; c < end; ++c) {
        const int32_t own = chunk_counts[c * E + e];
        chunk_counts[c * E + e] = running;
        running += own;
    }
}

__global__ void expert_blocks_kernel(int32_t* starts, int32_t* counts, int32_t* dropped, const int32_t* totals, int E, int64_t capacity) {
    int64_t offset = 0;
    for (int e = 0; e < E; ++e) {
        const int64_t kept = capacity == 0 ? totals[e] : std::min(int64_t{totals[e]}, capacity);
        starts[e] = static_cast<int32_t>(capacity == 0 ? offset : e * capacity);
        offset += kept;
        counts[e] = static_cast<int32_t>(kept);
        if (dropped) dropped[e] = static_cast<int32_t>(totals[e] - kept);
    }
}

__global__ void fill_kernel(int32_t* p, int64_t n, int32_t value) {
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) p[i] = value;
}

__global__ void __launch_bounds__(chunk)
    assign_rows_kernel(int32_t* rows, int32_t* sources, const int32_t* experts, const int32_t* chunk_base, const int32_t* starts, int64_t assignments,
                       int E, int64_t capacity) {
    __shared__ int32_t mine[chunk];
    load_chunk(mine, experts, assignments);
    const int64_t i = int64_t{blockIdx.x} * chunk + threadIdx.x;
    if (i >= assignments) return;
    const int32_t e = mine[threadIdx.x];
    if (e < 0 || e >= E) {
        rows[i] = -1;
        return;
    }
    int32_t rank = 0;
    for (int j = 0; j < static_cast<int>(threadIdx.x); ++j) rank += mine[j] == e;
    const int64_t p = int64_t{chunk_base[int64_t{blockIdx.x} * E + e]} + rank;
    if (capacity != 0 && p >= capacity) {
        rows[i] = -1;
        return;
    }
    const int64_t row = starts[e] + p;
    rows[i] = static_cast<int32_t>(row);
    sources[row] = static_cast<int32_t>(i);
}

// ---- permute and combine ----

__global__ void __launch_bounds__(row_threads)
    permute_fwd_kernel(uint16_t* x_perm, const uint16_t* x, const int32_t* sources, int64_t C, int64_t assignments, int k) {
    const int64_t r = blockIdx.x;
    const int32_t src = sources[r];
    const uint16_t* from = src >= 0 && src < assignments ? x + (src / k) * C : nullptr;
    for (int64_t c = threadIdx.x; c < C; c += row_threads) x_perm[r * C + c] = from ? from[c] : uint16_t{0};
}

template <class T>
__global__ void __launch_bounds__(row_threads) permute_bwd_kernel(T* dx, const T* d_perm, const int32_t* rows, int64_t C, int64_t R, int k) {
    const int64_t t = blockIdx.x;
    for (int64_t c = threadIdx.x; c < C; c += row_threads) {
        float sum = 0;
        for (int j = 0; j < k; ++j) {
            const int32_t row = rows[t * k + j];
            if (row >= 0 && row < R) sum += to_float(d_perm[row * C + c]);
        }
        dx[t * C + c] = from_float<T>(sum);
    }
}

template <class T>
__global__ void __launch_bounds__(row_threads) combine_fwd_kernel(T* out, const T* y, const float* gates, const int32_t* rows, int64_t C, int64_t R, int k) {
    const int64_t t = blockIdx.x;
    for (int64_t c = threadIdx.x; c < C; c += row_threads) {
        float sum = 0;
        for (int j = 0; j < k; ++j) {
            const int32_t row = rows[t * k + j];
            if (row >= 0 && row < R) sum += gates[t * k + j] * to_float(y[row * C + c]);
        }
        out[t * C + c] = from_float<T>(sum);
    }
}

template <class T>
__global__ void __launch_bounds__(row_threads)
    combine_bwd_rows_kernel(T* d_y, const T* d_out, const float* gates, const int32_t* sources, int64_t C, int64_t assignments, int k) {
    const int64_t r = blockIdx.x;
    const int32_t src = sources[r];
    const bool valid = src >= 0 && src < assignments;
    const float g = valid ? gates[src] : 0.f;
    for (int64_t c = threadIdx.x; c < C; c += row_threads) d_y[r * C + c] = from_float<T>(valid ? g * to_float(d_out[(src / k) * C + c]) : 0.f);
}

// Block t: d_gates[t, j] = dot(d_out[t], y[rows[t, j]]), each over a fixed tree.
template <class T>
__global__ void __launch_bounds__(row_threads)
    combine_bwd_gates_kernel(float* d_gates, const T* d_out, const T* y, const int32_t* rows, int64_t C, int64_t R, int k) {
    __shared__ float part[row_threads];
    const int64_t t = blockIdx.x;
    for (int j = 0; j < k; ++j) {
        const int32_t row = rows[t * k + j];
        float sum = 0;
        if (row >= 0 && row < R)
            for (int64_t c = threadIdx.x; c < C; c += row_threads) sum += to_float(d_out[t * C + c]) * to_float(y[row * C + c]);
        part[threadIdx.x] = sum;
        __syncthreads();
        for (int half = row_threads / 2; half > 0; half /= 2) {
            if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0) d_gates[t * k + j] = part[0];
        __syncthreads();
    }
}

}  // namespace

void launch_moe_route_fwd(int32_t* experts, float* gates, float* scores, const float* logits, const float* expert_bias, int64_t N, int64_t E, int64_t k,
                          bool sigmoid, bool normalize, cudaStream_t stream) {
    if (N == 0) return;
    route_fwd_kernel<<<token_blocks(N), token_threads, 0, stream>>>(experts, gates, scores, logits, expert_bias, N, static_cast<int>(E),
                                                                     static_cast<int>(k), sigmoid, normalize);
    check_launch("moe_route_fwd");
}

void launch_moe_route_bwd(float* d_logits, const float* d_gates, const float* gates, const float* scores, const int32_t* experts, int64_t N, int64_t E,
                          int64_t k, bool sigmoid, bool normalize, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    route_bwd_kernel<<<token_blocks(N), token_threads, 0, stream>>>(d_logits, d_gates, gates, scores, experts, N, static_cast<int>(E), static_cast<int>(k),
                                                                     sigmoid, normalize, accumulate);
    check_launch("moe_route_bwd");
}

void launch_moe_load_stats(int32_t* counts, float* score_sums, const int32_t* experts, const float* scores, int64_t G, int64_t S, int64_t E, int64_t k,
                           cudaStream_t stream) {
    if (G == 0) return;
    const dim3 grid(static_cast<unsigned>(G), static_cast<unsigned>(ceil_div(E, int64_t{stats_experts})));
    load_stats_kernel<<<grid, stats_experts * stats_rows, 0, stream>>>(counts, score_sums, experts, scores, S, static_cast<int>(E), static_cast<int>(k));
    check_launch("moe_load_stats");
}

void launch_moe_aux_loss_fwd(float* loss, const int32_t* counts, const float* score_sums, int64_t G, int64_t E, int64_t tokens_per_group, int64_t top_k,
                             double coeff, cudaStream_t stream) {
    aux_loss_fwd_kernel<<<1, 1, 0, stream>>>(loss, counts, score_sums, G, E, static_cast<double>(tokens_per_group), static_cast<double>(top_k), coeff);
    check_launch("moe_aux_loss_fwd");
}

void launch_moe_aux_loss_bwd(float* d_logits, const float* scores, const int32_t* counts, int64_t N, int64_t E, int64_t S, float scale, bool sigmoid,
                             cudaStream_t stream) {
    if (N == 0) return;
    aux_loss_bwd_kernel<<<token_blocks(N), token_threads, 0, stream>>>(d_logits, scores, counts, N, static_cast<int>(E), S, scale, sigmoid);
    check_launch("moe_aux_loss_bwd");
}

void launch_moe_z_loss_fwd(float* loss, const float* logits, int64_t N, int64_t E, double coeff, cudaStream_t stream) {
    z_loss_fwd_kernel<<<1, reduce_threads, 0, stream>>>(loss, logits, N, static_cast<int>(E), coeff);
    check_launch("moe_z_loss_fwd");
}

void launch_moe_z_loss_bwd(float* d_logits, const float* logits, int64_t N, int64_t E, float scale, cudaStream_t stream) {
    if (N == 0) return;
    z_loss_bwd_kernel<<<token_blocks(N), token_threads, 0, stream>>>(d_logits, logits, N, static_cast<int>(E), scale);
    check_launch("moe_z_loss_bwd");
}

size_t moe_permute_plan_scratch_bytes(int64_t assignments, int64_t E) {
    const auto chunks = static_cast<size_t>(ceil_div(assignments, int64_t{chunk}));
    return (chunks * static_cast<size_t>(E) + 2 * static_cast<size_t>(E)) * sizeof(int32_t);
}

void launch_moe_permute_plan(int32_t* rows, int32_t* sources, int32_t* counts, int32_t* dropped, const int32_t* experts, int64_t N, int64_t E, int64_t k,
                             int64_t capacity, int64_t R, void* scratch, cudaStream_t stream) {
    const int64_t assignments = N * k, chunks = ceil_div(assignments, int64_t{chunk});
    auto* chunk_counts = static_cast<int32_t*>(scratch);
    int32_t* totals = chunk_counts + chunks * E;
    int32_t* starts = totals + E;
    const int e_count = static_cast<int>(E);
    if (chunks > 0) {
        chunk_counts_kernel<<<static_cast<unsigned>(chunks), chunk, 0, stream>>>(chunk_counts, experts, assignments, e_count);
        check_launch("moe_permute_plan (chunk counts)");
    }
    expert_scan_kernel<<<static_cast<unsigned>(E), reduce_threads, 0, stream>>>(chunk_counts, totals, chunks, e_count);
    check_launch("moe_permute_plan (expert scan)");
    expert_blocks_kernel<<<1, 1, 0, stream>>>(starts, counts, dropped, totals, e_count, capacity);
    check_launch("moe_permute_plan (expert blocks)");
    if (R > 0) {
        fill_kernel<<<static_cast<unsigned>(std::min<int64_t>(ceil_div(R, int64_t{reduce_threads}), 4096)), reduce_threads, 0, stream>>>(sources, R, -1);
        check_launch("moe_permute_plan (fill)");
    }
    if (chunks > 0) {
        assign_rows_kernel<<<static_cast<unsigned>(chunks), chunk, 0, stream>>>(rows, sources, experts, chunk_counts, starts, assignments, e_count, capacity);
        check_launch("moe_permute_plan (assign rows)");
    }
}

void launch_moe_permute_fwd(void* x_perm, const void* x, const int32_t* sources, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream) {
    if (R == 0 || C == 0) return;
    permute_fwd_kernel<<<static_cast<unsigned>(R), row_threads, 0, stream>>>(static_cast<uint16_t*>(x_perm), static_cast<const uint16_t*>(x), sources, C,
                                                                             N * k, static_cast<int>(k));
    check_launch("moe_permute_fwd");
}

void launch_moe_permute_bwd(Half t, void* dx, const void* d_x_perm, const int32_t* rows, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    dispatch_half(t, [&]<class T>() {
        permute_bwd_kernel<T><<<static_cast<unsigned>(N), row_threads, 0, stream>>>(static_cast<T*>(dx), static_cast<const T*>(d_x_perm), rows, C, R,
                                                                                     static_cast<int>(k));
    });
    check_launch("moe_permute_bwd");
}

void launch_moe_combine_fwd(Half t, void* out, const void* y_perm, const float* gates, const int32_t* rows, int64_t N, int64_t C, int64_t R, int64_t k,
                            cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    dispatch_half(t, [&]<class T>() {
        combine_fwd_kernel<T><<<static_cast<unsigned>(N), row_threads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(y_perm), gates, rows, C, R,
                                                                                     static_cast<int>(k));
    });
    check_launch("moe_combine_fwd");
}

void launch_moe_combine_bwd(Half t, void* d_y_perm, float* d_gates, const void* d_out, const void* y_perm, const float* gates, const int32_t* rows,
                            const int32_t* sources, int64_t N, int64_t C, int64_t R, int64_t k, cudaStream_t stream) {
    dispatch_half(t, [&]<class T>() {
        if (R > 0 && C > 0)
            combine_bwd_rows_kernel<T><<<static_cast<unsigned>(R), row_threads, 0, stream>>>(static_cast<T*>(d_y_perm), static_cast<const T*>(d_out), gates,
                                                                                             sources, C, N * k, static_cast<int>(k));
        if (N > 0)
            combine_bwd_gates_kernel<T><<<static_cast<unsigned>(N), row_threads, 0, stream>>>(d_gates, static_cast<const T*>(d_out),
                                                                                              static_cast<const T*>(y_perm), rows, C, R, static_cast<int>(k));
    });
    check_launch("moe_combine_bwd");
}

}  // namespace llmtrain::kernels

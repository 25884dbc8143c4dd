// Mixture-of-Experts routing on the CPU (backend.h states each op's math): the router's score
// function and top-k, its backward, the load statistics and the aux and z losses, and the
// stable permutation of tokens by expert with its gather, combine and their backwards.
// Every router tensor and activation is in one dtype T (f32, or f64 for the gradient tests).
// Per-token work runs over rows with OpenMP, each row by one thread; every sum over tokens
// (score sums, losses) and the permutation plan run in token order on one thread, so the
// results do not depend on the thread count. Row sums are taken in double and rounded once.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

template <class T>
void score_row(T* scores, const T* logits, int64_t E, MoeScore score) {
    if (score == MoeScore::sigmoid) {
        for (int64_t e = 0; e < E; ++e) scores[e] = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))));
        return;
    }
    double mx = static_cast<double>(logits[0]);
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(logits[e]) - mx);
    for (int64_t e = 0; e < E; ++e) scores[e] = static_cast<T>(std::exp(static_cast<double>(logits[e]) - mx) / sum);
}

// The k experts of largest score + bias (in T), ties to the lower index, in descending order.
template <class T>
void top_k_row(int32_t* experts, const T* scores, const T* bias, int64_t E, int64_t k, std::vector<char>& taken) {
    taken.assign(static_cast<size_t>(E), 0);
    for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        T best_value = T(0);
        for (int64_t e = 0; e < E; ++e) {
            if (taken[static_cast<size_t>(e)]) continue;
            const T value = bias ? static_cast<T>(scores[e] + bias[e]) : scores[e];
            if (best < 0 || value > best_value) {
                best = e;
                best_value = value;
            }
        }
        taken[static_cast<size_t>(best)] = 1;
        experts[j] = static_cast<int32_t>(best);
    }
}

// d_logits[e] (=, or += when accumulate) from d_scores through the score function.
template <class T>
void score_backward_row(T* d_logits, const double* d_scores, const T* scores, int64_t E, MoeScore score, bool accumulate) {
    double inner = 0;
    if (score == MoeScore::softmax)
        for (int64_t e = 0; e < E; ++e) inner += static_cast<double>(scores[e]) * d_scores[e];
    for (int64_t e = 0; e < E; ++e) {
        const double s = static_cast<double>(scores[e]);
        const double d = score == MoeScore::softmax ? s * (d_scores[e] - inner) : d_scores[e] * s * (1 - s);
        d_logits[e] = static_cast<T>(accumulate ? static_cast<double>(d_logits[e]) + d : d);
    }
}

// Every expert index in [0, E): a data error naming the op and the assignment otherwise.
void expect_experts_in_range(const char* op, const int32_t* experts, int64_t N, int64_t k, int64_t E) {
    for (int64_t i = 0; i < N * k; ++i)
        if (experts[i] < 0 || experts[i] >= E)
            fail(ErrorKind::data, op, ": expert ", experts[i], " of token ", i / k, " slot ", i % k, " is outside [0, ", E, ")");
}

// Every value of `name` in [-1, limit): -1 marks a dropped slot or a padding row.
void expect_indices(const char* op, const char* name, const int32_t* values, int64_t count, int64_t limit) {
    for (int64_t i = 0; i < count; ++i)
        if (values[i] < -1 || values[i] >= limit) fail(ErrorKind::data, op, ": ", name, "[", i, "] = ", values[i], " is outside [-1, ", limit, ")");
}

// out[t] = sum over token t's kept slots j, in slot order, of weights[t, j] (1 without
// weights) times perm[rows[t, j]]: permute's backward and combine's forward.
template <class T>
void sum_kept_slots(T* out, const T* perm, const int32_t* rows, const T* weights, const MoeSlots& s, int threads) {
    const int64_t N = s.tokens, k = s.top_k, C = s.channels;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; ++t)
        for (int64_t c = 0; c < C; ++c) {
            double sum = 0;
            for (int64_t j = 0; j < k; ++j) {
                const int32_t row = rows[t * k + j];
                if (row >= 0) sum += (weights ? static_cast<double>(weights[t * k + j]) : 1.0) * static_cast<double>(perm[row * C + c]);
            }
            out[t * C + c] = static_cast<T>(sum);
        }
}

}  // namespace

void CpuBackend::moe_route_fwd(const MoeRouteFwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_route_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", a.logits, [&]<class T>() {
        const MoeDims dims = expect_moe_routing(op, Device::cpu, a.logits.dtype(), "logits", a.logits, a.experts);
        const int64_t N = dims.tokens, E = dims.experts, k = dims.top_k;
        cpu::expect_tensor(op, "gates", a.gates, {N, k}, a.logits.dtype());
        cpu::expect_tensor(op, "scores", a.scores, {N, E}, a.logits.dtype());
        if (!a.expert_bias.empty()) cpu::expect_tensor(op, "expert_bias", a.expert_bias, {E}, a.logits.dtype());
        const T* logits = a.logits.data<T>();
        const T* bias = cpu::data_or_null<T>(a.expert_bias);
        T* scores = a.scores.data<T>();
        T* gates = a.gates.data<T>();
        int32_t* experts = a.experts.data<int32_t>();
        const MoeScore score = a.score;
        const bool normalize = a.normalize_top_k;
#pragma omp parallel num_threads(threads_)
        {
            std::vector<char> taken;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < N; ++t) {
                T* s = scores + t * E;
                score_row(s, logits + t * E, E, score);
                int32_t* chosen = experts + t * k;
                top_k_row(chosen, s, bias, E, k, taken);
                double sum = 0;
                for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(s[chosen[j]]);
                for (int64_t j = 0; j < k; ++j) gates[t * k + j] = static_cast<T>(normalize ? static_cast<double>(s[chosen[j]]) / sum : s[chosen[j]]);
            }
        }
    });
}

void CpuBackend::moe_route_bwd(const MoeRouteBwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_route_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "scores", a.scores, [&]<class T>() {
        const MoeDims dims = expect_moe_routing(op, Device::cpu, a.scores.dtype(), "scores", a.scores, a.experts);
        const int64_t N = dims.tokens, E = dims.experts, k = dims.top_k;
        cpu::expect_tensor(op, "d_logits", a.d_logits, {N, E}, a.scores.dtype());
        cpu::expect_tensor(op, "d_gates", a.d_gates, {N, k}, a.scores.dtype());
        cpu::expect_tensor(op, "gates", a.gates, {N, k}, a.scores.dtype());
        const int32_t* experts = a.experts.data<int32_t>();
        expect_experts_in_range(op, experts, N, k, E);
        const T* scores = a.scores.data<T>();
        const T* gates = a.gates.data<T>();
        const T* d_gates = a.d_gates.data<T>();
        T* d_logits = a.d_logits.data<T>();
        const MoeScore score = a.score;
        const bool normalize = a.normalize_top_k, accumulate = a.accumulate;
#pragma omp parallel num_threads(threads_)
        {
            std::vector<double> d_scores(static_cast<size_t>(E));
#pragma omp for schedule(static)
            for (int64_t t = 0; t < N; ++t) {
                const T* s = scores + t * E;
                const int32_t* chosen = experts + t * k;
                double sum = 0, dot = 0;
                for (int64_t j = 0; j < k; ++j) {
                    sum += static_cast<double>(s[chosen[j]]);
                    dot += static_cast<double>(d_gates[t * k + j]) * static_cast<double>(gates[t * k + j]);
                }
                std::fill(d_scores.begin(), d_scores.end(), 0.0);
                for (int64_t j = 0; j < k; ++j) {
                    const double dg = static_cast<double>(d_gates[t * k + j]);
                    d_scores[static_cast<size_t>(chosen[j])] += normalize ? (dg - dot) / sum : dg;
                }
                score_backward_row(d_logits + t * E, d_scores.data(), s, E, score, accumulate);
            }
        }
    });
}

void CpuBackend::moe_load_stats(const MoeLoadStats& a) {
    cpu::OpTimer timer(profile_, Op::moe_load_stats);
    const char* op = timer.name();
    cpu::dispatch_float(op, "scores", a.scores, [&]<class T>() {
        const MoeDims dims = expect_moe_routing(op, Device::cpu, a.scores.dtype(), "scores", a.scores, a.experts);
        const int64_t N = dims.tokens, E = dims.experts, k = dims.top_k;
        const int64_t G = moe_groups(op, N, a.seq_len), S = N / G;
        expect_moe_counts(op, a.counts, G, E, Device::cpu);
        cpu::expect_tensor(op, "score_sums", a.score_sums, {G, E}, a.scores.dtype());
        const int32_t* experts = a.experts.data<int32_t>();
        expect_experts_in_range(op, experts, N, k, E);
        const T* scores = a.scores.data<T>();
        int32_t* counts = a.counts.data<int32_t>();
        T* sums = a.score_sums.data<T>();
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t g = 0; g < G; ++g) {
            std::vector<double> total(static_cast<size_t>(E), 0.0);
            std::vector<int32_t> count(static_cast<size_t>(E), 0);
            for (int64_t t = g * S; t < (g + 1) * S; ++t) {
                for (int64_t e = 0; e < E; ++e) total[static_cast<size_t>(e)] += static_cast<double>(scores[t * E + e]);
                for (int64_t j = 0; j < k; ++j) ++count[static_cast<size_t>(experts[t * k + j])];
            }
            for (int64_t e = 0; e < E; ++e) {
                counts[g * E + e] = count[static_cast<size_t>(e)];
                sums[g * E + e] = static_cast<T>(total[static_cast<size_t>(e)]);
            }
        }
    });
}

void CpuBackend::moe_aux_loss_fwd(const MoeAuxLossFwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_aux_loss_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "score_sums", a.score_sums, [&]<class T>() {
        cpu::expect_rank(op, "score_sums", a.score_sums, 2);
        const int64_t G = a.score_sums.dim(0), E = a.score_sums.dim(1);
        expect_moe_counts(op, a.counts, G, E, Device::cpu);
        cpu::expect_tensor(op, "loss", a.loss, {1}, a.score_sums.dtype());
        expect_moe_aux_loss(op, a.tokens_per_group, a.top_k, E);
        const int32_t* counts = a.counts.data<int32_t>();
        const T* sums = a.score_sums.data<T>();
        const double T_g = static_cast<double>(a.tokens_per_group);
        double total = 0;
        for (int64_t i = 0; i < G * E; ++i) total += static_cast<double>(counts[i]) / (T_g * static_cast<double>(a.top_k)) * (static_cast<double>(sums[i]) / T_g);
        a.loss.data<T>()[0] = static_cast<T>(a.coeff * static_cast<double>(E) / static_cast<double>(G) * total);
    });
}

void CpuBackend::moe_aux_loss_bwd(const MoeAuxLossBwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_aux_loss_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "scores", a.scores, [&]<class T>() {
        cpu::expect_rank(op, "scores", a.scores, 2);
        const int64_t N = a.scores.dim(0), E = a.scores.dim(1);
        const int64_t G = moe_groups(op, N, a.seq_len), S = N / G;
        expect_moe_counts(op, a.counts, G, E, Device::cpu);
        cpu::expect_tensor(op, "d_logits", a.d_logits, {N, E}, a.scores.dtype());
        expect_moe_aux_loss(op, a.tokens_per_group, a.top_k, E);
        const int32_t* counts = a.counts.data<int32_t>();
        const T* scores = a.scores.data<T>();
        T* d_logits = a.d_logits.data<T>();
        const double T_g = static_cast<double>(a.tokens_per_group);
        const double scale = a.dloss * a.coeff * static_cast<double>(E) / (T_g * static_cast<double>(a.top_k)) / (static_cast<double>(G) * T_g);
        const MoeScore score = a.score;
#pragma omp parallel num_threads(threads_)
        {
            std::vector<double> d_scores(static_cast<size_t>(E));
#pragma omp for schedule(static)
            for (int64_t t = 0; t < N; ++t) {
                const int32_t* c = counts + (t / S) * E;
                for (int64_t e = 0; e < E; ++e) d_scores[static_cast<size_t>(e)] = scale * static_cast<double>(c[e]);
                score_backward_row(d_logits + t * E, d_scores.data(), scores + t * E, E, score, true);
            }
        }
    });
}

namespace {
template <class T>
double row_logsumexp(const T* row, int64_t E) {
    double mx = static_cast<double>(row[0]);
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(row[e]));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(row[e]) - mx);
    return mx + std::log(sum);
}

std::pair<int64_t, int64_t> expect_z_logits(const char* op, const Tensor& logits) {
    cpu::expect_rank(op, "logits", logits, 2);
    if (logits.dim(1) < 1) fail(ErrorKind::shape, op, ": logits has shape ", logits.shape().str(), ", expected at least one expert");
    return {logits.dim(0), logits.dim(1)};
}
}  // namespace

void CpuBackend::moe_z_loss_fwd(const MoeZLossFwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_z_loss_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", a.logits, [&]<class T>() {
        const auto [N, E] = expect_z_logits(op, a.logits);
        cpu::expect_tensor(op, "loss", a.loss, {1}, a.logits.dtype());
        const T* logits = a.logits.data<T>();
        double total = 0;
        for (int64_t t = 0; t < N; ++t) {
            const double lse = row_logsumexp(logits + t * E, E);
            total += lse * lse;
        }
        a.loss.data<T>()[0] = static_cast<T>(N > 0 ? a.coeff * total / static_cast<double>(N) : 0.0);
    });
}

void CpuBackend::moe_z_loss_bwd(const MoeZLossBwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_z_loss_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", a.logits, [&]<class T>() {
        const auto [rows, experts] = expect_z_logits(op, a.logits);
        const int64_t N = rows, E = experts;  // variables: OpenMP regions cannot capture a binding (clang < 16)
        cpu::expect_tensor(op, "d_logits", a.d_logits, {N, E}, a.logits.dtype());
        const T* logits = a.logits.data<T>();
        T* d_logits = a.d_logits.data<T>();
        const double scale = a.dloss * a.coeff * 2.0 / static_cast<double>(N);
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t t = 0; t < N; ++t) {
            const T* row = logits + t * E;
            const double lse = row_logsumexp(row, E);
            for (int64_t e = 0; e < E; ++e)
                d_logits[t * E + e] = static_cast<T>(static_cast<double>(d_logits[t * E + e]) + scale * lse * std::exp(static_cast<double>(row[e]) - lse));
        }
    });
}

void CpuBackend::moe_permute_plan(const MoePermutePlan& a) {
    cpu::OpTimer timer(profile_, Op::moe_permute_plan);
    const char* op = timer.name();
    cpu::expect_rank(op, "counts", a.counts, 1);
    const int64_t E = a.counts.dim(0);
    const MoeDims dims = expect_moe_experts(op, a.experts, E, Device::cpu);
    const int64_t R = moe_permuted_rows(op, dims, a.capacity), N = dims.tokens, k = dims.top_k, capacity = a.capacity;
    cpu::expect_tensor(op, "rows", a.rows, {N, k}, DType::i32);
    cpu::expect_tensor(op, "sources", a.sources, {R}, DType::i32);
    cpu::expect_tensor(op, "counts", a.counts, {E}, DType::i32);
    if (!a.dropped.empty()) cpu::expect_tensor(op, "dropped", a.dropped, {E}, DType::i32);
    const int32_t* experts = a.experts.data<int32_t>();
    expect_experts_in_range(op, experts, N, k, E);
    // Assignments in (token, slot) order: the p-th of expert e sits at its block's start + p.
    std::vector<int64_t> total(static_cast<size_t>(E), 0), start(static_cast<size_t>(E), 0), next(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < N * k; ++i) ++total[static_cast<size_t>(experts[i])];
    int32_t* counts = a.counts.data<int32_t>();
    int64_t offset = 0;
    for (int64_t e = 0; e < E; ++e) {
        const auto ue = static_cast<size_t>(e);
        const int64_t kept = capacity == 0 ? total[ue] : std::min(total[ue], capacity);
        start[ue] = capacity == 0 ? offset : e * capacity;
        offset += kept;
        counts[e] = static_cast<int32_t>(kept);
        if (!a.dropped.empty()) a.dropped.data<int32_t>()[e] = static_cast<int32_t>(total[ue] - kept);
    }
    int32_t* rows = a.rows.data<int32_t>();
    int32_t* sources = a.sources.data<int32_t>();
    std::fill(sources, sources + R, -1);
    for (int64_t i = 0; i < N * k; ++i) {
        const auto e = static_cast<size_t>(experts[i]);
        const int64_t p = next[e]++;
        if (capacity != 0 && p >= capacity) {
            rows[i] = -1;
            continue;
        }
        rows[i] = static_cast<int32_t>(start[e] + p);
        sources[start[e] + p] = static_cast<int32_t>(i);
    }
}

void CpuBackend::moe_permute_fwd(const MoePermuteFwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_permute_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", a.x, [&]<class T>() {
        cpu::expect_rank(op, "x", a.x, 2);
        cpu::expect_rank(op, "sources", a.sources, 1);
        const int64_t N = a.x.dim(0), C = a.x.dim(1), R = a.sources.dim(0), k = a.top_k;
        if (k < 1) fail(ErrorKind::shape, op, ": top_k ", k, " must be at least 1");
        cpu::expect_tensor(op, "sources", a.sources, {R}, DType::i32);
        cpu::expect_tensor(op, "x_perm", a.x_perm, {R, C}, a.x.dtype());
        const int32_t* sources = a.sources.data<int32_t>();
        expect_indices(op, "sources", sources, R, N * k);
        const T* x = a.x.data<T>();
        T* x_perm = a.x_perm.data<T>();
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t r = 0; r < R; ++r) {
            const T* src = sources[r] < 0 ? nullptr : x + (sources[r] / k) * C;
            for (int64_t c = 0; c < C; ++c) x_perm[r * C + c] = src ? src[c] : T(0);
        }
    });
}

void CpuBackend::moe_permute_bwd(const MoePermuteBwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_permute_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "d_x_perm", a.d_x_perm, [&]<class T>() {
        const MoeSlots s = expect_moe_slots(op, Device::cpu, a.rows, "d_x_perm", a.d_x_perm);
        cpu::expect_tensor(op, "dx", a.dx, {s.tokens, s.channels}, a.d_x_perm.dtype());
        expect_indices(op, "rows", a.rows.data<int32_t>(), s.tokens * s.top_k, s.rows);
        sum_kept_slots<T>(a.dx.data<T>(), a.d_x_perm.data<T>(), a.rows.data<int32_t>(), nullptr, s, threads_);
    });
}

void CpuBackend::moe_combine_fwd(const MoeCombineFwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_combine_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "y_perm", a.y_perm, [&]<class T>() {
        const MoeSlots s = expect_moe_slots(op, Device::cpu, a.rows, "y_perm", a.y_perm);
        cpu::expect_tensor(op, "out", a.out, {s.tokens, s.channels}, a.y_perm.dtype());
        cpu::expect_tensor(op, "gates", a.gates, {s.tokens, s.top_k}, a.y_perm.dtype());
        expect_indices(op, "rows", a.rows.data<int32_t>(), s.tokens * s.top_k, s.rows);
        sum_kept_slots(a.out.data<T>(), a.y_perm.data<T>(), a.rows.data<int32_t>(), a.gates.data<T>(), s, threads_);
    });
}

void CpuBackend::moe_combine_bwd(const MoeCombineBwd& a) {
    cpu::OpTimer timer(profile_, Op::moe_combine_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "y_perm", a.y_perm, [&]<class T>() {
        const MoeSlots s = expect_moe_slots(op, Device::cpu, a.rows, "y_perm", a.y_perm);
        const int64_t N = s.tokens, k = s.top_k, R = s.rows, C = s.channels, slots = k;
        cpu::expect_tensor(op, "d_y_perm", a.d_y_perm, {R, C}, a.y_perm.dtype());
        cpu::expect_tensor(op, "d_gates", a.d_gates, {N, k}, a.y_perm.dtype());
        cpu::expect_tensor(op, "d_out", a.d_out, {N, C}, a.y_perm.dtype());
        cpu::expect_tensor(op, "gates", a.gates, {N, k}, a.y_perm.dtype());
        cpu::expect_tensor(op, "sources", a.sources, {R}, DType::i32);
        const int32_t* rows = a.rows.data<int32_t>();
        const int32_t* sources = a.sources.data<int32_t>();
        expect_indices(op, "rows", rows, N * k, R);
        expect_indices(op, "sources", sources, R, N * k);
        const T* y = a.y_perm.data<T>();
        const T* gates = a.gates.data<T>();
        const T* d_out = a.d_out.data<T>();
        T* d_y = a.d_y_perm.data<T>();
        T* d_gates = a.d_gates.data<T>();
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t r = 0; r < R; ++r) {
            const int32_t src = sources[r];
            for (int64_t c = 0; c < C; ++c)
                d_y[r * C + c] = src < 0 ? T(0) : static_cast<T>(static_cast<double>(gates[src]) * static_cast<double>(d_out[(src / slots) * C + c]));
        }
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t i = 0; i < N * slots; ++i) {
            double dot = 0;
            if (rows[i] >= 0)
                for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(d_out[(i / slots) * C + c]) * static_cast<double>(y[rows[i] * C + c]);
            d_gates[i] = static_cast<T>(dot);
        }
    });
}

}  // namespace llmtrain

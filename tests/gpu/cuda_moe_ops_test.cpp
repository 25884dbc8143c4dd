// The CUDA backend's Mixture-of-Experts ops against the CPU f32 reference: the router
// (softmax and sigmoid, gates normalized or not, with and without the expert bias, forward
// and backward), the load statistics and the aux, sequence aux and z losses in f32; the
// permutation plan bit for bit (dropless, with a capacity that drops, every token sent to one
// expert, more assignments than one chunk of the plan's scan); permute and combine and their
// backwards in bf16 and f16; and two runs of each op bitwise equal. Each test is SKIPPED
// without a GPU (and runs under the CUDA emulation, emu.*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"

using namespace llmtrain;
using namespace llmtrain::gpu_test;

namespace {

constexpr DType bf16 = DType::bf16;
constexpr DType f16 = DType::f16;
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;
// Router results in fp32 from the same inputs: expf against the CPU's exp in double, one
// rounding to f32, sums over at most E terms.
constexpr Tolerance router_tolerance{1e-5, 1e-6};

class CudaMoe : public CudaVsCpuTest {
protected:
    OwnedTensor dev(const Tensor& host, DType dtype) { return to_device(gpu(), host, dtype); }
    OwnedTensor dev_zero(DType dtype, Shape shape) { return device_tensor(gpu(), dtype, shape); }
    std::vector<int32_t> ints(const Tensor& device) {
        std::vector<int32_t> out(static_cast<size_t>(device.numel()));
        gpu().copy_to_host(out.data(), device);
        return out;
    }
};

std::vector<int32_t> ints_of(const Tensor& host) { return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + host.numel()); }

std::string describe(int64_t N, int64_t E, int64_t k, MoeScore score, bool normalize, bool bias) {
    return cat("N ", N, " E ", E, " k ", k, score == MoeScore::softmax ? " softmax" : " sigmoid", normalize ? " normalized" : "", bias ? " with bias" : "");
}

// Experts [N, k] i32 on the host: each token's k distinct experts drawn at random, or every
// token's first choice `hot` when hot >= 0.
OwnedTensor expert_choices(int64_t N, int64_t E, int64_t k, uint64_t seed, int32_t hot = -1) {
    OwnedTensor out(i32, {N, k});
    std::mt19937_64 rng(seed);
    for (int64_t t = 0; t < N; ++t) {
        std::vector<int32_t> taken;
        if (hot >= 0) taken.push_back(hot);
        while (static_cast<int64_t>(taken.size()) < k) {
            const auto e = static_cast<int32_t>(rng() % static_cast<uint64_t>(E));
            if (std::find(taken.begin(), taken.end(), e) == taken.end()) taken.push_back(e);
        }
        for (int64_t j = 0; j < k; ++j) out.data<int32_t>()[t * k + j] = taken[static_cast<size_t>(j)];
    }
    return out;
}

}  // namespace

// ---- router ----

TEST_F(CudaMoe, RouteFwdBwd_F32_MatchesCpuForBothScoreFunctionsNormalizedOrNotWithAndWithoutBias) {
    struct Shape3 {
        int64_t N, E, k;
    };
    uint64_t seed = 9000;
    for (const Shape3 s : {Shape3{1, 4, 1}, Shape3{37, 8, 2}, Shape3{130, 64, 6}})
        for (MoeScore score : {MoeScore::softmax, MoeScore::sigmoid})
            for (bool normalize : {true, false})
                for (bool with_bias : {false, true}) {
                    SCOPED_TRACE(describe(s.N, s.E, s.k, score, normalize, with_bias));
                    const OwnedTensor logits = test::random_tensor(f32, {s.N, s.E}, ++seed, -4, 4);
                    const OwnedTensor bias = with_bias ? test::random_tensor(f32, {s.E}, ++seed, -0.2, 0.2) : OwnedTensor();
                    const OwnedTensor experts(i32, {s.N, s.k}), gates(f32, {s.N, s.k}), scores(f32, {s.N, s.E});
                    cpu().moe_route_fwd({.experts = experts, .gates = gates, .scores = scores, .logits = logits, .expert_bias = bias, .score = score,
                                         .normalize_top_k = normalize});
                    const OwnedTensor g_logits = dev(logits, f32), g_bias = with_bias ? dev(bias, f32) : OwnedTensor();
                    const OwnedTensor g_experts = dev_zero(i32, {s.N, s.k}), g_gates = dev_zero(f32, {s.N, s.k}), g_scores = dev_zero(f32, {s.N, s.E});
                    gpu().moe_route_fwd({.experts = g_experts, .gates = g_gates, .scores = g_scores, .logits = g_logits,
                                         .expert_bias = with_bias ? g_bias.view() : Tensor(), .score = score, .normalize_top_k = normalize});
                    EXPECT_EQ(ints(g_experts), ints_of(experts));
                    expect_matches("scores", gpu(), g_scores, scores, router_tolerance);
                    expect_matches("gates", gpu(), g_gates, gates, router_tolerance);

                    const OwnedTensor d_gates = test::random_tensor(f32, {s.N, s.k}, ++seed), start = test::random_tensor(f32, {s.N, s.E}, ++seed);
                    for (bool accumulate : {false, true}) {
                        const OwnedTensor d_logits = test::copy_of(start), g_d_logits = dev(start, f32);
                        cpu().moe_route_bwd({.d_logits = d_logits, .d_gates = d_gates, .gates = gates, .scores = scores, .experts = experts, .score = score,
                                             .normalize_top_k = normalize, .accumulate = accumulate});
                        gpu().moe_route_bwd({.d_logits = g_d_logits, .d_gates = dev(d_gates, f32), .gates = g_gates, .scores = g_scores,
                                             .experts = g_experts, .score = score, .normalize_top_k = normalize, .accumulate = accumulate});
                        // One expert, normalized: its gate is 1 whatever the logits, so d_logits is zero.
                        const CompareOptions zero_by_math{.min_scale = 0, .may_be_all_zero = normalize && s.k == 1};
                        expect_matches(accumulate ? "d_logits accumulated" : "d_logits", gpu(), g_d_logits, d_logits, router_tolerance, zero_by_math);
                    }
                }
}

// Load statistics at batch and sequence level, the aux loss from them, its backward, and the
// z loss: counts bit for bit, the rest within fp32 noise.
TEST_F(CudaMoe, LoadStatsAuxAndZLosses_F32_MatchCpuAtBatchAndSequenceLevel) {
    const int64_t N = 96, E = 40, k = 3;
    for (MoeScore score : {MoeScore::softmax, MoeScore::sigmoid})
        for (int64_t seq_len : {int64_t{0}, int64_t{32}}) {
            SCOPED_TRACE(cat(score == MoeScore::softmax ? "softmax" : "sigmoid", " seq_len ", seq_len));
            const int64_t G = seq_len ? N / seq_len : 1, T = N / G;
            const OwnedTensor logits = test::random_tensor(f32, {N, E}, 9100, -3, 3);
            const OwnedTensor experts(i32, {N, k}), gates(f32, {N, k}), scores(f32, {N, E});
            cpu().moe_route_fwd({.experts = experts, .gates = gates, .scores = scores, .logits = logits, .expert_bias = Tensor(), .score = score});
            const OwnedTensor counts(i32, {G, E}), sums(f32, {G, E}), loss(f32, {1});
            cpu().moe_load_stats({.counts = counts, .score_sums = sums, .experts = experts, .scores = scores, .seq_len = seq_len});
            cpu().moe_aux_loss_fwd({.loss = loss, .counts = counts, .score_sums = sums, .tokens_per_group = T, .top_k = k, .coeff = 0.01});
            const OwnedTensor g_experts = dev(experts, i32), g_scores = dev(scores, f32);
            const OwnedTensor g_counts = dev_zero(i32, {G, E}), g_sums = dev_zero(f32, {G, E}), g_loss = dev_zero(f32, {1});
            gpu().moe_load_stats({.counts = g_counts, .score_sums = g_sums, .experts = g_experts, .scores = g_scores, .seq_len = seq_len});
            gpu().moe_aux_loss_fwd({.loss = g_loss, .counts = g_counts, .score_sums = g_sums, .tokens_per_group = T, .top_k = k, .coeff = 0.01});
            EXPECT_EQ(ints(g_counts), ints_of(counts));
            expect_matches("score sums", gpu(), g_sums, sums, f32_sum_tolerance);
            expect_matches("aux loss", gpu(), g_loss, loss, f32_loss_tolerance);

            const OwnedTensor start = test::random_tensor(f32, {N, E}, 9101), d_logits = test::copy_of(start), g_d_logits = dev(start, f32);
            const MoeAuxLossBwd aux{.d_logits = d_logits, .scores = scores, .counts = counts, .seq_len = seq_len, .tokens_per_group = T, .top_k = k,
                                    .coeff = 0.01, .dloss = 0.5, .score = score};
            cpu().moe_aux_loss_bwd(aux);
            MoeAuxLossBwd g_aux = aux;
            g_aux.d_logits = g_d_logits;
            g_aux.scores = g_scores;
            g_aux.counts = g_counts;
            gpu().moe_aux_loss_bwd(g_aux);
            expect_matches("aux d_logits", gpu(), g_d_logits, d_logits, router_tolerance);
        }
    const OwnedTensor logits = test::random_tensor(f32, {N, E}, 9102, -5, 5), loss(f32, {1}), g_loss = dev_zero(f32, {1});
    const OwnedTensor g_logits = dev(logits, f32);
    cpu().moe_z_loss_fwd({.loss = loss, .logits = logits, .coeff = 1e-3});
    gpu().moe_z_loss_fwd({.loss = g_loss, .logits = g_logits, .coeff = 1e-3});
    expect_matches("z loss", gpu(), g_loss, loss, f32_loss_tolerance);
    const OwnedTensor start = test::random_tensor(f32, {N, E}, 9103), d_logits = test::copy_of(start), g_d_logits = dev(start, f32);
    cpu().moe_z_loss_bwd({.d_logits = d_logits, .logits = logits, .coeff = 1e-3, .dloss = 2});
    gpu().moe_z_loss_bwd({.d_logits = g_d_logits, .logits = g_logits, .coeff = 1e-3, .dloss = 2});
    expect_matches("z d_logits", gpu(), g_d_logits, d_logits, router_tolerance);
}

// ---- permutation ----

namespace {

struct PlanCase {
    int64_t N, E, k, capacity;
    int32_t hot;  // >= 0: every token's first choice
    std::string str() const { return cat("N ", N, " E ", E, " k ", k, " capacity ", capacity, hot >= 0 ? cat(" every token to expert ", hot) : ""); }
    int64_t rows() const { return capacity ? E * capacity : N * k; }
};

// Dropless and dropping, every token to one expert (dropless: its block holds all N rows), and
// 1,600 and 3,000 assignments: the scan runs over 7 and 12 chunks of 256.
const PlanCase plan_cases[] = {
    {1, 1, 1, 0, -1},   {5, 4, 2, 0, -1},  {37, 8, 2, 0, -1},  {37, 8, 2, 5, -1},    {800, 16, 2, 0, -1},
    {800, 16, 2, 90, -1}, {300, 64, 6, 0, 5}, {300, 64, 6, 20, 5}, {257, 4, 1, 0, 3}, {257, 4, 1, 64, 3},
};

}  // namespace

TEST_F(CudaMoe, PermutePlan_IsBitwiseTheCpusDroplessWithDropsAndWithEveryTokenOnOneExpert) {
    uint64_t seed = 9200;
    for (const PlanCase& c : plan_cases) {
        SCOPED_TRACE(c.str());
        const OwnedTensor experts = expert_choices(c.N, c.E, c.k, ++seed, c.hot);
        const int64_t R = c.rows();
        const OwnedTensor rows(i32, {c.N, c.k}), sources(i32, {R}), counts(i32, {c.E}), dropped(i32, {c.E});
        cpu().moe_permute_plan({.rows = rows, .sources = sources, .counts = counts, .dropped = dropped, .experts = experts, .capacity = c.capacity});
        const OwnedTensor g_rows = dev_zero(i32, {c.N, c.k}), g_sources = dev_zero(i32, {R}), g_counts = dev_zero(i32, {c.E}), g_dropped = dev_zero(i32, {c.E});
        gpu().moe_permute_plan({.rows = g_rows, .sources = g_sources, .counts = g_counts, .dropped = g_dropped, .experts = dev(experts, i32), .capacity = c.capacity});
        EXPECT_EQ(ints(g_rows), ints_of(rows));
        EXPECT_EQ(ints(g_sources), ints_of(sources));
        EXPECT_EQ(ints(g_counts), ints_of(counts));
        EXPECT_EQ(ints(g_dropped), ints_of(dropped));
        if (c.hot >= 0 && c.capacity) {
            EXPECT_EQ(ints_of(dropped)[static_cast<size_t>(c.hot)], c.N - c.capacity) << "the hot expert must drop";
        }
    }
}

// Gather, combine and both backwards on the plans above, in bf16 and f16: x_perm bitwise
// (a copy), dx and out within one rounding of an fp32 sum of k terms, d_y_perm within one
// rounding of a product, d_gates (fp32 dots over C) within fp32 noise.
TEST_F(CudaMoe, PermuteAndCombineFwdBwd_Bf16AndF16_MatchCpuOnEveryPlan) {
    uint64_t seed = 9300;
    for (DType dt : {bf16, f16})
        for (const PlanCase& c : plan_cases) {
            const int64_t C = c.N > 100 ? 24 : 37, R = c.rows();
            SCOPED_TRACE(cat(c.str(), " C ", C, " ", dtype_name(dt)));
            const OwnedTensor experts = expert_choices(c.N, c.E, c.k, ++seed, c.hot);
            const OwnedTensor rows(i32, {c.N, c.k}), sources(i32, {R}), counts(i32, {c.E});
            cpu().moe_permute_plan({.rows = rows, .sources = sources, .counts = counts, .dropped = Tensor(), .experts = experts, .capacity = c.capacity});
            const OwnedTensor g_rows = dev(rows, i32), g_sources = dev(sources, i32);
            const OwnedTensor x = random_input(dt, {c.N, C}, ++seed), x_perm(f32, {R, C}), g_x_perm = dev_zero(dt, {R, C});
            cpu().moe_permute_fwd({.x_perm = x_perm, .x = x, .sources = sources, .top_k = c.k});
            gpu().moe_permute_fwd({.x_perm = g_x_perm, .x = dev(x, dt), .sources = g_sources, .top_k = c.k});
            EXPECT_EQ(download(gpu(), g_x_perm), values_of(x_perm)) << "x_perm";

            const OwnedTensor d_perm = random_input(dt, {R, C}, ++seed), dx(f32, {c.N, C}), g_dx = dev_zero(dt, {c.N, C});
            cpu().moe_permute_bwd({.dx = dx, .d_x_perm = d_perm, .rows = rows});
            gpu().moe_permute_bwd({.dx = g_dx, .d_x_perm = dev(d_perm, dt), .rows = g_rows});
            expect_matches("dx", gpu(), g_dx, dx, elementwise_tolerance(dt));

            const OwnedTensor y = random_input(dt, {R, C}, ++seed), gates = test::random_tensor(f32, {c.N, c.k}, ++seed, 0.05, 1);
            const OwnedTensor out(f32, {c.N, C}), g_y = dev(y, dt), g_gates = dev(gates, f32), g_out = dev_zero(dt, {c.N, C});
            cpu().moe_combine_fwd({.out = out, .y_perm = y, .gates = gates, .rows = rows});
            gpu().moe_combine_fwd({.out = g_out, .y_perm = g_y, .gates = g_gates, .rows = g_rows});
            expect_matches("out", gpu(), g_out, out, elementwise_tolerance(dt));

            const OwnedTensor d_out = random_input(dt, {c.N, C}, ++seed), d_y(f32, {R, C}), d_gates(f32, {c.N, c.k});
            const OwnedTensor g_d_y = dev_zero(dt, {R, C}), g_d_gates = dev_zero(f32, {c.N, c.k});
            cpu().moe_combine_bwd({.d_y_perm = d_y, .d_gates = d_gates, .d_out = d_out, .y_perm = y, .gates = gates, .rows = rows, .sources = sources});
            gpu().moe_combine_bwd({.d_y_perm = g_d_y, .d_gates = g_d_gates, .d_out = dev(d_out, dt), .y_perm = g_y, .gates = g_gates, .rows = g_rows,
                                   .sources = g_sources});
            expect_matches("d_y_perm", gpu(), g_d_y, d_y, elementwise_tolerance(dt));
            expect_matches("d_gates", gpu(), g_d_gates, d_gates, f32_sum_tolerance);
        }
}

// Bad arguments are refused on the host before any launch, naming the op and the value.
TEST_F(CudaMoe, BadArguments_AreRefusedNamingTheOpAndTheValue) {
    const OwnedTensor logits = dev_zero(f32, {6, 4}), experts5 = dev_zero(i32, {6, 5}), scores = dev_zero(f32, {6, 4});
    auto refused = [](const std::vector<std::string>& words, const std::function<void()>& call) {
        try {
            call();
            ADD_FAILURE() << "no error; expected one naming " << words.front();
        } catch (const Error& e) {
            for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
        }
    };
    refused({"moe_route_fwd", "top_k 5"}, [&] {
        gpu().moe_route_fwd({.experts = experts5, .gates = dev_zero(f32, {6, 5}), .scores = scores, .logits = logits, .expert_bias = Tensor()});
    });
    refused({"moe_route_fwd", "logits", "bf16"}, [&] {
        gpu().moe_route_fwd({.experts = dev_zero(i32, {6, 2}), .gates = dev_zero(f32, {6, 2}), .scores = scores, .logits = dev_zero(bf16, {6, 4}),
                             .expert_bias = Tensor()});
    });
    refused({"moe_permute_plan", "capacity -3"}, [&] {
        gpu().moe_permute_plan({.rows = dev_zero(i32, {6, 2}), .sources = dev_zero(i32, {12}), .counts = dev_zero(i32, {4}), .dropped = Tensor(), .experts = dev_zero(i32, {6, 2}),
                                .capacity = -3});
    });
    refused({"moe_combine_fwd", "gates"}, [&] {
        gpu().moe_combine_fwd({.out = dev_zero(bf16, {6, 8}), .y_perm = dev_zero(bf16, {12, 8}), .gates = dev_zero(f32, {6, 3}), .rows = dev_zero(i32, {6, 2})});
    });
}

// ---- determinism ----

TEST_F(CudaMoe, EveryOp_TwoRunsAreBitwiseEqual) {
    const int64_t N = 600, E = 32, k = 4, C = 40, capacity = 70, R = E * capacity;
    const OwnedTensor logits = dev(test::random_tensor(f32, {N, E}, 9400, -3, 3), f32);
    auto run = [&] {
        std::vector<OwnedTensor> o;
        o.push_back(dev_zero(i32, {N, k}));
        o.push_back(dev_zero(f32, {N, k}));
        o.push_back(dev_zero(f32, {N, E}));
        gpu().moe_route_fwd({.experts = o[0], .gates = o[1], .scores = o[2], .logits = logits, .expert_bias = Tensor(), .score = MoeScore::sigmoid});
        o.push_back(dev_zero(i32, {N, k}));
        o.push_back(dev_zero(i32, {R}));
        o.push_back(dev_zero(i32, {E}));
        gpu().moe_permute_plan({.rows = o[3], .sources = o[4], .counts = o[5], .dropped = Tensor(), .experts = o[0], .capacity = capacity});
        o.push_back(dev_zero(i32, {1, E}));
        o.push_back(dev_zero(f32, {1, E}));
        gpu().moe_load_stats({.counts = o[6], .score_sums = o[7], .experts = o[0], .scores = o[2], .seq_len = 0});
        o.push_back(dev_zero(f32, {1}));
        gpu().moe_z_loss_fwd({.loss = o[8], .logits = logits, .coeff = 1e-3});
        o.push_back(dev(test::filled(f32, {N, E}, 0), f32));
        gpu().moe_route_bwd({.d_logits = o[9], .d_gates = o[1], .gates = o[1], .scores = o[2], .experts = o[0], .score = MoeScore::sigmoid});
        gpu().moe_aux_loss_bwd({.d_logits = o[9], .scores = o[2], .counts = o[6], .tokens_per_group = N, .top_k = k, .coeff = 0.01, .score = MoeScore::sigmoid});
        const OwnedTensor x = dev(random_input(bf16, {N, C}, 9401), bf16);
        o.push_back(dev_zero(bf16, {R, C}));
        gpu().moe_permute_fwd({.x_perm = o[10], .x = x, .sources = o[4], .top_k = k});
        o.push_back(dev_zero(bf16, {N, C}));
        gpu().moe_combine_fwd({.out = o[11], .y_perm = o[10], .gates = o[1], .rows = o[3]});
        o.push_back(dev_zero(bf16, {R, C}));
        o.push_back(dev_zero(f32, {N, k}));
        gpu().moe_combine_bwd({.d_y_perm = o[12], .d_gates = o[13], .d_out = o[11], .y_perm = o[10], .gates = o[1], .rows = o[3], .sources = o[4]});
        o.push_back(dev_zero(bf16, {N, C}));
        gpu().moe_permute_bwd({.dx = o[14], .d_x_perm = o[12], .rows = o[3]});
        return o;
    };
    const std::vector<OwnedTensor> first = run(), second = run();
    for (size_t i = 0; i < first.size(); ++i)
        expect_bitwise_equal(cat("output ", i), download_bytes(gpu(), first[i]), download_bytes(gpu(), second[i]), dtype_size(first[i].view().dtype()));
}

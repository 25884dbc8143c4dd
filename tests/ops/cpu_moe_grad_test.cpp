// The Mixture-of-Experts ops' backwards on the CPU in f64 against central finite differences:
// the router (softmax and sigmoid, gates normalized or not, with the expert bias), the aux
// loss at batch and sequence level, the z loss, the permutation and the combine (gates and
// expert outputs), dropless and with a capacity that drops. Gradients that accumulate start
// from a pre-filled buffer; those that are overwritten start from garbage.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr DType i32 = DType::i32;
constexpr double prefill = 0.375;
constexpr double garbage = 99.0;

// Logits spread over [-2, 2]: the top-k choice has no near-ties a step of 1e-5 could flip.
OwnedTensor router_logits(int64_t N, int64_t E, uint64_t seed) { return random_tensor(f64, {N, E}, seed, -2, 2); }

struct RouteCase {
    MoeScore score;
    bool normalize, bias;
};

void check_route(RouteCase c, bool accumulate) {
    SCOPED_TRACE(testing::Message() << (c.score == MoeScore::softmax ? "softmax" : "sigmoid") << " normalize=" << c.normalize << " bias=" << c.bias
                                    << " accumulate=" << accumulate);
    auto be = make_cpu_backend(1);
    const int64_t N = 7, E = 6, k = 3;
    const OwnedTensor logits = router_logits(N, E, 100), bias = c.bias ? random_tensor(f64, {E}, 101, -0.3, 0.3) : OwnedTensor();
    const OwnedTensor experts(i32, {N, k}), gates(f64, {N, k}), scores(f64, {N, E}), R = random_tensor(f64, {N, k}, 102);
    auto loss = [&] {
        be->moe_route_fwd({.experts = experts, .gates = gates, .scores = scores, .logits = logits, .expert_bias = bias, .score = c.score, .normalize_top_k = c.normalize});
        return weighted_sum(gates, R);
    };
    loss();
    const OwnedTensor d_logits = filled(f64, {N, E}, accumulate ? prefill : garbage);
    be->moe_route_bwd({.d_logits = d_logits, .d_gates = R, .gates = gates, .scores = scores, .experts = experts, .score = c.score,
                       .normalize_top_k = c.normalize, .accumulate = accumulate});
    expect_gradient_matches("d_logits", logits, d_logits, loss, accumulate ? prefill : 0);
}

// The aux loss of route(logits), its counts fixed at the unperturbed routing (f carries no
// gradient), over groups of seq_len tokens (0: one group).
void check_aux_loss(MoeScore score, int64_t seq_len) {
    SCOPED_TRACE(testing::Message() << (score == MoeScore::softmax ? "softmax" : "sigmoid") << " seq_len=" << seq_len);
    auto be = make_cpu_backend(1);
    const int64_t N = 8, E = 5, k = 2, G = seq_len ? N / seq_len : 1, T = N / G;
    const OwnedTensor logits = router_logits(N, E, 200);
    const OwnedTensor experts(i32, {N, k}), gates(f64, {N, k}), scores(f64, {N, E}), counts(i32, {G, E}), sums(f64, {G, E}), aux(f64, {1});
    const double coeff = 0.7;
    auto loss = [&] {
        be->moe_route_fwd({.experts = experts, .gates = gates, .scores = scores, .logits = logits, .expert_bias = Tensor(), .score = score, .normalize_top_k = true});
        be->moe_load_stats({.counts = counts, .score_sums = sums, .experts = experts, .scores = scores, .seq_len = seq_len});
        be->moe_aux_loss_fwd({.loss = aux, .counts = counts, .score_sums = sums, .tokens_per_group = T, .top_k = k, .coeff = coeff});
        return 3.0 * aux.data<double>()[0];
    };
    loss();
    const OwnedTensor d_logits = filled(f64, {N, E}, prefill);
    be->moe_aux_loss_bwd({.d_logits = d_logits, .scores = scores, .counts = counts, .seq_len = seq_len, .tokens_per_group = T, .top_k = k,
                          .coeff = coeff, .dloss = 3.0, .score = score});
    expect_gradient_matches("d_logits", logits, d_logits, loss, prefill);
}

void check_permute(int64_t capacity) {
    SCOPED_TRACE(testing::Message() << "capacity=" << capacity);
    auto be = make_cpu_backend(1);
    const int64_t N = 9, E = 4, k = 2, C = 5, R = capacity ? E * capacity : N * k;
    const OwnedTensor logits = router_logits(N, E, 300);
    const OwnedTensor experts(i32, {N, k}), gates(f64, {N, k}), scores(f64, {N, E});
    be->moe_route_fwd({.experts = experts, .gates = gates, .scores = scores, .logits = logits, .expert_bias = Tensor(), .score = MoeScore::softmax, .normalize_top_k = true});
    const OwnedTensor rows(i32, {N, k}), sources(i32, {R}), counts(i32, {E}), dropped(i32, {E});
    be->moe_permute_plan({.rows = rows, .sources = sources, .counts = counts, .dropped = dropped, .experts = experts, .capacity = capacity});
    int64_t drops = 0;
    for (int64_t e = 0; e < E; ++e) drops += dropped.data<int32_t>()[e];
    if (capacity) EXPECT_GT(drops, 0) << "the case must drop assignments";

    const OwnedTensor x = random_tensor(f64, {N, C}, 301), x_perm(f64, {R, C}), R_perm = random_tensor(f64, {R, C}, 302);
    auto permute_loss = [&] {
        be->moe_permute_fwd({.x_perm = x_perm, .x = x, .sources = sources, .top_k = k});
        return weighted_sum(x_perm, R_perm);
    };
    const OwnedTensor dx = filled(f64, {N, C}, garbage);
    be->moe_permute_bwd({.dx = dx, .d_x_perm = R_perm, .rows = rows});
    expect_gradient_matches("dx", x, dx, permute_loss);

    const OwnedTensor y = random_tensor(f64, {R, C}, 303), out(f64, {N, C}), R_out = random_tensor(f64, {N, C}, 304);
    const OwnedTensor combine_gates = random_tensor(f64, {N, k}, 305, 0.1, 1);
    auto combine_loss = [&] {
        be->moe_combine_fwd({.out = out, .y_perm = y, .gates = combine_gates, .rows = rows});
        return weighted_sum(out, R_out);
    };
    const OwnedTensor d_y = filled(f64, {R, C}, garbage), d_gates = filled(f64, {N, k}, garbage);
    be->moe_combine_bwd({.d_y_perm = d_y, .d_gates = d_gates, .d_out = R_out, .y_perm = y, .gates = combine_gates, .rows = rows, .sources = sources});
    expect_gradient_matches("d_y_perm", y, d_y, combine_loss);
    expect_gradient_matches("d_gates", combine_gates, d_gates, combine_loss);
}

}  // namespace

TEST(CpuMoeGrad, RouteSoftmax_MatchesFiniteDifferencesNormalizedOrNotWithAndWithoutBias) {
    for (bool normalize : {true, false})
        for (bool bias : {false, true}) check_route({MoeScore::softmax, normalize, bias}, false);
}

TEST(CpuMoeGrad, RouteSigmoid_MatchesFiniteDifferencesNormalizedOrNotWithAndWithoutBias) {
    for (bool normalize : {true, false})
        for (bool bias : {false, true}) check_route({MoeScore::sigmoid, normalize, bias}, false);
}

TEST(CpuMoeGrad, RouteBwd_AccumulatesIntoDLogitsWhenAsked) {
    check_route({MoeScore::softmax, true, false}, true);
    check_route({MoeScore::sigmoid, true, true}, true);
}

TEST(CpuMoeGrad, AuxLoss_MatchesFiniteDifferencesForBothScoreFunctions) {
    check_aux_loss(MoeScore::softmax, 0);
    check_aux_loss(MoeScore::sigmoid, 0);
}

TEST(CpuMoeGrad, SequenceAuxLoss_MatchesFiniteDifferencesPerSequence) {
    check_aux_loss(MoeScore::softmax, 4);
    check_aux_loss(MoeScore::sigmoid, 2);
}

TEST(CpuMoeGrad, ZLoss_MatchesFiniteDifferences) {
    auto be = make_cpu_backend(1);
    const int64_t N = 6, E = 7;
    const OwnedTensor logits = random_tensor(f64, {N, E}, 400, -3, 3), z(f64, {1});
    auto loss = [&] {
        be->moe_z_loss_fwd({.loss = z, .logits = logits, .coeff = 0.05});
        return 2.0 * z.data<double>()[0];
    };
    const OwnedTensor d_logits = filled(f64, {N, E}, prefill);
    be->moe_z_loss_bwd({.d_logits = d_logits, .logits = logits, .coeff = 0.05, .dloss = 2.0});
    expect_gradient_matches("d_logits", logits, d_logits, loss, prefill);
}

TEST(CpuMoeGrad, PermuteAndCombine_MatchFiniteDifferencesDropless) { check_permute(0); }

TEST(CpuMoeGrad, PermuteAndCombine_MatchFiniteDifferencesWithDroppedAssignments) { check_permute(3); }

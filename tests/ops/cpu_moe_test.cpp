// The CPU backend's Mixture-of-Experts ops against values worked out by hand (backend.h
// states the math): the router's softmax and sigmoid scores, top-k with and without the
// expert bias, its ties and order, gates with and without normalization; the load statistics
// and the aux and z losses; the stable permutation, dropless and with a capacity that drops,
// a router that sends every token to one expert, and the refusal of bad arguments. Each
// value case runs in f32 and f64.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "op_test_util.h"

using namespace llmtrain;
using namespace llmtrain::test;

namespace {

constexpr DType f64 = DType::f64;
constexpr DType f32 = DType::f32;
constexpr DType i32 = DType::i32;

OwnedTensor values(DType dtype, Shape shape, const std::vector<double>& v) {
    OwnedTensor t(dtype, shape);
    EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, v[static_cast<size_t>(i)]);
    return t;
}

OwnedTensor ints(Shape shape, const std::vector<int32_t>& v) {
    OwnedTensor t(i32, shape);
    EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = v[static_cast<size_t>(i)];
    return t;
}

std::vector<int32_t> ints_of(const Tensor& t) { return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel()); }

void expect_values(const char* name, const Tensor& actual, const std::vector<double>& expected) {
    const double tol = actual.dtype() == f64 ? 1e-14 : 1e-6;
    ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << name;
    for (int64_t i = 0; i < actual.numel(); ++i)
        EXPECT_NEAR(get(actual, i), expected[static_cast<size_t>(i)], tol) << name << "[" << i << "] in " << dtype_name(actual.dtype());
}

struct Routed {
    OwnedTensor experts, gates, scores;
};

Routed route(Backend& be, const Tensor& logits, int64_t k, MoeScore score, bool normalize, const Tensor& bias = Tensor()) {
    const int64_t N = logits.dim(0), E = logits.dim(1);
    Routed r{OwnedTensor(i32, {N, k}), OwnedTensor(logits.dtype(), {N, k}), OwnedTensor(logits.dtype(), {N, E})};
    be.moe_route_fwd({.experts = r.experts, .gates = r.gates, .scores = r.scores, .logits = logits, .expert_bias = bias, .score = score, .normalize_top_k = normalize});
    return r;
}

const double ln2 = std::log(2.0), ln3 = std::log(3.0), ln4 = std::log(4.0), ln9 = std::log(9.0);

}  // namespace

// softmax(log [1, 2, 3, 4]) = [0.1, 0.2, 0.3, 0.4]: the top 2 are experts 3 and 2, gates 0.4
// and 0.3, or 4/7 and 3/7 normalized; the top 3 come in descending order 3, 2, 1.
TEST(CpuMoe, RouteSoftmax_ChoosesTheLargestScoresInDescendingOrderWithAndWithoutNormalization) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor logits = values(dt, {1, 4}, {0, ln2, ln3, ln4});
        const Routed plain = route(*be, logits, 2, MoeScore::softmax, false);
        expect_values("scores", plain.scores, {0.1, 0.2, 0.3, 0.4});
        EXPECT_EQ(ints_of(plain.experts), (std::vector<int32_t>{3, 2}));
        expect_values("gates", plain.gates, {0.4, 0.3});
        const Routed normalized = route(*be, logits, 2, MoeScore::softmax, true);
        EXPECT_EQ(ints_of(normalized.experts), (std::vector<int32_t>{3, 2}));
        expect_values("normalized gates", normalized.gates, {4.0 / 7, 3.0 / 7});
        EXPECT_EQ(ints_of(route(*be, logits, 3, MoeScore::softmax, true).experts), (std::vector<int32_t>{3, 2, 1}));
    }
}

// sigmoid of [0, ln 3, -ln 3, ln 9] = [0.5, 0.75, 0.25, 0.9]: experts 3 and 1, gates 0.9 and
// 0.75, or 6/11 and 5/11 normalized.
TEST(CpuMoe, RouteSigmoid_ChoosesTheLargestScoresWithAndWithoutNormalization) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor logits = values(dt, {1, 4}, {0, ln3, -ln3, ln9});
        const Routed plain = route(*be, logits, 2, MoeScore::sigmoid, false);
        expect_values("scores", plain.scores, {0.5, 0.75, 0.25, 0.9});
        EXPECT_EQ(ints_of(plain.experts), (std::vector<int32_t>{3, 1}));
        expect_values("gates", plain.gates, {0.9, 0.75});
        expect_values("normalized gates", route(*be, logits, 2, MoeScore::sigmoid, true).gates, {6.0 / 11, 5.0 / 11});
    }
}

// Scores [0.1, 0.2, 0.3, 0.4] with bias [0.5, 0, 0, 0]: selection values [0.6, 0.2, 0.3, 0.4]
// choose experts 0 and 3, and the gates are their unbiased scores 0.1 and 0.4 (0.2, 0.8 normalized).
TEST(CpuMoe, RouteExpertBias_ChangesTheChoiceButNotTheGates) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor logits = values(dt, {1, 4}, {0, ln2, ln3, ln4}), bias = values(dt, {4}, {0.5, 0, 0, 0});
        const Routed plain = route(*be, logits, 2, MoeScore::softmax, false, bias);
        EXPECT_EQ(ints_of(plain.experts), (std::vector<int32_t>{0, 3}));
        expect_values("gates", plain.gates, {0.1, 0.4});
        expect_values("scores", plain.scores, {0.1, 0.2, 0.3, 0.4});
        expect_values("normalized gates", route(*be, logits, 2, MoeScore::softmax, true, bias).gates, {0.2, 0.8});
    }
}

// Equal logits: every score 1/4 and the lower indices win (experts 0, 1). A bias [0, 0.1, 0.1, 0]
// ties experts 1 and 2 above the rest: 1 comes first.
TEST(CpuMoe, RouteTies_GoToTheLowerExpertIndex) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor logits = values(dt, {2, 4}, {0, 0, 0, 0, 1, 1, 1, 1});
        const Routed r = route(*be, logits, 2, MoeScore::softmax, true);
        EXPECT_EQ(ints_of(r.experts), (std::vector<int32_t>{0, 1, 0, 1}));
        expect_values("gates", r.gates, {0.5, 0.5, 0.5, 0.5});
        const OwnedTensor bias = values(dt, {4}, {0, 0.1, 0.1, 0});
        EXPECT_EQ(ints_of(route(*be, logits, 2, MoeScore::sigmoid, false, bias).experts), (std::vector<int32_t>{1, 2, 1, 2}));
    }
}

// Four tokens, three experts, top-1 to experts [0, 0, 1, 2]; in two sequences of 2 as well.
// With counts [2, 1, 1], score sums [1.5, 1, 1.5] over T = 4 tokens and coeff 0.1:
// f = [0.5, 0.25, 0.25], P = [0.375, 0.25, 0.375], loss = 0.1 * 3 * (0.1875 + 0.0625 + 0.09375).
TEST(CpuMoe, LoadStatsAndAuxLoss_GiveTheCountsScoreSumsAndSwitchLossByHand) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor experts = ints({4, 1}, {0, 0, 1, 2});
        const OwnedTensor scores = values(dt, {4, 3}, {0.5, 0.25, 0.25, 0.5, 0.25, 0.25, 0.25, 0.5, 0.25, 0.25, 0, 0.75});
        const OwnedTensor counts(i32, {1, 3}), sums(dt, {1, 3});
        be->moe_load_stats({.counts = counts, .score_sums = sums, .experts = experts, .scores = scores, .seq_len = 0});
        EXPECT_EQ(ints_of(counts), (std::vector<int32_t>{2, 1, 1}));
        expect_values("score sums", sums, {1.5, 1.0, 1.5});
        const OwnedTensor seq_counts(i32, {2, 3}), seq_sums(dt, {2, 3});
        be->moe_load_stats({.counts = seq_counts, .score_sums = seq_sums, .experts = experts, .scores = scores, .seq_len = 2});
        EXPECT_EQ(ints_of(seq_counts), (std::vector<int32_t>{2, 0, 0, 0, 1, 1}));
        expect_values("sequence score sums", seq_sums, {1.0, 0.5, 0.5, 0.5, 0.5, 1.0});
        const OwnedTensor loss(dt, {1});
        be->moe_aux_loss_fwd({.loss = loss, .counts = counts, .score_sums = sums, .tokens_per_group = 4, .top_k = 1, .coeff = 0.1});
        expect_values("aux loss", loss, {0.1 * 3 * (0.5 * 0.375 + 0.25 * 0.25 + 0.25 * 0.375)});
        // Per sequence (T = 2): f = [1, 0, 0] and [0, .5, .5]; P = [.5, .25, .25] and [.25, .25, .5].
        be->moe_aux_loss_fwd({.loss = loss, .counts = seq_counts, .score_sums = seq_sums, .tokens_per_group = 2, .top_k = 1, .coeff = 0.1});
        expect_values("sequence aux loss", loss, {0.1 * 3 / 2 * (1 * 0.5 + 0.5 * 0.25 + 0.5 * 0.5)});
    }
}

// Rows [0, 0] and [0, ln 3] have logsumexp ln 2 and ln 4 = 2 ln 2: loss = coeff (1 + 4) ln2^2 / 2.
TEST(CpuMoe, ZLoss_IsTheMeanSquaredLogsumexpByHand) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor logits = values(dt, {2, 2}, {0, 0, 0, ln3}), loss(dt, {1});
        be->moe_z_loss_fwd({.loss = loss, .logits = logits, .coeff = 0.01});
        expect_values("z loss", loss, {0.01 * 5 * ln2 * ln2 / 2});
    }
}

// Experts [[1, 0], [1, 2], [0, 1]]: expert 0 holds assignments (0, 1), (2, 0); expert 1 holds
// (0, 0), (1, 0), (2, 1); expert 2 holds (1, 1). Dropless rows follow in that order; with
// capacity 2, expert 1's third assignment (2, 1) is dropped and expert 2 leaves a padding row.
TEST(CpuMoe, PermutePlan_OrdersByExpertThenTokenThenSlotAndDropsBeyondCapacity) {
    auto be = make_cpu_backend(1);
    const OwnedTensor experts = ints({3, 2}, {1, 0, 1, 2, 0, 1});
    const OwnedTensor rows(i32, {3, 2}), sources(i32, {6}), counts(i32, {3}), dropped(i32, {3});
    be->moe_permute_plan({.rows = rows, .sources = sources, .counts = counts, .dropped = dropped, .experts = experts, .capacity = 0});
    EXPECT_EQ(ints_of(rows), (std::vector<int32_t>{2, 0, 3, 5, 1, 4}));
    EXPECT_EQ(ints_of(sources), (std::vector<int32_t>{1, 4, 0, 2, 5, 3}));
    EXPECT_EQ(ints_of(counts), (std::vector<int32_t>{2, 3, 1}));
    EXPECT_EQ(ints_of(dropped), (std::vector<int32_t>{0, 0, 0}));
    be->moe_permute_plan({.rows = rows, .sources = sources, .counts = counts, .dropped = dropped, .experts = experts, .capacity = 2});
    EXPECT_EQ(ints_of(rows), (std::vector<int32_t>{2, 0, 3, 4, 1, -1}));
    EXPECT_EQ(ints_of(sources), (std::vector<int32_t>{1, 4, 0, 2, 3, -1}));
    EXPECT_EQ(ints_of(counts), (std::vector<int32_t>{2, 2, 1}));
    EXPECT_EQ(ints_of(dropped), (std::vector<int32_t>{0, 1, 0}));
}

// Gather, combine and their backwards on the capacity-2 plan above, values by hand: x rows
// [t + 1, 10 (t + 1)], y_perm rows [r, -r], gates [[0.5, 0.25], [1, 2], [3, 4]].
TEST(CpuMoe, PermuteAndCombine_GatherAndSumTheKeptSlotsByHand) {
    auto be = make_cpu_backend(1);
    for (DType dt : {f32, f64}) {
        const OwnedTensor rows = ints({3, 2}, {2, 0, 3, 4, 1, -1}), sources = ints({6}, {1, 4, 0, 2, 3, -1});
        const OwnedTensor x = values(dt, {3, 2}, {1, 10, 2, 20, 3, 30}), x_perm(dt, {6, 2});
        be->moe_permute_fwd({.x_perm = x_perm, .x = x, .sources = sources, .top_k = 2});
        expect_values("x_perm", x_perm, {1, 10, 3, 30, 1, 10, 2, 20, 2, 20, 0, 0});
        const OwnedTensor dx = filled(dt, {3, 2}, 99);
        be->moe_permute_bwd({.dx = dx, .d_x_perm = x_perm, .rows = rows});
        // token 0: rows 2 and 0 (x twice); token 1: rows 3, 4; token 2: row 1 only.
        expect_values("dx", dx, {2, 20, 4, 40, 3, 30});
        const OwnedTensor y = values(dt, {6, 2}, {0, 0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5}), gates = values(dt, {3, 2}, {0.5, 0.25, 1, 2, 3, 4});
        const OwnedTensor out = filled(dt, {3, 2}, 99);
        be->moe_combine_fwd({.out = out, .y_perm = y, .gates = gates, .rows = rows});
        expect_values("out", out, {0.5 * 2, -0.5 * 2, 1 * 3 + 2 * 4, -(1 * 3 + 2 * 4), 3 * 1, -3 * 1});
        const OwnedTensor d_out = values(dt, {3, 2}, {1, 2, 3, 4, 5, 6}), d_y = filled(dt, {6, 2}, 99), d_gates = filled(dt, {3, 2}, 99);
        be->moe_combine_bwd({.d_y_perm = d_y, .d_gates = d_gates, .d_out = d_out, .y_perm = y, .gates = gates, .rows = rows, .sources = sources});
        expect_values("d_y_perm", d_y, {0.25, 0.5, 15, 18, 0.5, 1, 3, 4, 6, 8, 0, 0});
        expect_values("d_gates", d_gates, {2 - 4, 0, 9 - 12, 12 - 16, 5 - 6, 0});
    }
}

// A router whose logits favour expert 2 for every token (top-2: expert 0 second, by the tie
// rule): dropless, experts 2 and 0 hold five rows each. With capacity 3 of 5 tokens, two
// of expert 2's and two of expert 0's assignments are dropped, the dropped tokens get zero
// outputs and gradients, and nothing is written beyond the buffers (sentinels after each).
TEST(CpuMoe, EveryTokenToOneExpert_IsRoutedDroplessAndWithACapacityWithoutOverrun) {
    auto be = make_cpu_backend(1);
    const int64_t N = 5, E = 4, k = 2, C = 3;
    std::vector<double> l(N * E, 0.0);
    for (int64_t t = 0; t < N; ++t) l[static_cast<size_t>(t * E + 2)] = 10.0;
    const OwnedTensor logits = values(f64, {N, E}, l);
    const Routed r = route(*be, logits, k, MoeScore::softmax, true);
    for (int64_t t = 0; t < N; ++t) EXPECT_EQ(ints_of(r.experts)[static_cast<size_t>(t * k)], 2);
    const OwnedTensor x = random_tensor(f64, {N, C}, 7);
    for (int64_t capacity : {int64_t{0}, int64_t{3}}) {
        SCOPED_TRACE(testing::Message() << "capacity " << capacity);
        const int64_t R = capacity ? E * capacity : N * k;
        // One sentinel element past every output, checked after the ops.
        OwnedTensor rows(i32, {N * k + 1}), sources(i32, {R + 1}), counts(i32, {E + 1}), dropped(i32, {E + 1});
        for (const OwnedTensor* t : {&rows, &sources, &counts, &dropped}) t->data<int32_t>()[t->numel() - 1] = 12345;
        const Tensor rows_v(rows.data<int32_t>(), i32, {N, k}), sources_v(sources.data<int32_t>(), i32, {R});
        be->moe_permute_plan({.rows = rows_v, .sources = sources_v, .counts = Tensor(counts.data<int32_t>(), i32, {E}),
                              .dropped = Tensor(dropped.data<int32_t>(), i32, {E}), .experts = r.experts, .capacity = capacity});
        for (const OwnedTensor* t : {&rows, &sources, &counts, &dropped}) EXPECT_EQ(t->data<int32_t>()[t->numel() - 1], 12345);
        const std::vector<int32_t> c = ints_of(counts);
        if (capacity == 0) EXPECT_EQ(c, (std::vector<int32_t>{5, 0, 5, 0, 12345}));
        else {
            EXPECT_EQ(c, (std::vector<int32_t>{3, 0, 3, 0, 12345}));
            EXPECT_EQ(ints_of(dropped), (std::vector<int32_t>{2, 0, 2, 0, 12345}));
        }
        OwnedTensor x_perm(f64, {R + 1, C}), out(f64, {N + 1, C});
        x_perm.data<double>()[R * C] = 777;
        out.data<double>()[N * C] = 777;
        const Tensor x_perm_v(x_perm.data<double>(), f64, {R, C}), out_v(out.data<double>(), f64, {N, C});
        be->moe_permute_fwd({.x_perm = x_perm_v, .x = x, .sources = sources_v, .top_k = k});
        be->moe_combine_fwd({.out = out_v, .y_perm = x_perm_v, .gates = r.gates, .rows = rows_v});
        EXPECT_EQ(x_perm.data<double>()[R * C], 777);
        EXPECT_EQ(out.data<double>()[N * C], 777);
        // Every token kept in full gets x back (gates sum to 1); a token with no kept slot gets 0.
        for (int64_t t = 0; t < N; ++t)
            for (int64_t ch = 0; ch < C; ++ch) {
                const bool kept = capacity == 0 || t < 3;
                EXPECT_NEAR(out.data<double>()[t * C + ch], kept ? get(x, t * C + ch) : 0.0, 1e-12) << "token " << t;
            }
        const OwnedTensor dx = filled(f64, {N, C}, 99);
        be->moe_permute_bwd({.dx = dx, .d_x_perm = x_perm_v, .rows = rows_v});
        for (int64_t ch = 0; ch < C; ++ch) EXPECT_EQ(get(dx, 4 * C + ch), capacity == 0 ? 2 * get(x, 4 * C + ch) : 0.0);
    }
}

// Bad arguments are refused before anything is written, naming the op and the value.
TEST(CpuMoe, BadArguments_AreRefusedNamingTheOpAndTheValue) {
    auto be = make_cpu_backend(1);
    const OwnedTensor logits = random_tensor(f32, {6, 4}, 1), scores(f32, {6, 4}), gates5(f32, {6, 5}), gates2(f32, {6, 2});
    const OwnedTensor experts5(i32, {6, 5}), experts0(i32, {6, 0}), experts2(i32, {6, 2}), experts_short(i32, {5, 2});
    expect_error(ErrorKind::shape, {"moe_route_fwd", "top_k 5", "[1, 4]"}, [&] {
        be->moe_route_fwd({.experts = experts5, .gates = gates5, .scores = scores, .logits = logits, .expert_bias = Tensor()});
    });
    expect_error(ErrorKind::shape, {"moe_route_fwd", "top_k 0"}, [&] {
        be->moe_route_fwd({.experts = experts0, .gates = OwnedTensor(f32, {6, 0}), .scores = scores, .logits = logits, .expert_bias = Tensor()});
    });
    expect_error(ErrorKind::shape, {"moe_route_fwd", "experts", "[5, 2]"}, [&] {
        be->moe_route_fwd({.experts = experts_short, .gates = gates2, .scores = scores, .logits = logits, .expert_bias = Tensor()});
    });
    expect_error(ErrorKind::shape, {"moe_route_fwd", "expert_bias"}, [&] {
        be->moe_route_fwd({.experts = experts2, .gates = gates2, .scores = scores, .logits = logits, .expert_bias = OwnedTensor(f32, {3})});
    });
    expect_error(ErrorKind::shape, {"moe_route_bwd", "d_gates"}, [&] {
        be->moe_route_bwd({.d_logits = scores, .d_gates = gates5, .gates = gates2, .scores = scores, .experts = experts2});
    });
    const OwnedTensor bad_experts = ints({6, 2}, {0, 1, 2, 3, 7, 0, 0, 1, 0, 1, 0, 1});
    expect_error(ErrorKind::data, {"moe_permute_plan", "expert 7 of token 2 slot 0", "[0, 4)"}, [&] {
        be->moe_permute_plan({.rows = OwnedTensor(i32, {6, 2}), .sources = OwnedTensor(i32, {12}), .counts = OwnedTensor(i32, {4}), .dropped = Tensor(), .experts = bad_experts});
    });
    expect_error(ErrorKind::shape, {"moe_permute_plan", "capacity -1"}, [&] {
        be->moe_permute_plan({.rows = OwnedTensor(i32, {6, 2}), .sources = OwnedTensor(i32, {12}), .counts = OwnedTensor(i32, {4}), .dropped = Tensor(), .experts = experts2, .capacity = -1});
    });
    expect_error(ErrorKind::shape, {"moe_permute_plan", "sources", "[8]"}, [&] {
        be->moe_permute_plan({.rows = OwnedTensor(i32, {6, 2}), .sources = OwnedTensor(i32, {12}), .counts = OwnedTensor(i32, {4}), .dropped = Tensor(), .experts = experts2, .capacity = 2});
    });
    expect_error(ErrorKind::shape, {"moe_load_stats", "seq_len 4", "6 tokens"}, [&] {
        be->moe_load_stats({.counts = OwnedTensor(i32, {1, 4}), .score_sums = OwnedTensor(f32, {1, 4}), .experts = experts2, .scores = scores, .seq_len = 4});
    });
    expect_error(ErrorKind::shape, {"moe_aux_loss_fwd", "top_k 5"}, [&] {
        be->moe_aux_loss_fwd({.loss = OwnedTensor(f32, {1}), .counts = OwnedTensor(i32, {1, 4}), .score_sums = OwnedTensor(f32, {1, 4}), .tokens_per_group = 6, .top_k = 5});
    });
    expect_error(ErrorKind::shape, {"moe_aux_loss_bwd", "tokens_per_group 0"}, [&] {
        be->moe_aux_loss_bwd({.d_logits = scores, .scores = scores, .counts = OwnedTensor(i32, {1, 4}), .tokens_per_group = 0, .top_k = 2});
    });
    expect_error(ErrorKind::data, {"moe_combine_fwd", "rows[1] = 12", "[-1, 12)"}, [&] {
        be->moe_combine_fwd({.out = OwnedTensor(f32, {6, 3}), .y_perm = OwnedTensor(f32, {12, 3}), .gates = gates2, .rows = ints({6, 2}, {0, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})});
    });
    expect_error(ErrorKind::shape, {"moe_permute_bwd", "dx"}, [&] {
        be->moe_permute_bwd({.dx = OwnedTensor(f32, {5, 3}), .d_x_perm = OwnedTensor(f32, {12, 3}), .rows = experts2});
    });
}

// Core: shapes and views, the arena's planning, Philox reproducibility and statistics,
// 16-bit float conversions, the checksum policy of the product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/arena.h"
#include "core/checksum_policy.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "core/tensor.h"

using namespace llmtrain;

TEST(Tensor, SliceRows_PointsIntoTheSameMemory) {
    OwnedTensor t(DType::f32, {4, 3});
    for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
    const Tensor rows = t.view().slice_rows(1, 2);
    EXPECT_EQ(rows.shape(), (Shape{2, 3}));
    EXPECT_EQ(rows.data<float>()[0], 3.0f);
    EXPECT_THROW(t.view().slice_rows(3, 2), Error);
}

TEST(Tensor, WrongElementTypeAccess_Throws) {
    OwnedTensor t(DType::f32, {2});
    EXPECT_THROW(t.view().data<double>(), Error);
}

TEST(Tensor, ReshapeToOtherElementCount_Throws) {
    OwnedTensor t(DType::f32, {2, 3});
    EXPECT_NO_THROW(t.view().reshape({3, 2}));
    EXPECT_THROW(t.view().reshape({4, 2}), Error);
}

TEST(Arena, SlotsAreAlignedAndDisjoint) {
    Arena arena;
    const auto a = arena.reserve("a", DType::f32, {3});
    const auto b = arena.reserve("b", DType::f64, {5, 2});
    arena.allocate();
    const auto pa = reinterpret_cast<uintptr_t>(arena.tensor(a).raw());
    const auto pb = reinterpret_cast<uintptr_t>(arena.tensor(b).raw());
    EXPECT_EQ(pa % Arena::alignment_bytes, 0u);
    EXPECT_EQ(pb % Arena::alignment_bytes, 0u);
    EXPECT_GE(pb, pa + 3 * sizeof(float));
    EXPECT_EQ(arena.total_bytes(), 2 * Arena::alignment_bytes);  // each slot rounded up to the alignment
    EXPECT_THROW(arena.reserve("late", DType::f32, {1}), Error);
}

TEST(Philox, MatchesPublishedKnownAnswer) {
    // Random123's known-answer test for philox4x32-10 with counter and key all 0xffffffff.
    const PhiloxBlock out = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
    EXPECT_EQ(out[0], 0x408f276du);
    EXPECT_EQ(out[1], 0x41c83b0eu);
    EXPECT_EQ(out[2], 0xa20bc7c6u);
    EXPECT_EQ(out[3], 0x6d5451fdu);
    const PhiloxBlock zero = philox4x32({0, 0, 0, 0}, {0, 0});
    EXPECT_EQ(zero[0], 0x6627e8d5u);
    EXPECT_EQ(zero[1], 0xe169c58du);
    EXPECT_EQ(zero[2], 0xbc57ac4cu);
    EXPECT_EQ(zero[3], 0x9b00dbd8u);
}

TEST(Philox, StreamIsAPureFunctionOfSeedStreamAndIndex) {
    const PhiloxStream a(42, 7), b(42, 7), other_seed(43, 7), other_stream(42, 8);
    for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(a.bits(i), b.bits(i));
    EXPECT_NE(a.bits(0), other_seed.bits(0));
    EXPECT_NE(a.bits(0), other_stream.bits(0));
    EXPECT_EQ(a.normal(12345), b.normal(12345));
}

TEST(Philox, NormalsHaveZeroMeanAndUnitVariance) {
    const PhiloxStream s(1, 2);
    double sum = 0, sum_sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = s.normal(static_cast<uint64_t>(i));
        sum += x;
        sum_sq += x * x;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.01);
    EXPECT_NEAR(sum_sq / n, 1.0, 0.01);
}

TEST(Philox, BelowStaysInRangeAndCoversIt) {
    const PhiloxStream s(3, 4);
    std::vector<int> hits(10);
    for (uint64_t i = 0; i < 10000; ++i) {
        const uint64_t v = s.below(i, 10);
        ASSERT_LT(v, 10u);
        ++hits[v];
    }
    for (int h : hits) EXPECT_GT(h, 800);
}

TEST(DType, Bf16RoundsToNearestEven) {
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
    // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
    EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsRepresentableValues) {
    for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
        EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
    EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(1e6f))));
    EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 4096)), 1.0f);  // tie to even
}

// Only the fuzzing build reads on past a checksum that disagrees (core/checksum_policy.h);
// this test binary is built like llmtrain.
TEST(ChecksumPolicy, TheProductEnforcesEveryChecksum) {
    static_assert(kChecksumsEnforced, "the tests and llmtrain are built without LLMTRAIN_FUZZ_SKIP_CHECKSUMS");
    EXPECT_TRUE(checksum_mismatch(uint64_t{0x1234}, uint64_t{0x1235}));
    EXPECT_TRUE(checksum_mismatch(std::string("00ff"), std::string("00fe")));
    EXPECT_FALSE(checksum_mismatch(uint64_t{7}, uint64_t{7}));
}

#include "core/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"

namespace llmtrain {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

struct Representable {
    float value;
    uint8_t bits;
};

// Every finite non-negative value of the format, ascending, with its pattern.
std::vector<Representable> finite_non_negative(Fp8Format format) {
    std::vector<Representable> out;
    for (int bits = 0; bits < 0x80; ++bits) {
        const float v = fp8_to_float(static_cast<uint8_t>(bits), format);
        if (std::isfinite(v)) out.push_back({v, static_cast<uint8_t>(bits)});
    }
    std::sort(out.begin(), out.end(), [](const Representable& a, const Representable& b) { return a.value < b.value; });
    return out;
}

// The reference: the nearest representable value by search, ties to the even pattern (its
// last mantissa bit clear), beyond the largest one the largest one.
uint8_t nearest_by_search(float value, Fp8Format format) {
    const std::vector<Representable> grid = finite_non_negative(format);
    const uint8_t sign = std::signbit(value) ? 0x80 : 0;
    const double a = std::fabs(static_cast<double>(value));
    if (a >= grid.back().value) return sign | grid.back().bits;
    for (size_t i = 0; i + 1 < grid.size(); ++i) {
        const double lo = grid[i].value, hi = grid[i + 1].value;
        if (a < lo || a > hi) continue;
        if (a - lo < hi - a) return sign | grid[i].bits;
        if (hi - a < a - lo) return sign | grid[i + 1].bits;
        return sign | ((grid[i].bits & 1) == 0 ? grid[i].bits : grid[i + 1].bits);
    }
    ADD_FAILURE() << "no interval holds " << value;
    return 0;
}

TEST(Fp8, EveryFinitePattern_DecodesAndEncodesBackToItself) {
    for (const Fp8Format format : kFormats) {
        int finite = 0;
        for (int bits = 0; bits < 256; ++bits) {
            const float v = fp8_to_float(static_cast<uint8_t>(bits), format);
            if (!std::isfinite(v)) continue;
            ++finite;
            EXPECT_EQ(float_to_fp8(v, format), bits) << fp8_format_name(format) << " pattern " << bits << " value " << v;
        }
        // e4m3: 256 minus the two NaNs; e5m2: minus 2 infinities and 6 NaNs.
        EXPECT_EQ(finite, format == Fp8Format::e4m3 ? 254 : 248) << fp8_format_name(format);
    }
}

TEST(Fp8, LimitsAreTheOcpFormats) {
    EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.0f);
    EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);
    EXPECT_EQ(fp8_to_float(0x01, Fp8Format::e4m3), std::ldexp(1.0f, -9));   // smallest subnormal
    EXPECT_EQ(fp8_to_float(0x08, Fp8Format::e4m3), std::ldexp(1.0f, -6));   // smallest normal
    EXPECT_EQ(fp8_to_float(0x01, Fp8Format::e5m2), std::ldexp(1.0f, -16));
    EXPECT_EQ(fp8_to_float(0x04, Fp8Format::e5m2), std::ldexp(1.0f, -14));
    EXPECT_EQ(fp8_to_float(0x38, Fp8Format::e4m3), 1.0f);
    EXPECT_EQ(fp8_to_float(0x3c, Fp8Format::e5m2), 1.0f);
    EXPECT_TRUE(std::isinf(fp8_to_float(0x7c, Fp8Format::e5m2)));
    EXPECT_TRUE(std::isnan(fp8_to_float(0x7f, Fp8Format::e4m3)));
    EXPECT_TRUE(std::isnan(fp8_to_float(0xff, Fp8Format::e4m3)));
    EXPECT_EQ(fp8_to_float(0x7e, Fp8Format::e4m3), 448.0f);  // 1.110 x 2^8: finite in E4M3FN
}

TEST(Fp8, RoundingIsToTheNearestValueWithTiesToEven_MidpointsAndRandomValues) {
    for (const Fp8Format format : kFormats) {
        const std::vector<Representable> grid = finite_non_negative(format);
        std::vector<float> probes;
        for (size_t i = 0; i + 1 < grid.size(); ++i) {
            const float mid = static_cast<float>((static_cast<double>(grid[i].value) + grid[i + 1].value) / 2);
            probes.insert(probes.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), grid[i].value});
        }
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> log2_magnitude(-20.0f, 18.0f);
        for (int i = 0; i < 20000; ++i) probes.push_back(std::exp2(log2_magnitude(rng)));
        for (const float p : probes) {
            for (const float v : {p, -p}) {
                ASSERT_EQ(float_to_fp8(v, format), nearest_by_search(v, format)) << fp8_format_name(format) << " value " << v;
            }
        }
    }
}

TEST(Fp8, HalfwayCases_GoToTheEvenNeighbour) {
    // e4m3 around 1: the spacing is 1/8. 1 + 1/16 lies between 1.000 (even) and 1.001.
    EXPECT_EQ(round_to_fp8(1.0625f, Fp8Format::e4m3), 1.0f);
    // 1.125 + 1/16 lies between 1.001 and 1.010 (even).
    EXPECT_EQ(round_to_fp8(1.1875f, Fp8Format::e4m3), 1.25f);
    // Half the smallest subnormal goes to zero (even); three halves go to two subnormals.
    EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -10), Fp8Format::e4m3), 0x00);
    EXPECT_EQ(float_to_fp8(3 * std::ldexp(1.0f, -10), Fp8Format::e4m3), 0x02);
    EXPECT_EQ(float_to_fp8(-std::ldexp(1.0f, -11), Fp8Format::e4m3), 0x80);  // a zero of its sign
}

TEST(Fp8, OverflowAndInfinitySaturate_NanStaysNan) {
    for (const Fp8Format format : kFormats) {
        const float max = fp8_max(format);
        EXPECT_EQ(round_to_fp8(max * 1.01f, format), max);
        EXPECT_EQ(round_to_fp8(1e30f, format), max);
        EXPECT_EQ(round_to_fp8(INFINITY, format), max);
        EXPECT_EQ(round_to_fp8(-INFINITY, format), -max);
        EXPECT_TRUE(std::isnan(round_to_fp8(NAN, format)));
        EXPECT_EQ(float_to_fp8(-0.0f, format), 0x80);
    }
}

TEST(Fp8, ScaleMapsTheAmaxOntoTheFormatsMaxWithTheMargin) {
    EXPECT_EQ(fp8_scale_for_amax(448.0f, Fp8Format::e4m3, 0), 1.0f);
    EXPECT_EQ(fp8_scale_for_amax(2.0f, Fp8Format::e4m3, 0), 224.0f);
    EXPECT_EQ(fp8_scale_for_amax(2.0f, Fp8Format::e4m3, 2), 56.0f);
    EXPECT_EQ(fp8_scale_for_amax(57344.0f, Fp8Format::e5m2, 0), 1.0f);
    // No information: the previous scale stays.
    EXPECT_EQ(fp8_scale_for_amax(0.0f, Fp8Format::e4m3, 0, 3.0f), 3.0f);
    EXPECT_EQ(fp8_scale_for_amax(INFINITY, Fp8Format::e4m3, 0, 3.0f), 3.0f);
    EXPECT_EQ(fp8_scale_for_amax(NAN, Fp8Format::e4m3, 0, 3.0f), 3.0f);
    // A subnormal amax gives the largest finite scale, not infinity.
    EXPECT_TRUE(std::isfinite(fp8_scale_for_amax(1e-45f, Fp8Format::e5m2, 0)));
}

TEST(AmaxHistory, MaxTakesTheLargestOfTheWindow_MostRecentTheNewest) {
    AmaxHistory largest(3, AmaxCompute::max), newest(3, AmaxCompute::most_recent);
    for (const float amax : {8.0f, 2.0f, 4.0f}) {
        largest.record(amax, Fp8Format::e4m3, 0);
        newest.record(amax, Fp8Format::e4m3, 0);
    }
    EXPECT_EQ(largest.reduced_amax(), 8.0f);
    EXPECT_EQ(largest.scale(), 56.0f);
    EXPECT_EQ(newest.reduced_amax(), 4.0f);
    EXPECT_EQ(newest.scale(), 112.0f);
    largest.record(1.0f, Fp8Format::e4m3, 0);  // 8 leaves the window of 3
    EXPECT_EQ(largest.reduced_amax(), 4.0f);
    EXPECT_EQ(largest.entries(), (std::vector<float>{2.0f, 4.0f, 1.0f}));
}

TEST(AmaxHistory, ANonFiniteAmax_IsNotRecordedAndKeepsTheScale) {
    AmaxHistory history(2, AmaxCompute::max);
    history.record(4.0f, Fp8Format::e4m3, 0);
    history.record(INFINITY, Fp8Format::e4m3, 0);
    history.record(NAN, Fp8Format::e4m3, 0);
    EXPECT_EQ(history.scale(), 112.0f);
    EXPECT_EQ(history.entries(), (std::vector<float>{0.0f, 4.0f}));
}

TEST(AmaxHistory, RestoredHistory_ContinuesBitwiseAsTheOriginal) {
    AmaxHistory original(4, AmaxCompute::max);
    for (const float amax : {3.5f, 0.25f, 7.0f, 1.5f, 0.75f}) original.record(amax, Fp8Format::e5m2, 1);
    AmaxHistory restored(4, AmaxCompute::max);
    restored.restore(original.entries(), original.scale());
    for (const float amax : {0.5f, 0.125f, 9.0f}) {
        original.record(amax, Fp8Format::e5m2, 1);
        restored.record(amax, Fp8Format::e5m2, 1);
        EXPECT_EQ(restored.scale(), original.scale());
        EXPECT_EQ(restored.entries(), original.entries());
    }
}

TEST(AmaxHistory, BadLengthsAndNames_AreRefusedNamingTheKey) {
    EXPECT_THROW(AmaxHistory(0, AmaxCompute::max), Error);
    AmaxHistory history(2, AmaxCompute::max);
    EXPECT_THROW(history.restore({1.0f}, 1.0f), Error);
    try {
        parse_amax_compute("mean", "fp8.amax_compute");
        FAIL() << "\"mean\" was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fp8.amax_compute"), std::string::npos) << e.what();
    }
    EXPECT_EQ(parse_amax_compute("most_recent", "fp8.amax_compute"), AmaxCompute::most_recent);
}

}  // namespace
}  // namespace llmtrain

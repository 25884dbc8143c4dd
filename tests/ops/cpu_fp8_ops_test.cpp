// The CPU reference's FP8 ops: casts that round as core/fp8.h, scales from amaxes, and GEMMs
// of FP8 operands that equal the decoded values' product times both inverse scales.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "ops/op_test_util.h"

namespace llmtrain {
namespace {

OwnedTensor scalar(float value) {
    OwnedTensor t(DType::f32, {1});
    *t.view().data<float>() = value;
    return t;
}

float value_of(const OwnedTensor& t) { return *t.view().data<float>(); }

const uint8_t* bytes(const OwnedTensor& t) { return static_cast<const uint8_t*>(t.view().raw()); }

class CpuFp8 : public ::testing::Test {
protected:
    std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

TEST_F(CpuFp8, Cast_RoundsEveryScaledValueAsTheConverter_WritesTheTransposeAndTheAmax) {
    const int64_t rows = 5, cols = 7;
    const OwnedTensor x = test::random_tensor(DType::f32, {rows, cols}, 11, -3, 3);
    OwnedTensor out(DType::e4m3, {rows, cols}), out_t(DType::e4m3, {cols, rows});
    const OwnedTensor scale = scalar(40.0f), amax = scalar(-1.0f);
    cpu_->fp8_cast({.out = out, .out_t = out_t, .x = x, .scale = scale, .amax = amax});
    float largest = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const float v = x.view().data<float>()[r * cols + c];
            largest = std::max(largest, std::fabs(v));
            const uint8_t expected = float_to_fp8(v * 40.0f, Fp8Format::e4m3);
            EXPECT_EQ(bytes(out)[r * cols + c], expected) << r << ", " << c;
            EXPECT_EQ(bytes(out_t)[c * rows + r], expected) << r << ", " << c;
        }
    EXPECT_EQ(value_of(amax), largest);
}

TEST_F(CpuFp8, Cast_SaturatesBeyondTheFormat_AndANanInputMakesTheAmaxNan) {
    OwnedTensor x(DType::f32, {1, 3});
    float* v = x.view().data<float>();
    v[0] = 1e6f, v[1] = -1e6f, v[2] = NAN;
    OwnedTensor out(DType::e5m2, {1, 3});
    const OwnedTensor scale = scalar(1.0f), amax = scalar(0.0f);
    cpu_->fp8_cast({.out = out, .x = x, .scale = scale, .amax = amax});
    EXPECT_EQ(fp8_to_float(bytes(out)[0], Fp8Format::e5m2), 57344.0f);
    EXPECT_EQ(fp8_to_float(bytes(out)[1], Fp8Format::e5m2), -57344.0f);
    EXPECT_TRUE(std::isnan(fp8_to_float(bytes(out)[2], Fp8Format::e5m2)));
    EXPECT_TRUE(std::isnan(value_of(amax)));
}

// Saturated: where rounding leaves e4m3's range, above 464 (the tie between 448 and 480 rounds
// to 448; 449 rounds to 448: no overflow); an infinity is, NaN is not. Flushed: below half the
// smallest subnormal 2^-9 (x = 0 is not). The counts add up over casts.
TEST_F(CpuFp8, Cast_CountsTheValuesItSaturatesAndFlushesToZero_AndAddsToTheCounts) {
    const std::vector<float> values = {465.0f, -1e9f, INFINITY, 464.0f, 449.0f, NAN, std::ldexp(1.0f, -11), -std::ldexp(1.0f, -11), std::ldexp(1.0f, -9), 0.0f, 1.0f};
    OwnedTensor x(DType::f32, {1, static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), x.view().data<float>());
    OwnedTensor out(DType::e4m3, {1, static_cast<int64_t>(values.size())}), counts(DType::f64, {2});
    counts.view().data<double>()[0] = 10, counts.view().data<double>()[1] = 20;
    const OwnedTensor scale = scalar(1.0f);
    cpu_->fp8_cast({.out = out, .x = x, .scale = scale, .counts = counts});
    EXPECT_EQ(counts.view().data<double>()[0], 10 + 3);  // 465, -1e9, inf
    EXPECT_EQ(counts.view().data<double>()[1], 20 + 2);  // +-2^-11 (2^-10, the halfway point, would round to even: zero too)
    // The same values at half the scale: 465 no longer saturates; 2^-9 becomes 2^-10, halfway
    // to the smallest subnormal, and rounds to even: zero.
    const OwnedTensor half = scalar(0.5f);
    cpu_->fp8_cast({.out = out, .x = x, .scale = half, .counts = counts});
    EXPECT_EQ(counts.view().data<double>()[0], 13 + 2);
    EXPECT_EQ(counts.view().data<double>()[1], 22 + 3);
}

TEST_F(CpuFp8, UpdateScale_FollowsTheAmaxAndKeepsTheScaleWithoutOne) {
    const OwnedTensor scale = scalar(1.0f), scale_inv = scalar(0.0f), amax = scalar(2.0f);
    cpu_->fp8_update_scale({.scale = scale, .scale_inv = scale_inv, .amax = amax, .format = DType::e4m3, .margin = 1});
    EXPECT_EQ(value_of(scale), 112.0f);  // 448 / 2 / 2^1
    EXPECT_EQ(value_of(scale_inv), 1.0f / 112.0f);
    *amax.view().data<float>() = 0.0f;
    cpu_->fp8_update_scale({.scale = scale, .scale_inv = scale_inv, .amax = amax, .format = DType::e5m2, .margin = 0});
    EXPECT_EQ(value_of(scale), 112.0f);
    *amax.view().data<float>() = INFINITY;
    cpu_->fp8_update_scale({.scale = scale, .scale_inv = scale_inv, .amax = amax, .format = DType::e5m2, .margin = 0});
    EXPECT_EQ(value_of(scale), 112.0f);
}

// Casts x with the scale its amax gives, as a training step would: amax, scale, cast.
struct Cast {
    OwnedTensor bytes, scale, scale_inv;
};
Cast cast(Backend& be, const Tensor& x, DType format) {
    Cast c{OwnedTensor(format, x.shape()), scalar(1.0f), scalar(1.0f)};
    const OwnedTensor amax = scalar(0.0f);
    be.fp8_amax({.amax = amax, .x = x});
    be.fp8_update_scale({.scale = c.scale, .scale_inv = c.scale_inv, .amax = amax, .format = format});
    be.fp8_cast({.out = c.bytes, .x = x, .scale = c.scale});
    return c;
}

TEST_F(CpuFp8, Matmul_IsTheDecodedProductTimesBothInverseScales_AndAccumulates) {
    const int64_t M = 6, N = 5, K = 32;
    const OwnedTensor a_values = test::random_tensor(DType::f32, {M, K}, 3, -2, 2), b_values = test::random_tensor(DType::f32, {N, K}, 4, -0.01, 0.01);
    const Cast a = cast(*cpu_, a_values, DType::e4m3), b = cast(*cpu_, b_values, DType::e5m2);
    OwnedTensor out = test::filled(DType::f64, {M, N}, 0.5);
    cpu_->matmul_fp8({.out = out, .a = a.bytes, .a_scale_inv = a.scale_inv, .b = b.bytes, .b_scale_inv = b.scale_inv, .accumulate = true});
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double sum = 0;
            for (int64_t l = 0; l < K; ++l)
                sum += static_cast<double>(fp8_to_float(bytes(a.bytes)[i * K + l], Fp8Format::e4m3)) * fp8_to_float(bytes(b.bytes)[j * K + l], Fp8Format::e5m2);
            const double expected = 0.5 + sum * static_cast<double>(value_of(a.scale_inv)) * value_of(b.scale_inv);
            EXPECT_NEAR(out.view().data<double>()[i * N + j], expected, 1e-12) << i << ", " << j;
        }
}

TEST_F(CpuFp8, MatmulOfCastOperands_ApproximatesTheF32ProductWithinE4m3Precision) {
    // e4m3 keeps 3 mantissa bits: each operand is off by at most 2^-4 relative, so a product
    // of K terms of random sign stays within a few percent of the exact one.
    const int64_t M = 16, N = 24, K = 64;
    const OwnedTensor x = test::random_tensor(DType::f32, {M, K}, 5), w = test::random_tensor(DType::f32, {N, K}, 6, -0.05, 0.05);
    const Cast xq = cast(*cpu_, x, DType::e4m3), wq = cast(*cpu_, w, DType::e4m3);
    OwnedTensor out(DType::f32, {M, N});
    cpu_->matmul_fp8({.out = out, .a = xq.bytes, .a_scale_inv = xq.scale_inv, .b = wq.bytes, .b_scale_inv = wq.scale_inv});
    double error = 0, norm = 0;
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double exact = 0;
            for (int64_t l = 0; l < K; ++l) exact += static_cast<double>(x.view().data<float>()[i * K + l]) * w.view().data<float>()[j * K + l];
            const double d = out.view().data<float>()[i * N + j] - exact;
            error += d * d, norm += exact * exact;
        }
    EXPECT_GT(norm, 0.0);
    EXPECT_LT(std::sqrt(error / norm), 0.05);
    EXPECT_GT(std::sqrt(error / norm), 0.0);  // it did round
}

std::string refusal(Backend& be, const MatmulFp8& args) {
    try {
        be.matmul_fp8(args);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST_F(CpuFp8, MatmulArgumentsThatDoNotFit_AreRefusedNamingTheTensor) {
    const OwnedTensor e5(DType::e5m2, {4, 16}), e4(DType::e4m3, {4, 16}), bf(DType::bf16, {4, 16}), wrong_k(DType::e4m3, {4, 8});
    const OwnedTensor one = scalar(1.0f);
    OwnedTensor out(DType::f32, {4, 4});
    EXPECT_NE(refusal(*cpu_, {.out = out, .a = e5, .a_scale_inv = one, .b = e5, .b_scale_inv = one}).find("both e5m2"), std::string::npos);
    EXPECT_NE(refusal(*cpu_, {.out = out, .a = e4, .a_scale_inv = one, .b = bf, .b_scale_inv = one}).find("b has dtype bf16"), std::string::npos);
    EXPECT_NE(refusal(*cpu_, {.out = out, .a = e4, .a_scale_inv = one, .b = wrong_k, .b_scale_inv = one}).find("matmul_fp8: b"), std::string::npos);
    EXPECT_NE(refusal(*cpu_, {.out = out, .a = e4, .a_scale_inv = OwnedTensor(DType::f32, {2}), .b = e4, .b_scale_inv = one}).find("a_scale_inv"),
              std::string::npos);
    EXPECT_EQ(refusal(*cpu_, {.out = out, .a = e4, .a_scale_inv = one, .b = e5, .b_scale_inv = one}), "");
}

}  // namespace
}  // namespace llmtrain

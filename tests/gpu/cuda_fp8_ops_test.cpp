// The CUDA backend's FP8 ops against the CPU reference: casts bitwise equal (the same
// rounding, the same bytes, in both layouts), amaxes and scales equal, GEMMs within their
// output type's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "gpu/gpu_test_util.h"

namespace llmtrain::gpu_test {
namespace {

class CudaFp8 : public CudaVsCpuTest {
protected:
    OwnedTensor host_scalar(float v) {
        OwnedTensor t(DType::f32, {1});
        *t.data<float>() = v;
        return t;
    }
    OwnedTensor device_scalar(float v) { return to_device(gpu(), host_scalar(v), DType::f32); }
    float read_scalar(const Tensor& dev) { return static_cast<float>(download(gpu(), dev)[0]); }
};

// The bytes of a host tensor.
std::vector<uint8_t> host_bytes(const Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    return std::vector<uint8_t>(p, p + t.bytes());
}

// Shapes that are not multiples of the cast's 32 x 32 tiles, and one that is.
TEST_F(CudaFp8, CastOfBf16_GivesTheCpusBytesInBothLayoutsAndItsAmax) {
    for (const auto& [rows, cols, format] : {std::tuple{45, 70, DType::e4m3}, {64, 32, DType::e5m2}, {1, 5, DType::e4m3}}) {
        SCOPED_TRACE(::testing::Message() << rows << " x " << cols << " " << dtype_name(format));
        const OwnedTensor x = random_input(DType::bf16, {rows, cols}, 7 + rows, -6, 6);
        const OwnedTensor out(format, {rows, cols}), out_t(format, {cols, rows}), scale = host_scalar(29.5f), amax = host_scalar(0);
        cpu().fp8_cast({.out = out, .out_t = out_t, .x = x, .scale = scale, .amax = amax});

        const OwnedTensor gx = to_device(gpu(), x, DType::bf16), g_out = device_tensor(gpu(), format, {rows, cols});
        const OwnedTensor g_out_t = device_tensor(gpu(), format, {cols, rows}), g_scale = device_scalar(29.5f), g_amax = device_scalar(-1);
        gpu().fp8_cast({.out = g_out, .out_t = g_out_t, .x = gx, .scale = g_scale, .amax = g_amax});
        const std::vector<uint8_t> got = download_bytes(gpu(), g_out), got_t = download_bytes(gpu(), g_out_t);
        EXPECT_EQ(got, host_bytes(out.view()));
        EXPECT_EQ(got_t, host_bytes(out_t.view()));
        EXPECT_EQ(read_scalar(g_amax), *amax.data<float>());
        EXPECT_GT(*amax.data<float>(), 0.0f);
    }
}

// FP8 bytes as x (fp8.param_gather's gathered weights): copied as they are and transposed as
// the CPU transposes them, into another tensor and in place (out = x, only out_t written).
TEST_F(CudaFp8, RelayoutOfFp8Bytes_CopiesThemAndGivesTheCpusTransposeAlsoInPlace) {
    for (const auto& [rows, cols, format] : {std::tuple{45, 70, DType::e4m3}, {64, 32, DType::e5m2}, {1, 5, DType::e4m3}}) {
        SCOPED_TRACE(::testing::Message() << rows << " x " << cols << " " << dtype_name(format));
        const OwnedTensor x = random_input(DType::f32, {rows, cols}, 3 + rows, -6, 6);
        const OwnedTensor bytes(format, {rows, cols}), out(format, {rows, cols}), out_t(format, {cols, rows}), scale = host_scalar(17.0f);
        cpu().fp8_cast({.out = bytes, .x = x, .scale = scale});
        cpu().fp8_cast({.out = out, .out_t = out_t, .x = bytes});
        EXPECT_EQ(host_bytes(out.view()), host_bytes(bytes.view()));

        const OwnedTensor g_bytes = device_tensor(gpu(), format, {rows, cols}), g_out = device_tensor(gpu(), format, {rows, cols});
        const OwnedTensor g_out_t = device_tensor(gpu(), format, {cols, rows});
        gpu().copy_from_host(g_bytes, bytes.view().raw());
        gpu().fp8_cast({.out = g_out, .out_t = g_out_t, .x = g_bytes});
        EXPECT_EQ(download_bytes(gpu(), g_out), host_bytes(bytes.view()));
        EXPECT_EQ(download_bytes(gpu(), g_out_t), host_bytes(out_t.view()));
        gpu().fill_zero(g_out_t);
        gpu().fp8_cast({.out = g_bytes, .out_t = g_out_t, .x = g_bytes});
        EXPECT_EQ(download_bytes(gpu(), g_bytes), host_bytes(bytes.view()));
        EXPECT_EQ(download_bytes(gpu(), g_out_t), host_bytes(out_t.view()));
    }
}

// The saturated and flushed counts: added to what the counts held, equal to the CPU's, over
// many tiles (each block adds its sums once) and twice over (the sums are integers: exact in
// any order of the blocks' atomic adds).
TEST_F(CudaFp8, CastCounts_EqualTheCpusOverManyTilesAndAddUp) {
    for (const auto& [rows, cols, format] : {std::tuple{97, 130, DType::e4m3}, {64, 64, DType::e5m2}}) {
        SCOPED_TRACE(::testing::Message() << rows << " x " << cols << " " << dtype_name(format));
        OwnedTensor x = random_input(DType::f32, {rows, cols}, 5 + rows, -1, 1);
        float* v = x.data<float>();
        for (int64_t i = 0; i < rows * cols; i += 7) v[i] *= 1e-6f;  // flushed at this scale
        for (int64_t i = 3; i < rows * cols; i += 11) v[i] *= 1e5f;  // saturated
        const float s = format == DType::e4m3 ? 16.0f : 1.0f;
        OwnedTensor out(format, {rows, cols}), counts(DType::f64, {2});
        counts.data<double>()[0] = counts.data<double>()[1] = 0;
        const OwnedTensor scale = host_scalar(s);
        cpu().fp8_cast({.out = out, .x = x, .scale = scale, .counts = counts});
        cpu().fp8_cast({.out = out, .x = x, .scale = scale, .counts = counts});
        EXPECT_GT(counts.data<double>()[0], 0);
        EXPECT_GT(counts.data<double>()[1], 0);

        const OwnedTensor gx = to_device(gpu(), x, DType::f32), g_out = device_tensor(gpu(), format, {rows, cols}), g_scale = device_scalar(s);
        const OwnedTensor g_counts = device_tensor(gpu(), DType::f64, {2});
        gpu().fill_zero(g_counts);
        gpu().fp8_cast({.out = g_out, .x = gx, .scale = g_scale, .counts = g_counts});
        gpu().fp8_cast({.out = g_out, .x = gx, .scale = g_scale, .counts = g_counts});
        const std::vector<double> got = download(gpu(), g_counts);
        EXPECT_EQ(got[0], counts.data<double>()[0]);
        EXPECT_EQ(got[1], counts.data<double>()[1]);
    }
}

TEST_F(CudaFp8, CastRoundsHalfwayValuesToEvenAndSaturatesLikeTheConverter) {
    // Halfway cases, subnormals, values beyond the format: each pattern exactly as core/fp8.h.
    const std::vector<float> values = {1.0625f, 1.1875f, -1.0625f, std::ldexp(1.0f, -10), 3 * std::ldexp(1.0f, -10), 500.0f, -1e9f, 447.0f, 0.0f, -0.0f};
    OwnedTensor x(DType::f32, {1, static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), x.data<float>());
    const OwnedTensor gx = to_device(gpu(), x, DType::f32), g_out = device_tensor(gpu(), DType::e4m3, x.view().shape()), g_scale = device_scalar(1);
    gpu().fp8_cast({.out = g_out, .x = gx, .scale = g_scale});
    const std::vector<uint8_t> got = download_bytes(gpu(), g_out);
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], float_to_fp8(values[i], Fp8Format::e4m3)) << values[i];
}

TEST_F(CudaFp8, AmaxAndScale_EqualTheCpus) {
    const OwnedTensor x = random_input(DType::bf16, {300, 17}, 3, -40, 40);
    const OwnedTensor amax = host_scalar(0), scale = host_scalar(1), scale_inv = host_scalar(0);
    cpu().fp8_amax({.amax = amax, .x = x});
    cpu().fp8_update_scale({.scale = scale, .scale_inv = scale_inv, .amax = amax, .format = DType::e5m2, .margin = 2});
    const OwnedTensor gx = to_device(gpu(), x, DType::bf16), g_amax = device_scalar(-1), g_scale = device_scalar(1), g_inv = device_scalar(0);
    gpu().fp8_amax({.amax = g_amax, .x = gx});
    gpu().fp8_update_scale({.scale = g_scale, .scale_inv = g_inv, .amax = g_amax, .format = DType::e5m2, .margin = 2});
    EXPECT_EQ(read_scalar(g_amax), *amax.data<float>());
    EXPECT_EQ(read_scalar(g_scale), *scale.data<float>());
    EXPECT_EQ(read_scalar(g_inv), *scale_inv.data<float>());
}

// The CPU casts and multiplies; the GPU multiplies the CPU's bytes: the comparison measures
// the GEMM alone.
// bias: a linear layer's forward, its bias added by the GEMM's epilogue.
void matmul_case(Backend& cpu, Backend& gpu, DType a_format, DType b_format, DType out_dtype, bool accumulate, bool bias = false) {
    SCOPED_TRACE(::testing::Message() << dtype_name(a_format) << " x " << dtype_name(b_format) << " -> " << dtype_name(out_dtype)
                                      << (accumulate ? " accumulating" : "") << (bias ? " with bias" : ""));
    const int64_t M = 48, N = 32, K = 64;
    const OwnedTensor a_values = random_input(DType::f32, {M, K}, 21, -3, 3), b_values = random_input(DType::f32, {N, K}, 22, -0.02, 0.02);
    OwnedTensor a(a_format, {M, K}), b(b_format, {N, K});
    OwnedTensor a_scale(DType::f32, {1}), b_scale(DType::f32, {1}), a_inv(DType::f32, {1}), b_inv(DType::f32, {1}), amax(DType::f32, {1});
    for (const auto& [values, bytes, scale, inv, format] : {std::tuple{&a_values, &a, &a_scale, &a_inv, a_format}, {&b_values, &b, &b_scale, &b_inv, b_format}}) {
        *scale->data<float>() = 1;
        cpu.fp8_amax({.amax = amax, .x = *values});
        cpu.fp8_update_scale({.scale = *scale, .scale_inv = *inv, .amax = amax, .format = format});
        cpu.fp8_cast({.out = *bytes, .x = *values, .scale = *scale});
    }
    const OwnedTensor start = random_input(out_dtype, {M, N}, 23);
    const OwnedTensor out = rounded_to(start, DType::f32);
    const OwnedTensor bias_values = random_input(out_dtype, {N}, 24, -1, 1), cpu_bias = rounded_to(bias_values, DType::f32);
    cpu.matmul_fp8({.out = out, .a = a, .a_scale_inv = a_inv, .b = b, .b_scale_inv = b_inv, .bias = bias ? cpu_bias.view() : Tensor(), .accumulate = accumulate});

    const OwnedTensor ga = device_tensor(gpu, a_format, {M, K}), gb = device_tensor(gpu, b_format, {N, K});
    upload_raw(gpu, ga, a.view().raw(), a.view().bytes());
    upload_raw(gpu, gb, b.view().raw(), b.view().bytes());
    const OwnedTensor g_a_inv = to_device(gpu, a_inv, DType::f32), g_b_inv = to_device(gpu, b_inv, DType::f32), g_out = to_device(gpu, start, out_dtype);
    const OwnedTensor g_bias = to_device(gpu, bias_values, out_dtype);
    gpu.matmul_fp8({.out = g_out, .a = ga, .a_scale_inv = g_a_inv, .b = gb, .b_scale_inv = g_b_inv, .bias = bias ? g_bias.view() : Tensor(),
                    .accumulate = accumulate, .fast_accumulate = true});
    const std::vector<double> want = values_of(out), got = download(gpu, g_out);
    const double u = unit_roundoff(out_dtype), scale = max_abs(want);
    ASSERT_GT(scale, 0.0);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], u * std::fabs(want[i]) + 1e-5 * scale) << "element " << i;
}

TEST_F(CudaFp8, Matmul_MatchesTheCpuForTheForwardAndBackwardFormats) {
    matmul_case(cpu(), gpu(), DType::e4m3, DType::e4m3, DType::bf16, false);
    matmul_case(cpu(), gpu(), DType::e4m3, DType::e4m3, DType::f32, false);
    matmul_case(cpu(), gpu(), DType::e5m2, DType::e4m3, DType::f32, true);
    matmul_case(cpu(), gpu(), DType::e4m3, DType::e4m3, DType::bf16, false, true);
}

TEST_F(CudaFp8, CastTwice_IsBitwiseTheSame) {
    const OwnedTensor x = random_input(DType::bf16, {96, 80}, 9, -2, 2);
    const OwnedTensor gx = to_device(gpu(), x, DType::bf16), g_scale = device_scalar(100);
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
        const OwnedTensor g_out_t = device_tensor(gpu(), DType::e4m3, {80, 96}), g_out = device_tensor(gpu(), DType::e4m3, {96, 80}), g_amax = device_scalar(0);
        gpu().fp8_cast({.out = g_out, .out_t = g_out_t, .x = gx, .scale = g_scale, .amax = g_amax});
        std::vector<uint8_t> bytes = download_bytes(gpu(), g_out_t);
        if (run == 0) first = bytes;
        else EXPECT_EQ(bytes, first);
    }
}

}  // namespace
}  // namespace llmtrain::gpu_test

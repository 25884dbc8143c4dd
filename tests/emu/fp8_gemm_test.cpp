// FP8 GEMMs through CublasLtMatmul on the cuBLASLt stand-in: operands cast on the host by the
// project's converter (core/fp8.h), the product checked against the decoded values in double,
// and the calls cuBLASLt cannot serve on Hopper refused with their reason.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_cublaslt.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"

namespace llmtrain {
namespace {

std::shared_ptr<void> device_bytes(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

template <class T>
std::shared_ptr<void> upload(const std::vector<T>& host) {
    std::shared_ptr<void> d = device_bytes(host.size() * sizeof(T));
    cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}

template <class T>
std::vector<T> download(const std::shared_ptr<void>& d, size_t count) {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
}

// A row-major [rows, cols] tensor cast to FP8 with the scale its amax gives: the bytes, the
// decoded values and the inverse scale the GEMM multiplies back.
struct Fp8Matrix {
    std::vector<uint8_t> bytes;
    std::vector<double> decoded;  // already divided by the scale
    float scale_inv = 1;
};

Fp8Matrix random_fp8(int64_t rows, int64_t cols, Fp8Format format, float spread, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> values(static_cast<size_t>(rows * cols));
    float amax = 0;
    for (float& v : values) amax = std::max(amax, std::fabs(v = normal(rng)));
    Fp8Matrix m;
    const float scale = fp8_scale_for_amax(amax, format, 0);
    m.scale_inv = 1.0f / scale;
    for (const float v : values) {
        m.bytes.push_back(float_to_fp8(v * scale, format));
        m.decoded.push_back(static_cast<double>(fp8_to_float(m.bytes.back(), format)) * m.scale_inv);
    }
    return m;
}

class CublasLtFp8 : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
        workspace_ = device_bytes(kWorkspace);
        GemmTuningHooks hooks;
        hooks.allocate = [](size_t bytes) { return device_bytes(bytes); };
        gemm_ = std::make_unique<CublasLtMatmul>(stream_, workspace_.get(), kWorkspace, hooks);
    }
    void TearDown() override {
        gemm_.reset();
        cudaStreamDestroy(stream_);
    }

    // Y[n, m] = X[n, k] W[m, k]^T as row-major tensors: for the column-major GEMM, D = Y^T is
    // m x n, A = W^T transposed ([k, m] stored, lda = k) and B = X^T ([k, n], ldb = k): "TN".
    GemmCall linear(int64_t m, int64_t n, int64_t k, const void* w, DType w_dtype, const void* x, DType x_dtype, void* d, DType d_dtype) const {
        GemmCall c;
        c.m = m, c.n = n, c.k = k;
        c.transpose_a = true, c.transpose_b = false;
        c.a = w, c.b = x, c.d = d;
        c.lda = k, c.ldb = k, c.ldd = m;
        c.a_dtype = w_dtype, c.b_dtype = x_dtype, c.d_dtype = d_dtype;
        return c;
    }

    static constexpr size_t kWorkspace = size_t{1} << 20;
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<void> workspace_;
    std::unique_ptr<CublasLtMatmul> gemm_;
};

// sum_l W[i, l] X[j, l] over the decoded (unscaled) values, in double.
double reference(const Fp8Matrix& w, const Fp8Matrix& x, int64_t i, int64_t j, int64_t k) {
    double sum = 0;
    for (int64_t l = 0; l < k; ++l) sum += w.decoded[static_cast<size_t>(i * k + l)] * x.decoded[static_cast<size_t>(j * k + l)];
    return sum;
}

TEST_F(CublasLtFp8, E4m3Operands_GiveTheDecodedProductTimesBothInverseScales_AndTheAmaxOfD) {
    const int64_t m = 32, n = 48, k = 64;
    const Fp8Matrix w = random_fp8(m, k, Fp8Format::e4m3, 0.02f, 1), x = random_fp8(n, k, Fp8Format::e4m3, 3.0f, 2);
    const auto dw = upload(w.bytes), dx = upload(x.bytes);
    const auto w_inv = upload(std::vector<float>{w.scale_inv}), x_inv = upload(std::vector<float>{x.scale_inv});
    const auto d = device_bytes(static_cast<size_t>(m * n) * sizeof(float)), amax = device_bytes(sizeof(float));
    GemmCall c = linear(m, n, k, dw.get(), DType::e4m3, dx.get(), DType::e4m3, d.get(), DType::f32);
    c.a_scale_inv = static_cast<const float*>(w_inv.get());
    c.b_scale_inv = static_cast<const float*>(x_inv.get());
    c.d_amax = static_cast<float*>(amax.get());
    c.fast_accumulate = true;
    gemm_->run(c, "fp8 test");
    const std::vector<float> out = download<float>(d, static_cast<size_t>(m * n));
    float largest = 0;
    for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
            const double expected = reference(w, x, i, j, k);
            const float got = out[static_cast<size_t>(j * m + i)];
            ASSERT_NEAR(got, expected, 1e-5 * std::fabs(expected) + 1e-6) << "D[" << i << ", " << j << "]";
            largest = std::max(largest, std::fabs(got));
        }
    EXPECT_GT(largest, 0.0f);
    EXPECT_EQ(download<float>(amax, 1)[0], largest);
}

TEST_F(CublasLtFp8, E4m3TimesE5m2IntoBf16_AccumulatesOntoD) {
    // The backward's shape: weights in e4m3, gradients in e5m2, added to a bf16 D.
    const int64_t m = 16, n = 32, k = 48;
    const Fp8Matrix w = random_fp8(m, k, Fp8Format::e4m3, 0.5f, 3), g = random_fp8(n, k, Fp8Format::e5m2, 1e-3f, 4);
    const auto dw = upload(w.bytes), dg = upload(g.bytes);
    const auto w_inv = upload(std::vector<float>{w.scale_inv}), g_inv = upload(std::vector<float>{g.scale_inv});
    std::vector<uint16_t> start(static_cast<size_t>(m * n));
    for (size_t i = 0; i < start.size(); ++i) start[i] = float_to_bf16(1e-3f * static_cast<float>(i % 7));
    const auto d = upload(start);
    GemmCall c = linear(m, n, k, dw.get(), DType::e4m3, dg.get(), DType::e5m2, d.get(), DType::bf16);
    c.a_scale_inv = static_cast<const float*>(w_inv.get());
    c.b_scale_inv = static_cast<const float*>(g_inv.get());
    c.accumulate = true;
    gemm_->run(c, "fp8 test");
    const std::vector<uint16_t> out = download<uint16_t>(d, start.size());
    for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
            const size_t at = static_cast<size_t>(j * m + i);
            const double expected = reference(w, g, i, j, k) + bf16_to_float(start[at]);
            ASSERT_NEAR(bf16_to_float(out[at]), expected, std::fabs(expected) / 128 + 1e-9) << "D[" << i << ", " << j << "]";
        }
}

// The message of the error a call raises, "" when it runs.
std::string refusal(CublasLtMatmul& gemm, const GemmCall& c) {
    try {
        gemm.run(c, "fp8 test");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST_F(CublasLtFp8, CallsHopperCannotServe_AreRefusedWithTheReasonNotRunOnAnotherKernel) {
    const int64_t m = 16, n = 16, k = 32;
    const auto a = device_bytes(static_cast<size_t>(m * k) * 2), b = device_bytes(static_cast<size_t>(n * k) * 2);
    const auto d = device_bytes(static_cast<size_t>(m * n) * 4);
    const GemmCall tn = linear(m, n, k, a.get(), DType::e4m3, b.get(), DType::e4m3, d.get(), DType::f32);
    EXPECT_EQ(refusal(*gemm_, tn), "");

    GemmCall both_e5m2 = tn;
    both_e5m2.a_dtype = both_e5m2.b_dtype = DType::e5m2;
    EXPECT_NE(refusal(*gemm_, both_e5m2).find("both operands are e5m2"), std::string::npos) << refusal(*gemm_, both_e5m2);

    GemmCall not_tn = tn;
    not_tn.transpose_a = false;
    not_tn.lda = m;
    const std::string why = refusal(*gemm_, not_tn);
    EXPECT_NE(why.find("fp8 test: FP8 GEMM m 16 x n 16 x k 32"), std::string::npos) << why;
    EXPECT_NE(why.find("(\"TN\")"), std::string::npos) << why;

    GemmCall odd_k = tn;
    odd_k.k = 24, odd_k.lda = 24, odd_k.ldb = 24;
    EXPECT_NE(refusal(*gemm_, odd_k).find("k = 24 is not a multiple of 16"), std::string::npos);

    GemmCall mixed = tn;
    mixed.b_dtype = DType::bf16;
    EXPECT_NE(refusal(*gemm_, mixed).find("takes both operands in FP8"), std::string::npos);

    GemmCall gelu = tn;
    gelu.epilogue = GemmEpilogue::gelu_aux_bias;
    gelu.aux = d.get(), gelu.ldaux = m;
    EXPECT_NE(refusal(*gemm_, gelu).find("epilogue"), std::string::npos);
}

}  // namespace
}  // namespace llmtrain

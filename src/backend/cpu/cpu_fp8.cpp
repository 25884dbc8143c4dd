// FP8 on the CPU (backend.h states the ops): the casts round with core/fp8.h, exactly as the
// CUDA kernels do; the GEMM decodes its FP8 operands (exact in f32), multiplies them by BLAS
// in the output's precision and scales the sums by both inverse scales, as cuBLASLt applies
// them to its accumulators. Only the order of the sums differs from a GPU's.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"
#include "core/fp8.h"

namespace llmtrain {

namespace {

// max |x| with NaN winning (as the CUDA kernel's comparison of bit patterns does).
template <class T>
float amax_of(const T* x, int64_t n) {
    float largest = 0;
    for (int64_t i = 0; i < n; ++i) {
        const auto a = static_cast<float>(std::fabs(x[i]));
        if (std::isnan(a)) return NAN;
        largest = std::max(largest, a);
    }
    return largest;
}

// The decoded values of an FP8 matrix (its bytes' values, unscaled).
template <class T>
std::vector<T> decoded(const Tensor& t) {
    const Fp8Format format = fp8_format_of(t.dtype());
    const auto* bytes = static_cast<const uint8_t*>(t.raw());
    std::vector<T> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(fp8_to_float(bytes[i], format));
    return out;
}

int blas_int(const char* op, int64_t v) {
    if (v > INT_MAX) fail(ErrorKind::unsupported, op, ": dimension ", v, " exceeds BLAS's int");
    return static_cast<int>(v);
}

// FP8 bytes as they are into out (unless out is x) and transposed into out_t.
void relayout_fp8(const Fp8Cast& a, int64_t rows, int64_t cols) {
    const auto* x = static_cast<const uint8_t*>(a.x.raw());
    if (a.out.raw() != a.x.raw()) std::copy(x, x + rows * cols, static_cast<uint8_t*>(a.out.raw()));
    if (a.out_t.empty()) return;
    auto* out_t = static_cast<uint8_t*>(a.out_t.raw());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out_t[c * rows + r] = x[r * cols + c];
}

}  // namespace

void CpuBackend::fp8_amax(const Fp8Amax& a) {
    cpu::OpTimer timer(profile_, Op::fp8_amax);
    cpu::expect_tensor(timer.name(), "amax", a.amax, {1}, DType::f32);
    cpu::dispatch_float(timer.name(), "x", a.x, [&]<class T>() { *a.amax.data<float>() = amax_of(a.x.data<T>(), a.x.numel()); });
}

void CpuBackend::fp8_update_scale(const Fp8UpdateScale& a) {
    cpu::OpTimer timer(profile_, Op::fp8_update_scale);
    for (const auto& [name, t] : {std::pair{"scale", &a.scale}, {"scale_inv", &a.scale_inv}, {"amax", &a.amax}})
        expect_fp8_scalar(timer.name(), name, *t, Device::cpu);
    float& scale = *a.scale.data<float>();
    scale = fp8_scale_for_amax(*a.amax.data<float>(), fp8_format_of(a.format), a.margin, scale);
    *a.scale_inv.data<float>() = 1.0f / scale;
}

void CpuBackend::fp8_cast(const Fp8Cast& a) {
    cpu::OpTimer timer(profile_, Op::fp8_cast);
    const auto [rows, cols] = expect_fp8_cast(timer.name(), a, Device::cpu);
    if (is_fp8(a.x.dtype())) {
        relayout_fp8(a, rows, cols);
        return;
    }
    const Fp8Format format = fp8_format_of(a.out.dtype());
    const float scale = *a.scale.data<float>();
    auto* out = static_cast<uint8_t*>(a.out.raw());
    auto* out_t = a.out_t.empty() ? nullptr : static_cast<uint8_t*>(a.out_t.raw());
    const bool e4m3 = format == Fp8Format::e4m3;
    int64_t saturated = 0, flushed = 0;
    cpu::dispatch_float(timer.name(), "x", a.x, [&]<class T>() {
        const T* x = a.x.data<T>();
        // x * scale in f32, as the kernel multiplies (an f64 reference rounds to f32 first).
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                const float v = static_cast<float>(x[r * cols + c]), scaled = v * scale;
                const uint8_t q = float_to_fp8(scaled, format);
                out[r * cols + c] = q;
                if (out_t) out_t[c * rows + r] = q;
                const float a = std::abs(scaled);
                saturated += e4m3 ? a > 464.0f : a >= 61440.0f;  // rounding would leave the range (backend.h)
                flushed += v != 0 && (q & 0x7f) == 0;
            }
        if (!a.amax.empty()) *a.amax.data<float>() = amax_of(x, rows * cols);
    });
    if (!a.counts.empty()) {
        a.counts.data<double>()[0] += static_cast<double>(saturated);
        a.counts.data<double>()[1] += static_cast<double>(flushed);
    }
}

void CpuBackend::matmul_fp8(const MatmulFp8& a) {
    cpu::OpTimer timer(profile_, Op::matmul_fp8);
    const Fp8GemmDims d = expect_matmul_fp8(timer.name(), a, Device::cpu);
    const double scale = static_cast<double>(*a.a_scale_inv.data<float>()) * *a.b_scale_inv.data<float>();
    cpu::dispatch_float(timer.name(), "out", a.out, [&]<class T>() {
        const std::vector<T> lhs = decoded<T>(a.a), rhs = decoded<T>(a.b);
        T* out = a.out.data<T>();
        const T alpha = static_cast<T>(scale), beta = a.accumulate ? T(1) : T(0);
        const int M = blas_int(timer.name(), d.m), N = blas_int(timer.name(), d.n), K = blas_int(timer.name(), d.k);
        if (M == 0 || N == 0) return;
        if (K == 0 && !a.accumulate) std::fill(out, out + d.m * d.n, T(0));
        // out = alpha lhs rhs^T + beta out
        if constexpr (std::is_same_v<T, float>) {
            if (K > 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, lhs.data(), K, rhs.data(), K, beta, out, N);
        } else if (K > 0) {
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, lhs.data(), K, rhs.data(), K, beta, out, N);
        }
        if (a.bias.empty()) return;
        const T* bias = a.bias.data<T>();
        for (int64_t m = 0; m < d.m; ++m)
            for (int64_t n = 0; n < d.n; ++n) out[m * d.n + n] += bias[n];
    });
}

}  // namespace llmtrain

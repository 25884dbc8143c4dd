// Helpers for the CUDA-against-CPU parity tests (ggml's test-backend-ops in spirit): a
// fixture that holds both backends and skips the test when no GPU can be had, host <-> device
// copies that convert to and from bf16/f16 on the host, and the comparison that checks a GPU
// result is finite, not all zero and close to the CPU reference.
//
// Both sides see the same inputs: every input is drawn in f32 and rounded to the 16-bit type
// on the host (rounded_to) before the CPU reference receives it, so what the comparison
// measures is the GPU's arithmetic and its output rounding, never the input rounding.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_host_rules.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/op_test_util.h"

namespace llmtrain::gpu_test {

// ---- the backends ----

// Whether this process sees a GPU (cuda_host_rules.h): a CUDA build and an NVIDIA device
// node or a device the runtime counts.
inline bool gpu_visible_here() {
    int count = 0;
    if (cuda_backend_built()) {
        try {
            count = cuda_device_count();
        } catch (const Error&) {
        }
    }
    return gpu_visible(cuda_backend_built(), nvidia_device_node_present(), count);
}

// Makes the CUDA backend into `out`, its attention by `attention` (the op tests default to the
// native kernels; the cuDNN tests ask for cudnn). Without a visible GPU (a CPU-only build, no
// device) the test is reported SKIPPED, and so is a cudnn backend where libcudnn cannot be
// loaded (the CUDA emulation has none); a backend that refuses a visible GPU otherwise
// (driver too old, compute capability, a broken install) FAILS the test with the reason.
inline void make_cuda_backend_or_skip(std::unique_ptr<Backend>& out, AttentionImpl attention = AttentionImpl::native) {
    try {
        out = make_cuda_backend(0, attention);
    } catch (const Error& e) {
        const bool no_cudnn = attention == AttentionImpl::cudnn && std::string(e.what()).find("cannot be loaded") != std::string::npos;
        if (gpu_visible_here() && !no_cudnn) FAIL() << "a GPU is visible but the CUDA backend refuses it: " << e.what();
        GTEST_SKIP() << (no_cudnn ? "no cuDNN: " : "no GPU: ") << e.what();
    }
}

// Creates the CUDA backend for each test (make_cuda_backend_or_skip). The CPU reference is
// single-threaded: its results are then the same on every machine.
class CudaVsCpuTest : public ::testing::Test {
protected:
    // The attention kernels of the backend under test.
    virtual AttentionImpl attention() const { return AttentionImpl::native; }
    void SetUp() override {
        make_cuda_backend_or_skip(gpu_, attention());
        if (!gpu_) return;
        cpu_ = make_cpu_backend(1);
    }
    // Surfaces an asynchronous kernel error of the test's last ops as a failure of this test.
    void TearDown() override {
        if (gpu_) gpu_->synchronize();
    }
    Backend& gpu() { return *gpu_; }
    Backend& cpu() { return *cpu_; }

private:
    std::unique_ptr<Backend> gpu_, cpu_;
};

// ---- host values ----

inline bool is_16bit_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// The unit roundoff u = 2^-p of a format with p significand bits (the implicit one
// included): bf16 p = 8, u = 3.9e-3; f16 p = 11, u = 4.9e-4; f32 p = 24, u = 6.0e-8. Rounding
// a real x to the format gives x (1 + d) with |d| <= u.
inline double unit_roundoff(DType dtype) {
    switch (dtype) {
        case DType::bf16: return 0x1.0p-8;
        case DType::f16: return 0x1.0p-11;
        case DType::f64: return 0x1.0p-53;
        default: return 0x1.0p-24;
    }
}

// v rounded to the 16-bit type (to nearest even) and back; v itself for f32.
inline float round_to(DType dtype, float v) {
    if (dtype == DType::bf16) return bf16_to_float(float_to_bf16(v));
    if (dtype == DType::f16) return f16_to_float(float_to_f16(v));
    return v;
}

// An f32 host copy of `host` (f32 or f64) with every value rounded to `dtype`.
inline OwnedTensor rounded_to(const Tensor& host, DType dtype) {
    OwnedTensor out(DType::f32, host.shape());
    for (int64_t i = 0; i < host.numel(); ++i) out.data<float>()[i] = round_to(dtype, static_cast<float>(test::get(host, i)));
    return out;
}

// Uniform values in [lo, hi) (seeded, as test::random_tensor), already rounded to `dtype`:
// the host f32 tensor the CPU reference reads and the values the GPU receives.
inline OwnedTensor random_input(DType dtype, Shape shape, uint64_t seed, double lo = -1, double hi = 1) {
    return rounded_to(test::random_tensor(DType::f32, shape, seed, lo, hi), dtype);
}

// Every value of a host tensor (f32, f64 or i32) as a double.
inline std::vector<double> values_of(const Tensor& host) {
    std::vector<double> out(static_cast<size_t>(host.numel()));
    for (int64_t i = 0; i < host.numel(); ++i)
        out[static_cast<size_t>(i)] = host.dtype() == DType::i32 ? static_cast<double>(host.data<int32_t>()[i]) : test::get(host, i);
    return out;
}

// ---- device tensors ----

// A zeroed device tensor.
inline OwnedTensor device_tensor(Backend& be, DType dtype, Shape shape) {
    return OwnedTensor(dtype, shape, be.device(), [&be](size_t bytes) { return be.allocate(bytes); });
}

// Copies `bytes` bytes of raw element data into the device tensor.
inline void upload_raw(Backend& be, const Tensor& dev, const void* data, size_t bytes) {
    if (bytes != dev.bytes()) fail(ErrorKind::shape, "upload_raw: ", bytes, " bytes into a tensor of ", dev.bytes());
    be.copy_from_host(dev, data);
}

// Writes the host tensor (f32, or i32 for an i32 destination) into the device tensor `dev`,
// converting to dev's dtype on the host (bf16/f16 round to nearest even).
inline void upload_into(Backend& be, const Tensor& dev, const Tensor& host) {
    if (dev.numel() != host.numel())
        fail(ErrorKind::shape, "upload_into: ", host.shape().str(), " host values into a device tensor of ", dev.shape().str());
    const auto n = static_cast<size_t>(host.numel());
    if (dev.dtype() == DType::i32 || dev.dtype() == DType::f32) {
        if (host.dtype() != dev.dtype())
            fail(ErrorKind::shape, "upload_into: host ", dtype_name(host.dtype()), " into a device ", dtype_name(dev.dtype()), " tensor");
        be.copy_from_host(dev, host.raw());
        return;
    }
    if (!is_16bit_float(dev.dtype()) || host.dtype() != DType::f32)
        fail(ErrorKind::unsupported, "upload_into: host ", dtype_name(host.dtype()), " into a device ", dtype_name(dev.dtype()), " tensor");
    std::vector<uint16_t> bits(n);
    const float* src = host.data<float>();
    for (size_t i = 0; i < n; ++i) bits[i] = dev.dtype() == DType::bf16 ? float_to_bf16(src[i]) : float_to_f16(src[i]);
    be.copy_from_host(dev, bits.data());
}

// A device copy of a host tensor (f32, or i32 for dtype i32) in `dtype`.
inline OwnedTensor to_device(Backend& be, const Tensor& host, DType dtype) {
    OwnedTensor dev = device_tensor(be, dtype, host.shape());
    upload_into(be, dev, host);
    return dev;
}

// A view of `count` elements of `dtype` starting `offset` elements into the device tensor:
// misaligned views exercise the kernels' scalar paths.
inline Tensor offset_view(const Tensor& dev, int64_t offset, Shape shape) {
    const auto count = shape.numel();
    if (offset < 0 || offset + count > dev.numel()) fail(ErrorKind::shape, "offset_view: [", offset, ", ", offset + count, ") of ", dev.numel());
    char* base = static_cast<char*>(dev.raw()) + static_cast<size_t>(offset) * dtype_size(dev.dtype());
    return Tensor(base, dev.dtype(), shape, dev.device());
}

// The raw bytes of a device tensor (waits for the ops that write it).
inline std::vector<uint8_t> download_bytes(Backend& be, const Tensor& dev) {
    std::vector<uint8_t> bytes(dev.bytes());
    be.copy_to_host(bytes.data(), dev);
    return bytes;
}

// The raw 16-bit patterns of a bf16/f16 device tensor.
inline std::vector<uint16_t> download_bits(Backend& be, const Tensor& dev) {
    std::vector<uint16_t> bits(static_cast<size_t>(dev.numel()));
    if (dtype_size(dev.dtype()) != 2) fail(ErrorKind::shape, "download_bits: a ", dtype_name(dev.dtype()), " tensor");
    be.copy_to_host(bits.data(), dev);
    return bits;
}

// Every value of a device tensor (bf16, f16, f32, f64, i32) as a double.
inline std::vector<double> download(Backend& be, const Tensor& dev) {
    const auto n = static_cast<size_t>(dev.numel());
    const std::vector<uint8_t> bytes = download_bytes(be, dev);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
        const uint8_t* p = bytes.data() + i * dtype_size(dev.dtype());
        switch (dev.dtype()) {
            case DType::bf16: case DType::f16: {
                uint16_t b;
                std::memcpy(&b, p, sizeof b);
                out[i] = dev.dtype() == DType::bf16 ? bf16_to_float(b) : f16_to_float(b);
                break;
            }
            case DType::f32: {
                float f;
                std::memcpy(&f, p, sizeof f);
                out[i] = f;
                break;
            }
            case DType::f64: std::memcpy(&out[i], p, sizeof(double)); break;
            case DType::i32: {
                int32_t v;
                std::memcpy(&v, p, sizeof v);
                out[i] = v;
                break;
            }
            default: fail(ErrorKind::unsupported, "download: a ", dtype_name(dev.dtype()), " tensor");
        }
    }
    return out;
}

// Columns [begin, begin + count) of a row-major matrix of `width` columns.
inline std::vector<double> columns(const std::vector<double>& values, int64_t width, int64_t begin, int64_t count) {
    const auto rows = static_cast<int64_t>(values.size()) / width;
    std::vector<double> out;
    out.reserve(static_cast<size_t>(rows * count));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = begin; c < begin + count; ++c) out.push_back(values[static_cast<size_t>(r * width + c)]);
    return out;
}

inline double max_abs(const std::vector<double>& values) {
    double m = 0;
    for (double v : values) m = std::max(m, std::abs(v));
    return m;
}

// ---- comparison ----

// Element i passes when |gpu_i - cpu_i| <= atol * scale + rtol * |cpu_i|, where scale is the
// reference's largest magnitude (max |cpu|). atol relative to that scale is the bound of a
// result whose error grows with the size of its terms, not of itself (sums, cancellations,
// the 16-bit rounding of intermediate values); rtol bounds one rounding of the result itself.
struct Tolerance {
    double rtol = 0;
    double atol = 0;
};

struct CompareOptions {
    double min_scale = 0;          // scale = max(max |cpu|, min_scale)
    bool may_be_all_zero = false;  // a part that is zero by the math (dq, dk at T = 1)
};

// Tolerances by kind of result (u: the output type's unit roundoff, above).
// Elementwise math and row-local normalization in fp32 from identical inputs, rounded once to
// the 16-bit output: the error is at most u |cpu| plus fp32 noise (tanhf, expf, the order of
// a row's fp32 sum); 2.5u leaves room for an input that is a 16-bit buffer added into (the
// norms' accumulate_dx) and u of the largest magnitude covers cancellations in fp32.
inline Tolerance elementwise_tolerance(DType out) { return {2.5 * unit_roundoff(out), unit_roundoff(out)}; }
// GEMM outputs in 16 bits (K up to 768): products of 16-bit inputs are exact in fp32 and the K
// of them are accumulated in fp32 (cuBLASLt, CUBLAS_COMPUTE_32F), whose error (about
// sqrt(K) 2^-24 of the terms' size) is far below the one rounding of the output to 16 bits,
// u |out| <= u max|out|. The bound 8u max|cpu| (bf16: 3.1e-2, f16: 3.9e-3) is that rounding
// with a wide margin, not an elementwise test: an element near zero may carry the error of
// its terms' size. A wrong tile, stride or transpose moves elements by O(max|out|).
inline Tolerance gemm_tolerance(DType out) { return {0, 8 * unit_roundoff(out)}; }
// Flash attention also rounds the probabilities P (forward and backward) and dS (backward)
// to 16 bits before the tensor-core products; each such rounding is relative u of a term, and
// the sums over keys average them: a few u of max|out|. The same 8u of the largest magnitude.
inline Tolerance attention_tolerance(DType out) { return gemm_tolerance(out); }
// fp32 results from identical 16-bit inputs, summed in another order (parameter gradients of
// norms and biases, norm statistics, attention's log-sum-exps, partial sums): fp32 noise
// only, ~1e-6 relative.
constexpr Tolerance f32_sum_tolerance{1e-4, 1e-4};
// Losses and their log-sum-exps (fp32 expf, logf and a row sum against the CPU's double):
// ~1e-6 relative, so 1e-5 still sees a loss off by 1e-3.
constexpr Tolerance f32_loss_tolerance{1e-5, 1e-5};
// fp32 parameter gradients from tensor-core GEMMs (dw += dout^T x over N rows): Hopper's MMA
// accumulates fp32 with truncation, not round-to-nearest, so its error grows with N ulps;
// still far below 1e-3 of the largest magnitude.
constexpr Tolerance f32_gemm_tolerance{0, 1e-3};

// Checks a GPU result against the CPU reference: every value finite, not every value zero
// (unless the options allow it), and every element within tolerance. A failure names the
// worst element (the largest |diff| / bound), the count of failures and the NMSE.
inline void expect_matches(const std::string& name, const std::vector<double>& gpu, const std::vector<double>& cpu, Tolerance tol,
                           CompareOptions options = {}) {
    ASSERT_EQ(gpu.size(), cpu.size()) << name;
    ASSERT_FALSE(gpu.empty()) << name;
    double scale = options.min_scale;
    for (size_t i = 0; i < cpu.size(); ++i) {
        ASSERT_TRUE(std::isfinite(cpu[i])) << name << ": the CPU reference is not finite at [" << i << "]: " << cpu[i];
        scale = std::max(scale, std::abs(cpu[i]));
    }
    size_t non_finite = 0, failures = 0, worst = 0, first_non_finite = 0;
    double worst_ratio = -1, err2 = 0, ref2 = 0;
    bool any_nonzero = false;
    for (size_t i = 0; i < gpu.size(); ++i) {
        if (!std::isfinite(gpu[i])) {
            if (non_finite++ == 0) first_non_finite = i;
            continue;
        }
        any_nonzero = any_nonzero || gpu[i] != 0;
        const double diff = std::abs(gpu[i] - cpu[i]), bound = tol.atol * scale + tol.rtol * std::abs(cpu[i]);
        if (diff > bound) ++failures;
        const double ratio = bound > 0 ? diff / bound : (diff > 0 ? std::numeric_limits<double>::infinity() : 0);
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
        }
        err2 += diff * diff;
        ref2 += cpu[i] * cpu[i];
    }
    std::ostringstream where;
    where << std::setprecision(9);
    EXPECT_EQ(non_finite, 0u) << name << ": " << non_finite << " of " << gpu.size() << " GPU values are NaN or Inf, the first at ["
                              << first_non_finite << "]: " << gpu[first_non_finite];
    if (!options.may_be_all_zero) {
        EXPECT_TRUE(any_nonzero) << name << ": every GPU value is zero";
    }
    if (failures > 0) {
        where << name << ": " << failures << " of " << gpu.size() << " values differ by more than " << tol.atol << " * " << scale << " + "
              << tol.rtol << " * |cpu|; worst [" << worst << "]: gpu " << gpu[worst] << ", cpu " << cpu[worst] << " (|diff| "
              << std::abs(gpu[worst] - cpu[worst]) << "); NMSE " << (ref2 > 0 ? err2 / ref2 : err2);
        ADD_FAILURE() << where.str();
    }
}

// The device tensor against a host reference tensor.
inline void expect_matches(const std::string& name, Backend& gpu, const Tensor& gpu_result, const Tensor& cpu_result, Tolerance tol,
                           CompareOptions options = {}) {
    expect_matches(name, download(gpu, gpu_result), values_of(cpu_result), tol, options);
}

// Two byte strings of elements of `element_bytes` bytes are identical; a failure names the
// first differing element.
inline void expect_bitwise_equal(const std::string& name, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t element_bytes) {
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) {
            ADD_FAILURE() << name << ": differs first at element " << i / element_bytes << " of " << a.size() / element_bytes;
            return;
        }
}

}  // namespace llmtrain::gpu_test

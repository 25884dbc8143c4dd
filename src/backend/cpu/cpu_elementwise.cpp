// Elementwise ops on the CPU: GELU, SwiGLU, add, fill_zero, copy.
//   GELU (tanh form): y = x/2 (1 + tanh u), u = k (x + 0.044715 x^3), k = sqrt(2/pi);
//     dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) k (1 + 3 * 0.044715 x^2).
//   SwiGLU: for gate g and up u, y = silu(g) u, silu(g) = g sigmoid(g);
//     dy/dg = u sigmoid(g) (1 + g (1 - sigmoid(g))),  dy/du = silu(g).
// GELU and add may run in place: each output element depends on its own inputs only.
// This file is compiled with -ffast-math (CMakeLists.txt) so that tanh and exp run as
// vector calls (glibc's libmvec) under `omp simd`: the ops are elementwise, so no sum is
// reordered and results stay the same for any thread count; nothing here tests for NaN.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

constexpr double gelu_k = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double gelu_c = 0.044715;

template <class T>
void gelu_fwd_elems(T* out, const T* x, int64_t count, int threads) {
    const T k = static_cast<T>(gelu_k), c = static_cast<T>(gelu_c);
#pragma omp parallel for simd num_threads(threads) schedule(static)
    for (int64_t i = 0; i < count; ++i) {
        const T v = x[i];
        out[i] = T(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v)));
    }
}

template <class T>
void gelu_bwd_elems(T* dx, const T* dout, const T* x, int64_t count, int threads) {
    const T k = static_cast<T>(gelu_k), c = static_cast<T>(gelu_c);
#pragma omp parallel for simd num_threads(threads) schedule(static)
    for (int64_t i = 0; i < count; ++i) {
        const T v = x[i];
        const T th = std::tanh(k * (v + c * v * v * v));
        const T dudx = k * (T(1) + T(3) * c * v * v);
        dx[i] = dout[i] * (T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * dudx);
    }
}

template <class T>
T sigmoid(T v) {
    return T(1) / (T(1) + std::exp(-v));
}

template <class T>
void swiglu_fwd_rows(T* out, const T* x, int64_t rows, int64_t F, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* gate = x + n * 2 * F;
        const T* up = gate + F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) out[n * F + f] = gate[f] * sigmoid(gate[f]) * up[f];
    }
}

template <class T>
void swiglu_bwd_rows(T* dx, const T* dout, const T* x, int64_t rows, int64_t F, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* gate = x + n * 2 * F;
        const T* up = gate + F;
        T* dgate = dx + n * 2 * F;
        T* dup = dgate + F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) {
            const T g = gate[f], u = up[f], d = dout[n * F + f], sg = sigmoid(g);
            dgate[f] = d * u * sg * (T(1) + g * (T(1) - sg));
            dup[f] = d * g * sg;
        }
    }
}

template <class T>
void add_elems(T* out, const T* a, const T* b, int64_t count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

}  // namespace

void CpuBackend::gelu_fwd(const Tensor& out, const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::gelu_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        cpu::expect_tensor(op, "out", out, x.shape(), x.dtype());
        gelu_fwd_elems(out.data<T>(), x.data<T>(), x.numel(), threads_);
    });
}

void CpuBackend::gelu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::gelu_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        cpu::expect_tensor(op, "dx", dx, x.shape(), x.dtype());
        cpu::expect_tensor(op, "dout", dout, x.shape(), x.dtype());
        gelu_bwd_elems(dx.data<T>(), dout.data<T>(), x.data<T>(), x.numel(), threads_);
    });
}

void CpuBackend::swiglu_fwd(const Tensor& out, const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::swiglu_fwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "x", x, 2);
    if (x.dim(1) % 2 != 0) fail(ErrorKind::shape, op, ": x has shape ", x.shape().str(), "; its width must be even (gate, then up)");
    const int64_t N = x.dim(0), F = x.dim(1) / 2;
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        cpu::expect_tensor(op, "out", out, {N, F}, x.dtype());
        swiglu_fwd_rows(out.data<T>(), x.data<T>(), N, F, threads_);
    });
}

void CpuBackend::swiglu_bwd(const Tensor& dx, const Tensor& dout, const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::swiglu_bwd);
    const char* op = timer.name();
    cpu::expect_rank(op, "x", x, 2);
    if (x.dim(1) % 2 != 0) fail(ErrorKind::shape, op, ": x has shape ", x.shape().str(), "; its width must be even (gate, then up)");
    const int64_t N = x.dim(0), F = x.dim(1) / 2;
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        cpu::expect_tensor(op, "dx", dx, x.shape(), x.dtype());
        cpu::expect_tensor(op, "dout", dout, {N, F}, x.dtype());
        swiglu_bwd_rows(dx.data<T>(), dout.data<T>(), x.data<T>(), N, F, threads_);
    });
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
    cpu::OpTimer timer(profile_, Op::add);
    const char* op = timer.name();
    cpu::dispatch_float(op, "a", a, [&]<class T>() {
        cpu::expect_tensor(op, "b", b, a.shape(), a.dtype());
        cpu::expect_tensor(op, "out", out, a.shape(), a.dtype());
        add_elems(out.data<T>(), a.data<T>(), b.data<T>(), a.numel(), threads_);
    });
}

void CpuBackend::fill_zero(const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::fill_zero);
    cpu::dispatch_float(timer.name(), "x", x, [&]<class T>() {
        if (x.numel() > 0) std::memset(x.raw(), 0, x.bytes());
    });
}

namespace {

// f32 <-> bf16 / f16, element by element, rounding to nearest even (core/dtype.h): the CPU
// computes in f32, but the data-parallel gradient reduction may carry bf16 copies.
void convert(const char* op, const Tensor& out, const Tensor& in) {
    cpu::expect_host(op, "in", in);
    cpu::expect_tensor(op, "out", out, in.shape(), out.dtype());
    const bool narrowing = in.dtype() == DType::f32 && (out.dtype() == DType::bf16 || out.dtype() == DType::f16);
    const bool widening = out.dtype() == DType::f32 && (in.dtype() == DType::bf16 || in.dtype() == DType::f16);
    if (!narrowing && !widening)
        fail(ErrorKind::unsupported, op, ": the CPU backend converts f32 to and from bf16 / f16, not ", dtype_name(in.dtype()), " to ", dtype_name(out.dtype()));
    const int64_t n = in.numel();
    if (narrowing) {
        const float* from = static_cast<const float*>(in.raw());
        uint16_t* to = static_cast<uint16_t*>(out.raw());
        if (out.dtype() == DType::bf16) for (int64_t i = 0; i < n; ++i) to[i] = float_to_bf16(from[i]);
        else for (int64_t i = 0; i < n; ++i) to[i] = float_to_f16(from[i]);
        return;
    }
    const uint16_t* from = static_cast<const uint16_t*>(in.raw());
    float* to = static_cast<float*>(out.raw());
    if (in.dtype() == DType::bf16) for (int64_t i = 0; i < n; ++i) to[i] = bf16_to_float(from[i]);
    else for (int64_t i = 0; i < n; ++i) to[i] = f16_to_float(from[i]);
}

}  // namespace

void CpuBackend::copy(const Tensor& out, const Tensor& in) {
    cpu::OpTimer timer(profile_, Op::copy);
    const char* op = timer.name();
    if (out.dtype() != in.dtype()) {
        convert(op, out, in);
        return;
    }
    if (is_fp8(in.dtype())) {
        cpu::expect_host(op, "in", in);
        cpu::expect_tensor(op, "out", out, in.shape(), in.dtype());
        if (in.numel() > 0) std::memcpy(out.raw(), in.raw(), in.bytes());
        return;
    }
    cpu::dispatch_float(op, "in", in, [&]<class T>() {
        cpu::expect_tensor(op, "out", out, in.shape(), in.dtype());
        if (in.numel() > 0) std::memcpy(out.raw(), in.raw(), in.bytes());
    });
}

}  // namespace llmtrain

// The optimizer-side ops on the CPU: the AdamW update and the sum of squares behind the
// global gradient norm.
//   AdamW (decoupled weight decay), per element, in double:
//     g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//     p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p )
//   sum_squares, accumulate_sum(_squares): partial sums over fixed chunks (boundaries
//     independent of the thread count), added in chunk order, all in double: the same result
//     for any thread count.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

constexpr int64_t sum_chunk = 1 << 14;
// Below this many elements a parallel region costs more than it saves (parameters are
// updated tensor by tensor, many of them small).
constexpr int64_t parallel_min_elems = 1 << 15;

template <class T>
void adamw_elems(T* param, const T* grad, T* m, T* v, int64_t count, const AdamWStep& s, int threads) {
    const double t = static_cast<double>(s.step);
    const double bias1 = 1.0 - std::pow(s.beta1, t), bias2 = 1.0 - std::pow(s.beta2, t);
#pragma omp parallel for num_threads(threads) schedule(static) if (count >= parallel_min_elems)
    for (int64_t i = 0; i < count; ++i) {
        const double g = static_cast<double>(grad[i]) * s.grad_scale;
        const double mi = s.beta1 * static_cast<double>(m[i]) + (1.0 - s.beta1) * g;
        const double vi = s.beta2 * static_cast<double>(v[i]) + (1.0 - s.beta2) * g * g;
        const double p = static_cast<double>(param[i]);
        const double update = (mi / bias1) / (std::sqrt(vi / bias2) + s.eps) + s.weight_decay * p;
        m[i] = static_cast<T>(mi);
        v[i] = static_cast<T>(vi);
        param[i] = static_cast<T>(p - s.lr * update);
    }
}

template <class T, bool Squares = true>
double sum_chunked(const T* x, int64_t count, int threads) {
    const int64_t chunks = (count + sum_chunk - 1) / sum_chunk;
    std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for num_threads(threads) schedule(static) if (chunks > 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t end = std::min(count, (chunk + 1) * sum_chunk);
        double acc = 0;
        for (int64_t i = chunk * sum_chunk; i < end; ++i) acc += Squares ? static_cast<double>(x[i]) * static_cast<double>(x[i]) : static_cast<double>(x[i]);
        partial[static_cast<size_t>(chunk)] = acc;
    }
    double total = 0;
    for (double p : partial) total += p;
    return total;
}

}  // namespace

void CpuBackend::adamw(const AdamWUpdate& a) {
    const Tensor &param = a.param, &grad = a.grad, &m = a.m, &v = a.v, &param_copy = a.param_copy;
    const AdamWStep& step = a.step;
    cpu::OpTimer timer(profile_, Op::adamw);
    const char* op = timer.name();
    if (!param_copy.empty()) fail(ErrorKind::unsupported, op, ": the CPU backend keeps no compute copy of the parameters");
    if (step.step < 1) fail(ErrorKind::runtime, op, ": step ", step.step, " must be at least 1 (bias correction divides by 1 - beta^t)");
    cpu::dispatch_float(op, "param", param, [&]<class T>() {
        cpu::expect_tensor(op, "grad", grad, param.shape(), param.dtype());
        cpu::expect_tensor(op, "m", m, param.shape(), param.dtype());
        cpu::expect_tensor(op, "v", v, param.shape(), param.dtype());
        adamw_elems(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(), step, threads_);
    });
}

double CpuBackend::sum_squares(const Tensor& x) {
    cpu::OpTimer timer(profile_, Op::sum_squares);
    double total = 0;
    cpu::dispatch_float(timer.name(), "x", x, [&]<class T>() { total = sum_chunked(x.data<T>(), x.numel(), threads_); });
    return total;
}

namespace {
double& total_of(const char* op, const Tensor& total) {
    cpu::expect_tensor(op, "total", total, {1}, DType::f64);
    return *total.data<double>();
}
}  // namespace

void CpuBackend::accumulate_sum(const Tensor& total, const Tensor& x, double scale) {
    cpu::OpTimer timer(profile_, Op::accumulate_sum);
    double& t = total_of(timer.name(), total);
    cpu::dispatch_float(timer.name(), "x", x, [&]<class T>() { t += scale * sum_chunked<T, false>(x.data<T>(), x.numel(), threads_); });
}

void CpuBackend::accumulate_sum_squares(const Tensor& total, const std::vector<Tensor>& pieces) {
    cpu::OpTimer timer(profile_, Op::accumulate_sum_squares);
    double& t = total_of(timer.name(), total);
    for (const Tensor& piece : pieces) cpu::dispatch_float(timer.name(), "piece", piece, [&]<class T>() { t += sum_chunked(piece.data<T>(), piece.numel(), threads_); });
}

}  // namespace llmtrain

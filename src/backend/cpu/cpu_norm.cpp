// LayerNorm and RMSNorm on the CPU, one row (token) at a time; row statistics in double.
//
// LayerNorm: xhat = (x - mean) rstd, rstd = 1 / sqrt(var + eps), out = xhat w + b.
//   With g = dout w:  dx = rstd (g - mean(g) - xhat mean(g xhat)),
//   dw += sum_rows dout xhat,  db += sum_rows dout.
// RMSNorm: xhat = x rstd, rstd = 1 / sqrt(mean(x^2) + eps), out = xhat w.
//   With g = dout w:  dx = rstd (g - xhat mean(g xhat)),  dw += sum_rows dout xhat.
// The parameter gradients reduce over rows, so they run over column blocks (one thread per
// element, row order); they are computed before dx, which may then alias dout.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// The normalized value as forward computed it; mean is null for RMSNorm.
template <class T>
inline T normalized(T x, const T* mean, const T* rstd, int64_t n) {
    return mean ? (x - mean[n]) * rstd[n] : x * rstd[n];
}

template <class T>
void norm_fwd_rows(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows, int64_t C, double eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* xr = x + n * C;
        double mu = 0;
        if (mean) {
            for (int64_t c = 0; c < C; ++c) mu += static_cast<double>(xr[c]);
            mu /= static_cast<double>(C);
            mean[n] = static_cast<T>(mu);
        }
        double sq = 0;
        for (int64_t c = 0; c < C; ++c) {
            const double d = static_cast<double>(xr[c]) - mu;
            sq += d * d;
        }
        rstd[n] = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(C) + eps));
        // Normalize with the saved statistics so that backward sees the same xhat.
        T* o = out + n * C;
        for (int64_t c = 0; c < C; ++c) o[c] = normalized(xr[c], mean, rstd, n) * w[c] + (b ? b[c] : T(0));
    }
}

template <class T>
void norm_param_grads(T* dw, T* db, const T* dout, const T* x, const T* mean, const T* rstd, int64_t rows, int64_t C, int threads) {
    const int64_t blocks = cpu::column_block_count(C);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t c0 = block * cpu::column_block, c1 = cpu::column_block_end(block, C);
        double acc_w[cpu::column_block] = {};
        double acc_b[cpu::column_block] = {};
        for (int64_t n = 0; n < rows; ++n) {
            const T* d = dout + n * C;
            const T* xr = x + n * C;
            for (int64_t c = c0; c < c1; ++c) {
                acc_w[c - c0] += static_cast<double>(d[c] * normalized(xr[c], mean, rstd, n));
                acc_b[c - c0] += static_cast<double>(d[c]);
            }
        }
        for (int64_t c = c0; c < c1; ++c) {
            if (dw) dw[c] += static_cast<T>(acc_w[c - c0]);
            if (db) db[c] += static_cast<T>(acc_b[c - c0]);
        }
    }
}

template <class T>
void norm_input_grad(T* dx, const T* dout, const T* x, const T* w, const T* mean, const T* rstd, int64_t rows, int64_t C, bool accumulate, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* d = dout + n * C;
        const T* xr = x + n * C;
        double sum_g = 0, sum_gx = 0;
        for (int64_t c = 0; c < C; ++c) {
            const T g = d[c] * w[c];
            sum_g += static_cast<double>(g);
            sum_gx += static_cast<double>(g * normalized(xr[c], mean, rstd, n));
        }
        const T mean_g = mean ? static_cast<T>(sum_g / static_cast<double>(C)) : T(0);
        const T mean_gx = static_cast<T>(sum_gx / static_cast<double>(C));
        T* o = dx + n * C;
        for (int64_t c = 0; c < C; ++c) {
            const T g = rstd[n] * (d[c] * w[c] - mean_g - normalized(xr[c], mean, rstd, n) * mean_gx);
            o[c] = accumulate ? o[c] + g : g;
        }
    }
}


}  // namespace

void CpuBackend::layernorm_fwd(const LayerNormFwd& a) {
    const Tensor &out = a.out, &mean = a.mean, &rstd = a.rstd, &x = a.x, &w = a.w, &b = a.b;
    const double eps = a.eps;
    cpu::OpTimer timer(profile_, Op::layernorm_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const auto [N, C] = expect_norm_tensors(op, Device::cpu, x.dtype(), x, w, b, {{{"out", &out}}, {{"mean", &mean}, {"rstd", &rstd}}, {}});
        norm_fwd_rows(out.data<T>(), mean.data<T>(), rstd.data<T>(), x.data<T>(), w.data<T>(), cpu::data_or_null<T>(b), N, C, eps, threads_);
    });
}

void CpuBackend::layernorm_bwd(const LayerNormBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &db = a.db, &dout = a.dout, &x = a.x, &w = a.w, &mean = a.mean, &rstd = a.rstd;
    const bool accumulate_dx = a.accumulate_dx;
    cpu::OpTimer timer(profile_, Op::layernorm_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const auto [N, C] = expect_norm_tensors(op, Device::cpu, x.dtype(), x, w, Tensor(),
                                                {{{"dx", &dx}, {"dout", &dout}}, {{"mean", &mean}, {"rstd", &rstd}}, {{"dw", &dw}, {"db", &db}}});
        norm_param_grads(cpu::data_or_null<T>(dw), cpu::data_or_null<T>(db), dout.data<T>(), x.data<T>(), mean.data<T>(), rstd.data<T>(), N, C, threads_);
        norm_input_grad(dx.data<T>(), dout.data<T>(), x.data<T>(), w.data<T>(), mean.data<T>(), rstd.data<T>(), N, C, accumulate_dx, threads_);
    });
}

void CpuBackend::rmsnorm_fwd(const RmsNormFwd& a) {
    const Tensor &out = a.out, &rstd = a.rstd, &x = a.x, &w = a.w;
    const double eps = a.eps;
    cpu::OpTimer timer(profile_, Op::rmsnorm_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const auto [N, C] = expect_norm_tensors(op, Device::cpu, x.dtype(), x, w, Tensor(), {{{"out", &out}}, {{"rstd", &rstd}}, {}});
        norm_fwd_rows<T>(out.data<T>(), nullptr, rstd.data<T>(), x.data<T>(), w.data<T>(), nullptr, N, C, eps, threads_);
    });
}

void CpuBackend::rmsnorm_bwd(const RmsNormBwd& a) {
    const Tensor &dx = a.dx, &dw = a.dw, &dout = a.dout, &x = a.x, &w = a.w, &rstd = a.rstd;
    const bool accumulate_dx = a.accumulate_dx;
    cpu::OpTimer timer(profile_, Op::rmsnorm_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "x", x, [&]<class T>() {
        const auto [N, C] = expect_norm_tensors(op, Device::cpu, x.dtype(), x, w, Tensor(), {{{"dx", &dx}, {"dout", &dout}}, {{"rstd", &rstd}}, {{"dw", &dw}}});
        norm_param_grads<T>(cpu::data_or_null<T>(dw), nullptr, dout.data<T>(), x.data<T>(), nullptr, rstd.data<T>(), N, C, threads_);
        norm_input_grad<T>(dx.data<T>(), dout.data<T>(), x.data<T>(), w.data<T>(), nullptr, rstd.data<T>(), N, C, accumulate_dx, threads_);
    });
}

}  // namespace llmtrain

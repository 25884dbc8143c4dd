// Softmax cross-entropy on the CPU, one row (token) at a time, in double per row:
//   forward:  loss[n] = logsumexp(logits[n]) - logits[n, t],  t = targets[n]
//   backward: dlogits[n] = (softmax(logits[n]) - onehot(t)) dloss
// The backward takes the row's max and sum before it writes, so dlogits may alias logits.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

void expect_targets_in_vocab(const char* op, const int32_t* targets, int64_t rows, int64_t vocab) {
    for (int64_t n = 0; n < rows; ++n)
        if (targets[n] < 0 || targets[n] >= vocab)
            fail(ErrorKind::data, op, ": target ", targets[n], " at row ", n, " is outside the vocabulary [0, ", vocab, ")");
}

struct RowSoftmax {
    double max, sum;  // softmax(x)_v = exp(x_v - max) / sum
};

template <class T>
RowSoftmax row_softmax(const T* row, int64_t V) {
    double mx = static_cast<double>(row[0]);
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    return {mx, sum};
}

template <class T>
void xent_fwd_rows(T* losses, const T* logits, const int32_t* targets, int64_t rows, int64_t V, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* row = logits + n * V;
        const RowSoftmax sm = row_softmax(row, V);
        losses[n] = static_cast<T>(sm.max + std::log(sm.sum) - static_cast<double>(row[targets[n]]));
    }
}

template <class T>
void xent_bwd_rows(T* dlogits, const T* logits, const int32_t* targets, double dloss, int64_t rows, int64_t V, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* row = logits + n * V;
        const RowSoftmax sm = row_softmax(row, V);
        T* d = dlogits + n * V;
        for (int64_t v = 0; v < V; ++v) {
            const double p = std::exp(static_cast<double>(row[v]) - sm.max) / sm.sum;
            d[v] = static_cast<T>((p - (v == targets[n] ? 1.0 : 0.0)) * dloss);
        }
    }
}

struct XentDims {
    int64_t rows, vocab;
};

XentDims expect_xent_inputs(const char* op, const Tensor& logits, const Tensor& targets) {
    cpu::expect_rank(op, "logits", logits, 2);
    if (logits.dim(1) < 1) fail(ErrorKind::shape, op, ": logits has shape ", logits.shape().str(), ", expected at least one class");
    cpu::expect_tensor(op, "targets", targets, {logits.dim(0)}, DType::i32);
    expect_targets_in_vocab(op, targets.data<int32_t>(), logits.dim(0), logits.dim(1));
    return {logits.dim(0), logits.dim(1)};
}

}  // namespace

void CpuBackend::xent_fwd(const Tensor& losses, const Tensor& logits, const Tensor& targets) {
    cpu::OpTimer timer(profile_, Op::xent_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        const auto [N, V] = expect_xent_inputs(op, logits, targets);
        cpu::expect_tensor(op, "losses", losses, {N}, logits.dtype());
        xent_fwd_rows(losses.data<T>(), logits.data<T>(), targets.data<int32_t>(), N, V, threads_);
    });
}

void CpuBackend::xent_bwd(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, double dloss) {
    cpu::OpTimer timer(profile_, Op::xent_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        const auto [N, V] = expect_xent_inputs(op, logits, targets);
        cpu::expect_tensor(op, "dlogits", dlogits, {N, V}, logits.dtype());
        xent_bwd_rows(dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(), dloss, N, V, threads_);
    });
}

}  // namespace llmtrain

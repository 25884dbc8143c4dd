// Softmax cross-entropy on the CPU, one row (token) at a time, in double per row:
//   forward:  loss[n] = logsumexp(logits[n]) - logits[n, t],  t = targets[n]
//   backward: dlogits[n] = (softmax(logits[n]) - onehot(t)) dloss
// The backward takes the row's max and sum before it writes, so dlogits may alias logits.
//
// Vocabulary-parallel form (each rank holds the logits of a slice of the vocabulary):
// m = max_v logits (reduced with max over ranks), S = sum_v exp(logits - m) and the target's
// logit (reduced with sum over ranks), then lse = m + log S and loss = lse - logit[t].
//
// Padded vocabulary: the classes from VocabShard::real on are padding. They sit at the end
// of the vocabulary, so a row's real classes are its first `real` columns (VocabRows::
// real_count): max and sum run over those only, and the padded columns get dlogits = 0.
// The loss and the gradient of every real logit are then those of the unpadded rows.
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace llmtrain {

namespace {

// -inf for no columns (a shard of padding only): it adds nothing to the max over shards.
template <class T>
double row_max_of(const T* row, int64_t V) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    return mx;
}

template <class T>
double row_sum_exp(const T* row, int64_t V, double shift) {
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - shift);
    return sum;
}

template <class T>
double row_logsumexp(const T* row, int64_t V) {
    const double mx = row_max_of(row, V);
    return mx + std::log(row_sum_exp(row, V, mx));
}

template <class T>
void xent_fwd_rows(T* losses, T* lse, const T* logits, const int32_t* targets, cpu::VocabRows whole, int64_t rows, int threads) {
    const int64_t V = whole.count, real = whole.real_count();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* row = logits + n * V;
        const double row_lse = row_logsumexp(row, real);
        if (lse) lse[n] = static_cast<T>(row_lse);
        losses[n] = static_cast<T>(row_lse - static_cast<double>(row[targets[n]]));
    }
}

// lse may be null: the rows are whole and their logsumexp is computed here.
template <class T>
void xent_bwd_rows(T* dlogits, const T* logits, const int32_t* targets, const T* lse, cpu::VocabRows local, double dloss, int64_t rows,
                   int threads) {
    const int64_t V = local.count, real = local.real_count();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
        const T* row = logits + n * V;
        const double row_lse = lse ? static_cast<double>(lse[n]) : row_logsumexp(row, real);
        const int64_t target = local.holds(targets[n]) ? targets[n] - local.begin : -1;
        T* d = dlogits + n * V;
        for (int64_t v = 0; v < real; ++v) {
            const double p = std::exp(static_cast<double>(row[v]) - row_lse);
            d[v] = static_cast<T>((p - (v == target ? 1.0 : 0.0)) * dloss);
        }
        for (int64_t v = real; v < V; ++v) d[v] = T(0);
    }
}

struct XentDims {
    int64_t rows, vocab;
};

XentDims expect_xent_inputs(const char* op, const Tensor& logits, const Tensor& targets, const cpu::VocabRows& local) {
    cpu::expect_rank(op, "logits", logits, 2);
    if (logits.dim(1) < 1) fail(ErrorKind::shape, op, ": logits has shape ", logits.shape().str(), ", expected at least one class");
    cpu::expect_tensor(op, "targets", targets, {logits.dim(0)}, DType::i32);
    cpu::expect_vocab_rows(op, local);
    cpu::expect_ids_in_vocab(op, "target", targets.data<int32_t>(), logits.dim(0), local.real);
    return {logits.dim(0), logits.dim(1)};
}

}  // namespace

void CpuBackend::xent_fwd(const XentFwd& a) {
    const Tensor &losses = a.losses, &lse = a.lse, &logits = a.logits, &targets = a.targets;
    const VocabShard vocab = a.vocab;
    cpu::OpTimer timer(profile_, Op::xent_fwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        cpu::expect_rank(op, "logits", logits, 2);
        const cpu::VocabRows whole(vocab, logits.dim(1));
        if (whole.count != whole.total) fail(ErrorKind::shape, op, ": logits must hold whole rows of the vocabulary (use xent_partial for a shard)");
        const auto [N, V] = expect_xent_inputs(op, logits, targets, whole);
        cpu::expect_tensor(op, "losses", losses, {N}, logits.dtype());
        if (!lse.empty()) cpu::expect_tensor(op, "lse", lse, {N}, logits.dtype());
        xent_fwd_rows(losses.data<T>(), cpu::data_or_null<T>(lse), logits.data<T>(), targets.data<int32_t>(), whole, N, threads_);
    });
}

void CpuBackend::xent_bwd(const XentBwd& a) {
    const Tensor &dlogits = a.dlogits, &logits = a.logits, &targets = a.targets, &lse = a.lse;
    const VocabShard shard = a.vocab;
    const double dloss = a.dloss;
    cpu::OpTimer timer(profile_, Op::xent_bwd);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        cpu::expect_rank(op, "logits", logits, 2);
        const cpu::VocabRows local(shard, logits.dim(1));
        if (lse.empty() && local.count != local.total)
            fail(ErrorKind::shape, op, ": logits hold a vocabulary shard; the rows' logsumexp (lse) must be given");
        const auto [N, V] = expect_xent_inputs(op, logits, targets, local);
        cpu::expect_tensor(op, "dlogits", dlogits, {N, V}, logits.dtype());
        if (!lse.empty()) cpu::expect_tensor(op, "lse", lse, {N}, logits.dtype());
        xent_bwd_rows(dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(), cpu::data_or_null<T>(lse), local, dloss, N, threads_);
    });
}

void CpuBackend::logits_row_max(const Tensor& row_max, const Tensor& logits, VocabShard shard) {
    cpu::OpTimer timer(profile_, Op::logits_row_max);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        cpu::expect_rank(op, "logits", logits, 2);
        const cpu::VocabRows local(shard, logits.dim(1));
        cpu::expect_vocab_rows(op, local);
        const int64_t N = logits.dim(0), V = logits.dim(1), real = local.real_count();
        cpu::expect_tensor(op, "row_max", row_max, {N}, logits.dtype());
        T* out = row_max.data<T>();
        const T* in = logits.data<T>();
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t n = 0; n < N; ++n) out[n] = static_cast<T>(row_max_of(in + n * V, real));
    });
}

void CpuBackend::xent_partial(const XentPartial& a) {
    const Tensor &partial = a.partial, &logits = a.logits, &targets = a.targets, &row_max = a.row_max;
    const VocabShard shard = a.vocab;
    cpu::OpTimer timer(profile_, Op::xent_partial);
    const char* op = timer.name();
    cpu::dispatch_float(op, "logits", logits, [&]<class T>() {
        cpu::expect_rank(op, "logits", logits, 2);
        const cpu::VocabRows local(shard, logits.dim(1));
        // Variables, not a structured binding: the OpenMP loop below uses them, and clang before 16
        // cannot capture a binding into its outlined region.
        const XentDims dims = expect_xent_inputs(op, logits, targets, local);
        const int64_t N = dims.rows, V = dims.vocab;
        cpu::expect_tensor(op, "row_max", row_max, {N}, logits.dtype());
        cpu::expect_tensor(op, "partial", partial, {N, 2}, logits.dtype());
        const T* in = logits.data<T>();
        const T* mx = row_max.data<T>();
        const int32_t* t = targets.data<int32_t>();
        T* out = partial.data<T>();
        const int64_t real = local.real_count();
#pragma omp parallel for num_threads(threads_) schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const T* row = in + n * V;
            out[2 * n] = static_cast<T>(row_sum_exp(row, real, static_cast<double>(mx[n])));
            out[2 * n + 1] = local.holds(t[n]) ? row[t[n] - local.begin] : T(0);
        }
    });
}

void CpuBackend::xent_combine(const XentCombine& a) {
    const Tensor &losses = a.losses, &lse = a.lse, &partial = a.partial, &row_max = a.row_max;
    cpu::OpTimer timer(profile_, Op::xent_combine);
    const char* op = timer.name();
    cpu::dispatch_float(op, "partial", partial, [&]<class T>() {
        cpu::expect_rank(op, "partial", partial, 2);
        const int64_t N = partial.dim(0);
        cpu::expect_tensor(op, "partial", partial, {N, 2}, partial.dtype());
        cpu::expect_tensor(op, "row_max", row_max, {N}, partial.dtype());
        cpu::expect_tensor(op, "losses", losses, {N}, partial.dtype());
        cpu::expect_tensor(op, "lse", lse, {N}, partial.dtype());
        const T* p = partial.data<T>();
        const T* mx = row_max.data<T>();
        T* loss = losses.data<T>();
        T* l = lse.data<T>();
        for (int64_t n = 0; n < N; ++n) {
            const double value = static_cast<double>(mx[n]) + std::log(static_cast<double>(p[2 * n]));
            l[n] = static_cast<T>(value);
            loss[n] = static_cast<T>(value - static_cast<double>(p[2 * n + 1]));
        }
    });
}

}  // namespace llmtrain

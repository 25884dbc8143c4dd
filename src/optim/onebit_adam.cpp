#include "optim/onebit_adam.h"

#include <cmath>

#include "parallel/gradient_sync.h"

namespace llmtrain {

namespace {
// A tensor of the backend (f32 or f64) as host doubles, and back.
std::vector<double> to_host(Backend& backend, const Tensor& t) {
    std::vector<double> out(static_cast<size_t>(t.numel()));
    if (t.dtype() == DType::f64) {
        backend.copy_to_host(out.data(), t);
        return out;
    }
    std::vector<float> f(out.size());
    backend.copy_to_host(f.data(), t);
    for (size_t i = 0; i < f.size(); ++i) out[i] = f[i];
    return out;
}

void from_host(Backend& backend, const Tensor& t, const std::vector<double>& values) {
    if (t.dtype() == DType::f64) return backend.copy_from_host(t, values.data());
    std::vector<float> f(values.begin(), values.end());
    backend.copy_from_host(t, f.data());
}

const OwnedPiece& whole_buffer(const std::vector<OwnedPiece>& pieces, const Parameters& params) {
    if (pieces.size() != 1 || pieces.front().begin != 0 || pieces.front().end < params.total_numel())
        fail(ErrorKind::config, "optimizer.name = \"onebit_adam\" updates the whole parameter buffer on every rank: set parallel.zero_stage = 0");
    return pieces.front();
}
}  // namespace

void check_optimizer_layout(const OptimizerConfig& optimizer, const ParallelConfig& parallel, int64_t dp) {
    if (optimizer.name != OptimizerName::onebit_adam) return;
    if (parallel.zero_stage >= 1 && dp > 1)
        fail(ErrorKind::config, "optimizer.name = \"onebit_adam\" with parallel.zero_stage = ", parallel.zero_stage, parallel.zero_stage == 1 ? " (the default)" : "", " on dp ", dp,
             ": 1-bit Adam keeps the full momentum on every rank and all-reduces it compressed, so it cannot shard the optimizer state or the gradients; set parallel.zero_stage = 0");
}

OnebitAdam::OnebitAdam(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces, Comm& dp)
    : AdamW(config, params, std::move(pieces)), dp_(dp), allreduce_(dp, whole_buffer(pieces_, params).end) {}

void OnebitAdam::step(Backend& backend, double lr, double grad_scale) {
    if (reduces_gradients()) return AdamW::step(backend, lr, grad_scale);
    ++steps_taken_;
    const OwnedPiece& piece = pieces_.front();
    const double b1 = config_.beta1, local_estimate = grad_scale * static_cast<double>(dp_.size());
    const std::vector<double> grads = to_host(backend, piece.grads);
    std::vector<double> m = to_host(backend, m_.view());
    std::vector<float> local(m.size());
    for (size_t i = 0; i < m.size(); ++i) local[i] = static_cast<float>(b1 * m[i] + (1.0 - b1) * grads[i] * local_estimate);
    allreduce_.average(local);
    for (size_t i = 0; i < m.size(); ++i) m[i] = local[i];
    from_host(backend, m_.view(), m);

    const std::vector<double> v = to_host(backend, v_.view());
    std::vector<double> values = to_host(backend, params_.all_values().slice_rows(0, piece.end));
    const double bias1 = 1.0 - std::pow(b1, static_cast<double>(steps_taken_));
    const double bias2 = 1.0 - std::pow(config_.beta2, static_cast<double>(config_.freeze_step));
    for_each_param_in(params_, piece, [&](size_t index, int64_t begin, int64_t end) {
        const double decay = params_.info(index).weight_decay ? config_.weight_decay : 0.0;
        for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
            const double update = (m[i] / bias1) / (std::sqrt(v[i] / bias2) + config_.eps) + decay * values[i];
            values[i] -= lr * update;
        }
    });
    from_host(backend, params_.all_values().slice_rows(0, piece.end), values);
    params_.refresh_compute_copy();
}

std::vector<RankLocalState> OnebitAdam::rank_local_state() const {
    return {{"onebit_worker_error", &allreduce_.worker_error()}, {"onebit_server_error", &allreduce_.server_error()}};
}

void OnebitAdam::set_rank_local_state(const std::string& name, const std::vector<double>& values) {
    std::vector<float>& target = name == "onebit_worker_error" ? allreduce_.worker_error() : allreduce_.server_error();
    if (name != "onebit_worker_error" && name != "onebit_server_error") AdamW::set_rank_local_state(name, values);
    if (values.size() != target.size())
        fail(ErrorKind::data, "checkpoint: optimizer/", name, " holds ", values.size(), " values; this rank's 1-bit Adam keeps ", target.size());
    std::copy(values.begin(), values.end(), target.begin());
}

std::unique_ptr<AdamW> make_optimizer(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces, Comm& dp) {
    if (config.name == OptimizerName::onebit_adam) return std::make_unique<OnebitAdam>(config, params, std::move(pieces), dp);
    return std::make_unique<AdamW>(config, params, std::move(pieces));
}

}  // namespace llmtrain

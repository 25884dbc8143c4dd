#include "optim/adamw.h"

#include <cmath>

namespace llmtrain {

double global_grad_norm(Backend& backend, const Parameters& params) {
    return std::sqrt(backend.sum_squares(params.all_grads()));
}

double clip_scale(double grad_norm, double max_norm) {
    if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0;
    return max_norm / (grad_norm + 1e-6);
}

AdamW::AdamW(const OptimizerConfig& config, Parameters& params)
    : config_(config), params_(params), m_(params.dtype(), {params.total_numel()}), v_(params.dtype(), {params.total_numel()}) {}

void AdamW::step(Backend& backend, double lr, double grad_scale) {
    ++steps_taken_;
    const size_t elem = dtype_size(params_.dtype());
    for (size_t i = 0; i < params_.count(); ++i) {
        const ParamInfo& info = params_.info(i);
        const size_t byte_offset = static_cast<size_t>(info.offset) * elem;
        const Tensor m(static_cast<char*>(m_.view().raw()) + byte_offset, params_.dtype(), info.shape);
        const Tensor v(static_cast<char*>(v_.view().raw()) + byte_offset, params_.dtype(), info.shape);
        AdamWStep s;
        s.lr = lr;
        s.beta1 = config_.beta1;
        s.beta2 = config_.beta2;
        s.eps = config_.eps;
        s.weight_decay = info.weight_decay ? config_.weight_decay : 0.0;
        s.grad_scale = grad_scale;
        s.step = steps_taken_;
        backend.adamw(params_.value(i), params_.grad(i), m, v, s);
    }
}

}  // namespace llmtrain

#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace llmtrain {

double learning_rate_at(const OptimizerConfig& o, int64_t step, int64_t total_steps) {
    const int64_t warmup = std::min(o.warmup_steps, total_steps);
    if (step < warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (o.decay == LrDecay::constant) return o.lr;
    const double floor = o.lr * o.min_lr_ratio;
    const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup);
    const double progress = std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
    const double shape = o.decay == LrDecay::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
    return floor + (o.lr - floor) * shape;
}

}  // namespace llmtrain

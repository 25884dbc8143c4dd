#include "health/update_guard.h"

#include <cmath>

#include "core/log.h"

namespace llmtrain {

Verdict LossScaleGuard::judge(const StepRecord& s) {
    const bool overflow = scale_.dynamic() && std::isfinite(s.loss) && !std::isfinite(s.grad_norm);
    if (!overflow) return {};
    return {Verdict::skip, cat("fp16 gradients overflowed at loss scale ", s.loss_scale)};
}

void LossScaleGuard::after_verdict(const StepRecord& s, Verdict::Action action) {
    if (!scale_.dynamic()) return;
    const bool overflow = std::isfinite(s.loss) && !std::isfinite(s.grad_norm);
    if (action == Verdict::skip && overflow) {
        scale_.update(true);
        if (!quiet_) log_warn("fp16 gradients overflowed; update skipped, loss scale now ", scale_.scale());
    } else if (action == Verdict::apply) {
        scale_.update(false);
    }
}

}  // namespace llmtrain

#include "metrics/console_observer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/log.h"

namespace llmtrain {

namespace {
// MoE: the worst layer's expert load (max over mean), the one figure that says a router is
// collapsing; empty for a dense model.
std::string moe_field(const StepRecord& s) {
    double worst = 0;
    for (const MoeLayerRecord& layer : s.moe) worst = std::max(worst, layer.load_max_over_mean);
    return s.moe.empty() ? "" : cat(" | moe load ", fixed(worst, 2));
}
}  // namespace

void ConsoleObserver::after_step(const StepRecord& s) {
    // Why an update was skipped is told where it is decided (the loss scale, the health
    // monitor's event line); the step's line is printed whatever log_every says.
    if (s.step % log_every_ != 0 && s.step != total_steps_ && !s.skipped) return;
    log_info("step ", s.step, "/", total_steps_, " | loss ", fixed(s.loss, 4), " | lr ", scientific(s.lr), " | grad norm ", fixed(s.grad_norm, 4), " | ",
             std::lround(s.tokens_per_second), " tok/s | ", fixed(s.step_seconds * 1e3, 1), " ms", moe_field(s), s.skipped ? " | update skipped" : "");
}

void ConsoleObserver::after_eval(const EvalRecord& e) {
    log_info("eval at step ", e.step, ": val loss ", fixed(e.val_loss, 4), " (perplexity ", fixed(std::exp(e.val_loss), 2), ")");
}

}  // namespace llmtrain

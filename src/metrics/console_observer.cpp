#include "metrics/console_observer.h"

#include <cmath>

#include "core/log.h"

namespace llmtrain {

void ConsoleObserver::after_step(const StepRecord& s) {
    // Why an update was skipped is told where it is decided (the loss scale, the health
    // monitor's event line); the step's line is printed whatever log_every says.
    if (s.step % log_every_ != 0 && s.step != total_steps_ && !s.skipped) return;
    log_info("step ", s.step, "/", total_steps_, " | loss ", fixed(s.loss, 4), " | lr ", scientific(s.lr), " | grad norm ", fixed(s.grad_norm, 4), " | ",
             std::lround(s.tokens_per_second), " tok/s | ", fixed(s.step_seconds * 1e3, 1), " ms", s.skipped ? " | update skipped" : "");
}

void ConsoleObserver::after_eval(const EvalRecord& e) {
    log_info("eval at step ", e.step, ": val loss ", fixed(e.val_loss, 4), " (perplexity ", fixed(std::exp(e.val_loss), 2), ")");
}

}  // namespace llmtrain

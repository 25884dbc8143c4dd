// The trainer's second seam: before a step's update is applied, each UpdateGuard judges the
// step from values already reduced over the whole job (loss, gradient norm), so every rank
// reaches the same verdict with no collective of its own. The first verdict other than
// apply decides; every guard then hears the outcome (a loss scale grows after good steps).
#pragma once

#include <string>

#include "config/config.h"
#include "metrics/step_record.h"
#include "optim/loss_scale.h"

namespace llmtrain {

struct Verdict {
    enum Action { apply, skip, abort } action = apply;
    std::string reason;  // for skip and abort: what the guard saw
};

class UpdateGuard {
public:
    virtual ~UpdateGuard() = default;
    virtual Verdict judge(const StepRecord& step) = 0;
    // The verdict the step got in the end (from this guard or another).
    virtual void after_verdict(const StepRecord&, Verdict::Action) {}
};

// fp16: gradients that overflow at the current loss scale are expected now and then, not a
// fault: the update is skipped and the scale halved; after loss_scale_window good steps it
// doubles (optim/loss_scale.h).
class LossScaleGuard : public UpdateGuard {
public:
    LossScaleGuard(DynamicLossScale& scale, bool quiet) : scale_(scale), quiet_(quiet) {}
    Verdict judge(const StepRecord& step) override;
    void after_verdict(const StepRecord& step, Verdict::Action action) override;

private:
    DynamicLossScale& scale_;
    bool quiet_;
};

// A non-finite loss or gradient norm: abort the run (monitor.on_nonfinite = "abort") or skip
// the update ("skip").
class NonFiniteGuard : public UpdateGuard {
public:
    explicit NonFiniteGuard(NonFinitePolicy policy) : policy_(policy) {}
    Verdict judge(const StepRecord& step) override;

private:
    NonFinitePolicy policy_;
};

}  // namespace llmtrain

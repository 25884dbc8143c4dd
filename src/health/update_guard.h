// The trainer's second seam: before a step's update is applied, each UpdateGuard judges the
// step from values already reduced over the whole job (loss, gradient norm), so every rank
// reaches the same verdict with no collective of its own. The first verdict other than
// apply decides; every guard then hears the outcome (a loss scale grows after good steps).
// The trainer carries a verdict out: apply or skip the update, restore the last checkpoint
// (rollback), or stop the run (abort: exit 3; exclude_node: exit 76).
#pragma once

#include <string>

#include "config/config.h"
#include "metrics/step_record.h"
#include "optim/loss_scale.h"

namespace llmtrain {

struct Verdict {
    enum Action { apply, skip, rollback, abort, exclude_node } action = apply;
    std::string reason;  // for every action but apply: what the guard saw
};

class UpdateGuard {
public:
    virtual ~UpdateGuard() = default;
    virtual Verdict judge(const StepRecord& step) = 0;
    // The verdict the step got in the end (from this guard or another).
    virtual void after_verdict(const StepRecord&, Verdict::Action) {}
    // A factor on the scheduled learning rate from the next step on (1: none).
    virtual double lr_scale() const { return 1; }
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

}  // namespace llmtrain

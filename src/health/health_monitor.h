// Training health: the detectors and the recovery policy, plugged into the trainer as one
// UpdateGuard. Every figure it judges is already reduced over the whole job (the loss, the
// gradient norm, in which a NaN or Inf on any rank survives the sum), so every rank takes the
// same decision without a collective of its own.
//
// Detectors, in the order they are asked (the first that fires names the event):
//   nonfinite   the loss or the gradient norm is NaN or Inf;
//   loss_spike  z = (log loss - mean) / std over the logs of the last monitor.window applied
//               steps' losses, above monitor.loss_zscore (only upward: a loss that falls
//               fast is no fault);
//   grad_spike  the same for the gradient norm and monitor.grad_zscore;
//   divergence  mean(loss of the last window) > monitor.divergence_factor x mean(the window
//               before it);
//   router_collapse  a mixture-of-experts layer's busiest expert took at least
//               monitor.router_collapse_share of its tokens in each of the last
//               monitor.router_collapse_steps applied steps (a router that sends nearly every
//               token to one expert trains one expert's worth of parameters); judged from the
//               first step, policy monitor.on_router_collapse.
// The z-scores and divergence judge only after monitor.warmup_steps applied steps; a step
// that was skipped or rolled back never enters a window.
//
// Policy per kind (monitor.on_nonfinite, on_spike, on_divergence): skip the update; roll back
// to the last checkpoint (the trainer restores it and skips the data up to the offending step
// plus monitor.skip_batches); lower_lr (skip the update, multiply the learning rate by
// monitor.lr_factor from then on); abort. Escalation: the max_consecutive_skips-th skip in a
// row rolls back instead; the max_rollbacks-th rollback within rollback_window steps aborts.
//
// With monitor.rerun_on_anomaly, an event is first re-run from the step's starting state (the
// update is not applied yet, so the weights are still that state): the same numbers again make
// it real and the policy applies; other numbers are a transient fault, and the run stops with
// the rank whose partial results changed named (exit 76: restart without that node).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "metrics/step_record.h"
#include "health/update_guard.h"

namespace llmtrain {

// What a re-run of the step being judged found.
struct RerunResult {
    bool reproduced = true;   // loss, gradient norm and every rank's partial results bitwise equal
    std::string culprits;     // when not: "rank 2 (host h, gpu 0)", the ranks whose partials changed
    std::string numbers;      // the two runs' loss and gradient norm, for the record
};

// Mean and standard deviation of the values held, oldest dropped beyond capacity.
class RollingWindow {
public:
    explicit RollingWindow(size_t capacity) : capacity_(capacity) {}
    void push(double value);
    size_t size() const { return values_.size(); }
    bool full() const { return values_.size() == capacity_; }
    double mean() const;
    double stddev() const;  // population standard deviation
    // (value - mean) / stddev; the deviation is floored at 1e-6 x |mean| (and 1e-12) so that a
    // window of equal values does not make every change infinitely surprising.
    double zscore(double value) const;
    const std::deque<double>& values() const { return values_; }
    void clear() { values_.clear(); }

private:
    size_t capacity_;
    std::deque<double> values_;
};

class HealthMonitor : public UpdateGuard {
public:
    // can_roll_back: checkpoints are written (checkpoint.every_steps > 0); without them an
    // escalation to rollback aborts instead.
    HealthMonitor(const MonitorConfig& config, bool can_roll_back);

    // Re-runs the step being judged from its starting state (monitor.rerun_on_anomaly).
    void set_rerun(std::function<RerunResult(const StepRecord&)> rerun) { rerun_ = std::move(rerun); }

    Verdict judge(const StepRecord& step) override;
    void after_verdict(const StepRecord& step, Verdict::Action action) override;
    double lr_scale() const override { return lr_scale_; }

    // The event of the step just judged, once: for the trainer to complete (the data skipped)
    // and hand to the observers.
    std::optional<AnomalyRecord> take_event();

    // The state a checkpoint keeps (JSON): the windows, the counters, the learning-rate factor.
    std::string state() const;
    void restore(const std::string& state);
    // After a rollback to a checkpoint whose monitor state is `checkpoint_state` (empty: none
    // recorded): its windows come back (the steps rolled back leave them), while the rollbacks
    // counted and the learning-rate factor stay; this rollback (of offending_step) is counted.
    void rolled_back(const std::string& checkpoint_state, int64_t offending_step);

    // Steps applied since the run began (the detectors judge after monitor.warmup_steps).
    int64_t applied_steps() const { return applied_; }
    // What earlier events left in force ("learning rate x 0.1 (lower_lr), 1 rollback at step
    // 140"), for the line of a resumed run; empty when nothing.
    std::string lasting_effects() const;

private:
    struct Finding {
        std::string kind;
        double statistic = 0, threshold = 0;
        std::string detail;
        HealthAction action = HealthAction::skip;
    };
    std::optional<Finding> detect(const StepRecord& s) const;
    std::optional<Finding> router_collapse(const StepRecord& s) const;
    bool collapsed(const StepRecord& s) const;
    Verdict decide(const StepRecord& s, Finding finding);
    int64_t rollbacks_within_window(int64_t step) const;

    MonitorConfig config_;
    bool can_roll_back_;
    std::function<RerunResult(const StepRecord&)> rerun_;
    RollingWindow losses_, grad_norms_;
    RollingWindow divergence_losses_;  // the last 2 x window applied losses
    int64_t applied_ = 0;
    int64_t consecutive_skips_ = 0;
    int64_t collapsed_steps_ = 0;  // applied steps in a row with a collapsed MoE router
    std::vector<int64_t> rollback_steps_;  // the offending step of every rollback
    double lr_scale_ = 1;
    bool skip_issued_ = false;          // the step just judged was skipped by this monitor
    bool divergence_event_ = false;     // ... for divergence: its windows start afresh
    std::optional<AnomalyRecord> event_;
};

// "step 130: loss_spike (z-score 8.31 > 6): skip | ...": the one log line of an event.
std::string describe_event(const AnomalyRecord& event);

}  // namespace llmtrain

#include "health/health_monitor.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace llmtrain {

namespace {

std::string with_digits(double value, int digits) {
    if (!std::isfinite(value)) return std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf";
    return fixed(value, digits);
}

const char* key_of(const std::string& kind) {
    if (kind == "nonfinite") return "monitor.on_nonfinite";
    if (kind == "divergence") return "monitor.on_divergence";
    if (kind == "router_collapse") return "monitor.on_router_collapse";
    return "monitor.on_spike";
}

AnomalyRecord make_event(int64_t step, std::string kind, std::string action, double statistic, double threshold, std::string detail) {
    AnomalyRecord e;
    e.step = step, e.kind = std::move(kind), e.action = std::move(action);
    e.statistic = statistic, e.threshold = threshold, e.detail = std::move(detail);
    return e;
}

// Loss and gradient norm are positive with a heavy upper tail (a norm of 3x its usual size
// comes and goes in a healthy run): their z-scores are taken of the logarithm, so a spike is
// a factor above the window's geometric mean, measured in the window's own spread of factors.
double log_of(double positive) { return std::log(std::max(positive, 1e-30)); }

std::vector<double> to_vector(const RollingWindow& w) { return {w.values().begin(), w.values().end()}; }

void fill(RollingWindow& w, const nlohmann::json& values) {
    w.clear();
    for (const nlohmann::json& v : values) w.push(v.get<double>());
}

}  // namespace

void RollingWindow::push(double value) {
    values_.push_back(value);
    while (values_.size() > capacity_) values_.pop_front();
}

double RollingWindow::mean() const {
    double sum = 0;
    for (double v : values_) sum += v;
    return values_.empty() ? 0 : sum / static_cast<double>(values_.size());
}

double RollingWindow::stddev() const {
    const double m = mean();
    double sum = 0;
    for (double v : values_) sum += (v - m) * (v - m);
    return values_.empty() ? 0 : std::sqrt(sum / static_cast<double>(values_.size()));
}

double RollingWindow::zscore(double value) const {
    const double m = mean();
    return (value - m) / std::max({stddev(), 1e-6 * std::fabs(m), 1e-12});
}

HealthMonitor::HealthMonitor(const MonitorConfig& config, bool can_roll_back)
    : config_(config), can_roll_back_(can_roll_back), losses_(static_cast<size_t>(config.window)), grad_norms_(static_cast<size_t>(config.window)),
      divergence_losses_(static_cast<size_t>(2 * config.window)) {}

// The first detector that fires, or nothing. z-scores need two values in the window.
std::optional<HealthMonitor::Finding> HealthMonitor::detect(const StepRecord& s) const {
    if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
        return Finding{"nonfinite", 0, 0, cat("non-finite ", std::isfinite(s.loss) ? "gradient norm" : "loss", " (loss ", with_digits(s.loss, 4), ", grad norm ",
                                             with_digits(s.grad_norm, 4), ") on some rank"), config_.on_nonfinite};
    if (std::optional<Finding> collapse = router_collapse(s)) return collapse;
    if (applied_ < config_.warmup_steps || losses_.size() < 2) return std::nullopt;
    const auto spread = [](const RollingWindow& w) {
        return cat(" against a window geometric mean of ", with_digits(std::exp(w.mean()), 4), " (spread x", with_digits(std::exp(w.stddev()), 4), ", ", w.size(), " steps)");
    };
    const double loss_z = losses_.zscore(log_of(s.loss));
    if (loss_z > config_.loss_zscore)
        return Finding{"loss_spike", loss_z, config_.loss_zscore, cat("loss ", with_digits(s.loss, 4), spread(losses_)), config_.on_spike};
    const double grad_z = grad_norms_.zscore(log_of(s.grad_norm));
    if (grad_z > config_.grad_zscore)
        return Finding{"grad_spike", grad_z, config_.grad_zscore, cat("grad norm ", with_digits(s.grad_norm, 4), spread(grad_norms_)), config_.on_spike};
    if (!divergence_losses_.full()) return std::nullopt;
    // The windows end at this step: the oldest value leaves as this one enters.
    const auto& v = divergence_losses_.values();
    const size_t w = static_cast<size_t>(config_.window);
    double earlier = 0, later = s.loss;
    for (size_t i = 1; i <= w; ++i) earlier += v[i];
    for (size_t i = w + 1; i < v.size(); ++i) later += v[i];
    const double ratio = later / earlier;
    if (ratio > config_.divergence_factor)
        return Finding{"divergence", ratio, config_.divergence_factor, cat("mean loss of the last ", w, " steps ", with_digits(later / static_cast<double>(w), 4),
                                                                          " against ", with_digits(earlier / static_cast<double>(w), 4), " in the ", w, " before"),
                       config_.on_divergence};
    return std::nullopt;
}

bool HealthMonitor::collapsed(const StepRecord& s) const {
    return std::any_of(s.moe.begin(), s.moe.end(), [&](const MoeLayerRecord& l) { return l.top_expert_token_share >= config_.router_collapse_share; });
}

// This step collapsed too, and the steps before it: the worst layer is named.
std::optional<HealthMonitor::Finding> HealthMonitor::router_collapse(const StepRecord& s) const {
    if (!collapsed(s) || collapsed_steps_ + 1 < config_.router_collapse_steps) return std::nullopt;
    const auto worst = std::max_element(s.moe.begin(), s.moe.end(), [](const MoeLayerRecord& a, const MoeLayerRecord& b) {
        return a.top_expert_token_share < b.top_expert_token_share;
    });
    return Finding{"router_collapse", worst->top_expert_token_share, config_.router_collapse_share,
                   cat("MoE layer ", worst->layer, ": its busiest expert took ", with_digits(100 * worst->top_expert_token_share, 1), "% of the tokens (load ",
                       with_digits(worst->load_max_over_mean, 2), " x the mean), for ", collapsed_steps_ + 1, " steps in a row (monitor.router_collapse_steps = ",
                       config_.router_collapse_steps, ")"),
                   config_.on_router_collapse};
}

int64_t HealthMonitor::rollbacks_within_window(int64_t step) const {
    return std::count_if(rollback_steps_.begin(), rollback_steps_.end(), [&](int64_t at) { return step - at < config_.rollback_window; });
}

Verdict HealthMonitor::judge(const StepRecord& s) {
    skip_issued_ = divergence_event_ = false;
    event_.reset();
    std::optional<Finding> finding = detect(s);
    if (!finding) return {};
    if (rerun_) {
        const RerunResult rerun = rerun_(s);
        if (!rerun.reproduced) {
            const std::string what = cat("suspected silent data corruption on ", rerun.culprits, ": step ", s.step, " re-run from the same state gave other numbers (",
                                         rerun.numbers, "); the ", finding->kind, " was a transient fault, not the data or the optimization");
            event_ = make_event(s.step, "transient_fault", "exclude_node", finding->statistic, finding->threshold, what);
            return {Verdict::exclude_node, cat("step ", s.step, ": ", what, "; restart without that node")};
        }
        finding->detail += cat("; a re-run from the same state reproduced it bitwise (", rerun.numbers, "): a real anomaly");
    }
    return decide(s, *finding);
}

// The configured action, escalated: repeated skips roll back, repeated rollbacks abort.
Verdict HealthMonitor::decide(const StepRecord& s, Finding f) {
    HealthAction action = f.action;
    std::string why = cat(key_of(f.kind), " = \"", health_action_name(f.action), "\"");
    if ((action == HealthAction::skip || action == HealthAction::lower_lr) && consecutive_skips_ >= config_.max_consecutive_skips) {
        action = HealthAction::rollback;
        why = cat(consecutive_skips_, " steps skipped in a row already (monitor.max_consecutive_skips = ", config_.max_consecutive_skips, ")");
    }
    if (action == HealthAction::rollback && !can_roll_back_) {
        action = HealthAction::abort;
        why += "; no checkpoint to roll back to (checkpoint.every_steps = 0)";
    }
    if (action == HealthAction::rollback && rollbacks_within_window(s.step) >= config_.max_rollbacks) {
        action = HealthAction::abort;
        why = cat(config_.max_rollbacks, " rollbacks within ", config_.rollback_window, " steps already (monitor.max_rollbacks)");
    }
    event_ = make_event(s.step, f.kind, health_action_name(action), f.statistic, f.threshold, cat(f.detail, "; ", why));
    divergence_event_ = f.kind == "divergence";
    switch (action) {
        case HealthAction::skip: skip_issued_ = true; return {Verdict::skip, event_->detail};
        case HealthAction::lower_lr:
            skip_issued_ = true;
            lr_scale_ *= config_.lr_factor;
            event_->detail += cat("; learning rate x ", config_.lr_factor, " from step ", s.step + 1, " (now x ", lr_scale_, " the schedule)");
            return {Verdict::skip, event_->detail};
        case HealthAction::rollback: return {Verdict::rollback, event_->detail};
        case HealthAction::abort: break;
    }
    return {Verdict::abort, cat("step ", s.step, ": ", f.kind, ": ", event_->detail)};
}

void HealthMonitor::after_verdict(const StepRecord& s, Verdict::Action action) {
    if (divergence_event_) divergence_losses_.clear();  // judge the new regime on windows of its own
    if (action == Verdict::apply) {
        losses_.push(log_of(s.loss));
        grad_norms_.push(log_of(s.grad_norm));
        divergence_losses_.push(s.loss);
        ++applied_;
        consecutive_skips_ = 0;
        collapsed_steps_ = collapsed(s) ? collapsed_steps_ + 1 : 0;
    } else if (action == Verdict::skip && skip_issued_) {
        ++consecutive_skips_;
    }
}

std::optional<AnomalyRecord> HealthMonitor::take_event() {
    std::optional<AnomalyRecord> e = std::move(event_);
    event_.reset();
    return e;
}

std::string HealthMonitor::state() const {
    const nlohmann::ordered_json j = {{"losses", to_vector(losses_)},
                                      {"grad_norms", to_vector(grad_norms_)},
                                      {"divergence_losses", to_vector(divergence_losses_)},
                                      {"applied_steps", applied_},
                                      {"consecutive_skips", consecutive_skips_},
                                      {"rollback_steps", rollback_steps_},
                                      {"router_collapsed_steps", collapsed_steps_},
                                      {"lr_scale", lr_scale_}};
    return j.dump();
}

void HealthMonitor::restore(const std::string& state) {
    if (state.empty()) return;  // a checkpoint from before the monitor kept state: start afresh
    const nlohmann::json j = nlohmann::json::parse(state, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail(ErrorKind::data, "checkpoint manifest: the monitor state is not a JSON object");
    try {
        fill(losses_, j.at("losses"));
        fill(grad_norms_, j.at("grad_norms"));
        fill(divergence_losses_, j.at("divergence_losses"));
        applied_ = j.at("applied_steps").get<int64_t>();
        consecutive_skips_ = j.at("consecutive_skips").get<int64_t>();
        rollback_steps_ = j.at("rollback_steps").get<std::vector<int64_t>>();
        collapsed_steps_ = j.value("router_collapsed_steps", int64_t{0});  // absent before MoE
        lr_scale_ = j.at("lr_scale").get<double>();
    } catch (const std::exception& e) {
        fail(ErrorKind::data, "checkpoint manifest: the monitor state is malformed (", e.what(), ")");
    }
}

void HealthMonitor::rolled_back(const std::string& checkpoint_state, int64_t offending_step) {
    const std::vector<int64_t> rollbacks = rollback_steps_;
    const double lr_scale = lr_scale_;
    if (checkpoint_state.empty()) {
        losses_.clear(), grad_norms_.clear(), divergence_losses_.clear();
        applied_ = 0;
    } else {
        restore(checkpoint_state);
    }
    rollback_steps_ = rollbacks;
    rollback_steps_.push_back(offending_step);
    lr_scale_ = lr_scale;
    consecutive_skips_ = 0;
}

std::string HealthMonitor::lasting_effects() const {
    std::string text;
    if (lr_scale_ != 1) text = cat("learning rate x ", lr_scale_, " (lower_lr)");
    if (!rollback_steps_.empty()) {
        text += cat(text.empty() ? "" : ", ", rollback_steps_.size(), " rollback(s), of step");
        for (int64_t step : rollback_steps_) text += cat(" ", step);
    }
    return text;
}

std::string describe_event(const AnomalyRecord& e) {
    std::string line = cat("health: step ", e.step, ": ", e.kind);
    if (e.threshold != 0) line += cat(" (", with_digits(e.statistic, 2), " > ", e.threshold, ")");
    line += cat(" -> ", e.action, ": ", e.detail);
    if (e.samples_end > e.samples_begin) line += cat(" | data skipped: global samples [", e.samples_begin, ", ", e.samples_end, ")");
    return line;
}

}  // namespace llmtrain

// The health monitor's detectors, policy and escalation on hand-made step records, and its
// state's round trip through a checkpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "health/health_monitor.h"

namespace llmtrain {
namespace {

MonitorConfig small_window() {
    MonitorConfig c;
    c.window = 8;
    c.warmup_steps = 8;
    c.on_spike = HealthAction::skip;
    c.on_nonfinite = HealthAction::skip;
    c.on_divergence = HealthAction::abort;
    return c;
}

StepRecord step(int64_t n, double loss, double grad_norm = 1.0) {
    StepRecord s;
    s.step = n;
    s.loss = loss;
    s.grad_norm = grad_norm;
    return s;
}

// Judges and closes one step as the trainer does (the verdict is heard by the monitor).
Verdict run(HealthMonitor& m, const StepRecord& s) {
    const Verdict v = m.judge(s);
    m.after_verdict(s, v.action);
    return v;
}

// Noisy but steady: loss 3 +- 0.01, grad norm 1 +- 0.01.
void steady(HealthMonitor& m, int64_t from, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
        const double wiggle = ((from + i) % 3 - 1) * 0.01;
        ASSERT_EQ(run(m, step(from + i, 3 + wiggle, 1 + wiggle)).action, Verdict::apply) << "step " << from + i;
    }
}

TEST(RollingWindow, ZScore_IsTheDistanceInStandardDeviations) {
    RollingWindow w(4);
    for (double v : {1.0, 2.0, 3.0, 4.0, 5.0}) w.push(v);  // keeps 2, 3, 4, 5
    EXPECT_EQ(w.size(), 4u);
    EXPECT_DOUBLE_EQ(w.mean(), 3.5);
    EXPECT_DOUBLE_EQ(w.stddev(), std::sqrt(1.25));
    EXPECT_DOUBLE_EQ(w.zscore(3.5 + 2 * std::sqrt(1.25)), 2.0);
}

TEST(HealthMonitor, NoEventDuringWarmup_EvenForALargeLoss) {
    HealthMonitor m(small_window(), true);
    steady(m, 1, 4);
    EXPECT_EQ(run(m, step(5, 100)).action, Verdict::apply);
    EXPECT_FALSE(m.take_event());
}

TEST(HealthMonitor, LossSpike_IsSkippedAndNeverEntersTheWindow) {
    HealthMonitor m(small_window(), true);
    steady(m, 1, 10);
    const Verdict v = m.judge(step(11, 30));
    EXPECT_EQ(v.action, Verdict::skip);
    const auto event = m.take_event();
    ASSERT_TRUE(event);
    EXPECT_EQ(event->kind, "loss_spike");
    EXPECT_EQ(event->action, "skip");
    EXPECT_GT(event->statistic, 6);
    EXPECT_EQ(event->threshold, 6);
    m.after_verdict(step(11, 30), v.action);
    // Had the spike entered the window, the mean would be near 6.4 and 3.0 a low outlier;
    // a second spike of the same size is still one.
    EXPECT_EQ(m.judge(step(12, 30)).action, Verdict::skip);
}

TEST(HealthMonitor, GradNormSpike_IsDetectedWhenTheLossIsQuiet) {
    HealthMonitor m(small_window(), true);
    steady(m, 1, 10);
    EXPECT_EQ(m.judge(step(11, 3, 50)).action, Verdict::skip);
    EXPECT_EQ(m.take_event()->kind, "grad_spike");
}

TEST(HealthMonitor, FallingLoss_IsNoSpike) {
    HealthMonitor m(small_window(), true);
    for (int64_t i = 1; i <= 40; ++i) EXPECT_EQ(run(m, step(i, 10.0 / static_cast<double>(i))).action, Verdict::apply) << i;
}

TEST(HealthMonitor, NonFinite_IsJudgedFromTheFirstStep) {
    HealthMonitor m(small_window(), true);
    EXPECT_EQ(m.judge(step(1, std::numeric_limits<double>::quiet_NaN())).action, Verdict::skip);
    EXPECT_EQ(m.take_event()->kind, "nonfinite");
    MonitorConfig aborting = small_window();
    aborting.on_nonfinite = HealthAction::abort;
    HealthMonitor a(aborting, true);
    const Verdict v = a.judge(step(1, 3, std::numeric_limits<double>::infinity()));
    EXPECT_EQ(v.action, Verdict::abort);
    EXPECT_NE(v.reason.find("non-finite gradient norm"), std::string::npos) << v.reason;
}

TEST(HealthMonitor, Divergence_ComparesTheLastWindowWithTheOneBefore) {
    MonitorConfig c = small_window();
    c.loss_zscore = c.grad_zscore = 1e6;  // the divergence detector alone
    HealthMonitor m(c, true);
    steady(m, 1, 16);
    int64_t n = 17;
    Verdict v;
    // The loss climbs 0.5 per step: after a few steps the last window's mean passes 1.5 x 3.
    for (; n < 40 && (v = run(m, step(n, 3 + 0.5 * static_cast<double>(n - 16)))).action == Verdict::apply; ++n) {}
    EXPECT_EQ(v.action, Verdict::abort);
    EXPECT_GT(n, 17);
    EXPECT_LT(n, 40);
    EXPECT_NE(v.reason.find("divergence"), std::string::npos) << v.reason;
}

TEST(HealthMonitor, LowerLr_SkipsAndMultipliesTheLearningRate) {
    MonitorConfig c = small_window();
    c.on_spike = HealthAction::lower_lr;
    c.lr_factor = 0.25;
    HealthMonitor m(c, true);
    steady(m, 1, 10);
    EXPECT_EQ(run(m, step(11, 30)).action, Verdict::skip);
    EXPECT_EQ(m.take_event()->action, "lower_lr");
    EXPECT_DOUBLE_EQ(m.lr_scale(), 0.25);
}

TEST(HealthMonitor, ConsecutiveSkips_EscalateToRollback_AndRollbacksToAbort) {
    MonitorConfig c = small_window();
    c.max_consecutive_skips = 2;
    c.max_rollbacks = 1;
    c.rollback_window = 100;
    HealthMonitor m(c, true);
    steady(m, 1, 10);
    const std::string checkpoint = m.state();
    EXPECT_EQ(run(m, step(11, 30)).action, Verdict::skip);
    EXPECT_EQ(run(m, step(12, 30)).action, Verdict::skip);
    EXPECT_EQ(m.judge(step(13, 30)).action, Verdict::rollback);
    EXPECT_NE(m.take_event()->detail.find("2 steps skipped in a row"), std::string::npos);
    m.rolled_back(checkpoint, 13);
    EXPECT_EQ(run(m, step(11, 30)).action, Verdict::skip);
    EXPECT_EQ(run(m, step(12, 30)).action, Verdict::skip);
    const Verdict v = m.judge(step(13, 30));
    EXPECT_EQ(v.action, Verdict::abort);
    EXPECT_NE(v.reason.find("1 rollbacks within 100 steps"), std::string::npos) << v.reason;
}

TEST(HealthMonitor, RollbackWithoutCheckpoints_Aborts) {
    MonitorConfig c = small_window();
    c.on_spike = HealthAction::rollback;
    HealthMonitor m(c, false);
    steady(m, 1, 10);
    const Verdict v = m.judge(step(11, 30));
    EXPECT_EQ(v.action, Verdict::abort);
    EXPECT_NE(v.reason.find("no checkpoint to roll back to"), std::string::npos) << v.reason;
}

TEST(HealthMonitor, Rerun_SameNumbersApplyThePolicy_OtherNumbersNameTheRank) {
    HealthMonitor real(small_window(), true);
    real.set_rerun([](const StepRecord&) { return RerunResult{true, "", "loss 30 then 30"}; });
    steady(real, 1, 10);
    EXPECT_EQ(real.judge(step(11, 30)).action, Verdict::skip);
    EXPECT_NE(real.take_event()->detail.find("reproduced it bitwise"), std::string::npos);

    HealthMonitor faulty(small_window(), true);
    faulty.set_rerun([](const StepRecord&) { return RerunResult{false, "rank 2 (host h, cpu)", "loss 30 then 3"}; });
    steady(faulty, 1, 10);
    const Verdict v = faulty.judge(step(11, 30));
    EXPECT_EQ(v.action, Verdict::exclude_node);
    EXPECT_NE(v.reason.find("suspected silent data corruption on rank 2 (host h, cpu)"), std::string::npos) << v.reason;
    const auto event = faulty.take_event();
    EXPECT_EQ(event->kind, "transient_fault");
    EXPECT_EQ(event->action, "exclude_node");
}

TEST(HealthMonitor, State_RoundTripsBitwise) {
    HealthMonitor a(small_window(), true);
    steady(a, 1, 12);
    HealthMonitor b(small_window(), true);
    b.restore(a.state());
    EXPECT_EQ(b.state(), a.state());
    EXPECT_EQ(b.applied_steps(), 12);
    EXPECT_EQ(run(a, step(13, 3.3)).action, run(b, step(13, 3.3)).action);
}

// The detectors' cost per step at the default window (128): a figure for the README.
TEST(HealthMonitor, CostPerStep_IsMicroseconds) {
    HealthMonitor m(MonitorConfig{}, true);
    constexpr int kSteps = 20000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; i <= kSteps; ++i) run(m, step(i, 3 + 0.01 * (i % 7), 1 + 0.01 * (i % 5)));
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kSteps;
    std::printf("health monitor: %.2f us per step (window 128)\n", us);
    EXPECT_LT(us, 1000.0);
}

}  // namespace
}  // namespace llmtrain

namespace llmtrain {
namespace {
// A step whose MoE layers 1 and 3 sent these shares of their tokens to their busiest expert.
StepRecord moe_step(int64_t n, double share_1, double share_3) {
    StepRecord s = step(n, 3.0);
    s.moe = {{.layer = 1, .load_max_over_mean = share_1 * 4, .dropped_fraction = 0, .top_expert_token_share = share_1},
             {.layer = 3, .load_max_over_mean = share_3 * 4, .dropped_fraction = 0, .top_expert_token_share = share_3}};
    return s;
}
}  // namespace

// A router is collapsed when one layer's busiest expert takes monitor.router_collapse_share of
// its tokens for monitor.router_collapse_steps steps in a row: the last of them is the event,
// named after the layer, with its policy; a balanced step in between starts the count again.
TEST(HealthMonitor, RouterCollapsedForTheConfiguredSteps_IsAnEventNamingTheLayer) {
    MonitorConfig c = small_window();
    c.router_collapse_share = 0.9;
    c.router_collapse_steps = 4;
    c.on_router_collapse = HealthAction::abort;
    HealthMonitor m(c, false);
    for (int64_t n = 1; n <= 3; ++n) ASSERT_EQ(run(m, moe_step(n, 0.5, 0.95)).action, Verdict::apply) << "step " << n;
    ASSERT_EQ(run(m, moe_step(4, 0.5, 0.3)).action, Verdict::apply);  // balanced: the count starts again
    for (int64_t n = 5; n <= 7; ++n) ASSERT_EQ(run(m, moe_step(n, 0.92, 0.3)).action, Verdict::apply) << "step " << n;
    const Verdict v = run(m, moe_step(8, 0.97, 0.3));
    EXPECT_EQ(v.action, Verdict::abort);
    const std::optional<AnomalyRecord> e = m.take_event();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->kind, "router_collapse");
    EXPECT_DOUBLE_EQ(e->statistic, 0.97);
    EXPECT_NE(e->detail.find("MoE layer 1: its busiest expert took 97.0% of the tokens"), std::string::npos) << e->detail;
    EXPECT_NE(e->detail.find("monitor.on_router_collapse = \"abort\""), std::string::npos) << e->detail;
}

// The count is training state: a resumed run goes on counting where the checkpoint stopped.
TEST(HealthMonitor, RouterCollapseCount_IsKeptInTheCheckpointState) {
    MonitorConfig c = small_window();
    c.router_collapse_steps = 3;
    c.on_router_collapse = HealthAction::skip;
    HealthMonitor m(c, false);
    for (int64_t n = 1; n <= 2; ++n) ASSERT_EQ(run(m, moe_step(n, 1.0, 0.2)).action, Verdict::apply);
    HealthMonitor resumed(c, false);
    resumed.restore(m.state());
    EXPECT_EQ(run(resumed, moe_step(3, 1.0, 0.2)).action, Verdict::skip);
    HealthMonitor fresh(c, false);
    EXPECT_EQ(run(fresh, moe_step(3, 1.0, 0.2)).action, Verdict::apply);
}

// Dense steps carry no MoE layers: never a collapse.
TEST(HealthMonitor, DenseSteps_NeverCollapse) {
    MonitorConfig c = small_window();
    c.router_collapse_steps = 1;
    HealthMonitor m(c, false);
    steady(m, 1, 20);
}

}  // namespace llmtrain

// `plan`'s goodput model (src/plan/goodput.h) on a case small enough to compute by hand:
//   goodput = (k T / C) x (1 - (R + s + D + C / 2) / M),  C = k T' + s + max(0, d - k T'),
//   D = max(d, min(b, k) T')
// Every expected figure below is written out with its arithmetic; a change of the formula
// or of what plan_goodput feeds it (which stall, which delay, which restart) fails here.
#include <gtest/gtest.h>

#include "config/config.h"
#include "parallel/context.h"
#include "plan/goodput.h"

using namespace llmtrain;

namespace {

// 8 nodes of 8 GPUs, a node failing every 240 h: job MTBF M = 240 h / 8 = 30 h = 108,000 s.
// Relaunch 60 s; a snapshot's piece goes to a peer at 45 GB/s.
Cluster eight_nodes() {
    Cluster c;
    c.kind = ClusterKind::gpu;
    c.devices_per_node = 8;
    c.nodes = 8;
    c.inter_node.gbps = 45;
    c.node_mtbf_hours = 240;
    c.launch_seconds = 60;
    c.storage = Storage{};
    return c;
}

// A checkpoint of 4.5 GB per rank: the host copy stalls the loop s = 1 s, the background
// write takes d = 200 s, a resume from the shared storage 10 s of which 0.5 s the dp exchange.
CheckpointTime checkpoint_times() {
    CheckpointTime t;
    t.bytes_per_rank = 4.5e9;
    t.blocked_seconds = 1;
    t.background_seconds = 200;
    t.resume_seconds = 10;
    t.exchange_seconds = 0.5;
    return t;
}

// Persistent checkpoints every 100 steps, asynchronous; snapshots every 50 steps with one
// replica; a lost node noticed after parallel.timeout_seconds = 300 s. 64 ranks: 8 nodes.
GoodputPlan hand_case() {
    const Config config = load_config("configs/tiny.toml",
                                      {"checkpoint.every_steps=100", "checkpoint.async=true", "checkpoint.local.every_steps=50",
                                       "checkpoint.local.replicas=1", "parallel.timeout_seconds=300"},
                                      DataFiles::unchecked);
    const Mesh mesh = make_mesh(config.parallel, 64);
    return plan_goodput(config, mesh, eight_nodes(), checkpoint_times(), /*step_seconds=*/9.99);
}

constexpr double kM = 108000;

}  // namespace

TEST(PlanGoodput, JobMtbfIsTheNodeMtbfOverTheNodes) {
    const GoodputPlan g = hand_case();
    EXPECT_EQ(g.failures.nodes, 8);
    EXPECT_DOUBLE_EQ(g.failures.job_mtbf_seconds, kM);  // 240 h x 3600 / 8
    EXPECT_DOUBLE_EQ(g.failures.detection_seconds + g.failures.launch_seconds, 360);
    EXPECT_FALSE(g.failures.launch_assumed);
}

TEST(PlanGoodput, PersistentCheckpointsOnlyByHand) {
    const GoodputPlan g = hand_case();
    ASSERT_TRUE(g.persistent_only);
    const GoodputAt& a = *g.persistent_only;
    // s = 1 (host copy), d = 200 (background write), committed at the boundary after it:
    // b = ceil(200 / 9.99) = ceil(20.02) = 21, D = max(200, 21 x 9.99) = 209.79 s.
    // R = 300 + 60 + 10 = 370 s. T = 9.99, k = 100: k T = 999 s > d, no wait; C = 999 + 1 = 1000 s.
    EXPECT_EQ(g.persistent.boundaries, 21);
    EXPECT_DOUBLE_EQ(a.cycle_seconds, 1000);
    EXPECT_DOUBLE_EQ(a.step_share, 0.999);  // 999 / 1000
    EXPECT_DOUBLE_EQ(a.restart_seconds, 370);
    EXPECT_NEAR(a.restorable_after_seconds, 209.79, 1e-9);
    EXPECT_NEAR(a.lost_work_seconds, 710.79, 1e-9);  // C/2 + s + D = 500 + 1 + 209.79
    // 0.999 x (1 - (370 + 710.79) / 108000) = 0.999 x 0.98999269 = 0.98900269
    EXPECT_NEAR(a.goodput, 0.999 * (1 - 1080.79 / 108000), 1e-12);
    EXPECT_NEAR(a.goodput, 0.98900269, 1e-8);
}

TEST(PlanGoodput, WithLocalSnapshotsByHand) {
    const GoodputPlan g = hand_case();
    ASSERT_TRUE(g.local_survives_node_loss);
    ASSERT_TRUE(g.with_local);
    const GoodputAt& b = *g.with_local;
    // The persistent checkpoints stall 1 s per 100 steps beside the snapshots: T' = 9.99 + 0.01 = 10.
    // Snapshot: s = 1 (the same host copy); d = 1 (into node-local memory at the host copy's
    // rate) + 1 replica x (4.5 GB / 45 GB/s = 0.1 s sent + 1 s stored) = 2.1 s; its boundaries:
    // ceil(1 / 10) = 1 to write, 4.5e9 / 64 MiB = 67.06: 68 messages, 16 per boundary: 5, and
    // 1 to store: b = 7, D = max(2.1, 7 x 10) = 70 s.
    // R = 300 + 60 + 0.1 (the lost node's file from its peer) + 2 x 1 (verify, load from
    // node-local memory) + 0.5 (dp exchange) = 362.6 s.
    // k = 50: C = 50 x 10 + 1 = 501 s, of which 50 x 9.99 = 499.5 s are steps.
    ASSERT_TRUE(g.local);
    EXPECT_EQ(g.local->boundaries, 7);
    EXPECT_NEAR(g.local->work_seconds, 2.1, 1e-12);
    EXPECT_NEAR(b.cycle_seconds, 501, 1e-9);
    EXPECT_NEAR(b.step_share, 499.5 / 501, 1e-12);
    EXPECT_NEAR(b.restart_seconds, 362.6, 1e-9);
    EXPECT_NEAR(b.restorable_after_seconds, 70, 1e-9);
    EXPECT_NEAR(b.lost_work_seconds, 321.5, 1e-9);  // 501/2 + 1 + 70
    // (499.5 / 501) x (1 - (362.6 + 321.5) / 108000) = 0.99700599 x 0.99366574 = 0.99069069
    EXPECT_NEAR(b.goodput, 499.5 / 501 * (1 - 684.1 / 108000), 1e-12);
    EXPECT_NEAR(b.goodput, 0.99069069, 1e-8);
    EXPECT_GT(b.goodput, g.persistent_only->goodput);
}

TEST(PlanGoodput, BestIntervalsByHand) {
    const GoodputPlan g = hand_case();
    // Persistent: from b = 21 steps on, D = 209.79: x* = sqrt(2 s (M - R - D - s)) - s
    // = sqrt(2 x 107419.21) - 1 = 462.51 s, 46.3 steps: 46 (above b; below it every save
    // waits, ceil(200 / 9.99) = 21 being where waiting stops). Young: sqrt(2 x 1 x 108000) = 464.76 s.
    EXPECT_EQ(g.persistent_best.every_steps, 46);
    EXPECT_NEAR(g.persistent_young_daly_seconds, 464.7580015, 1e-6);
    // Snapshots, T' = 10: from b = 7 on, D = 70: x* = sqrt(2 x (108000 - 362.6 - 70 - 1)) - 1
    // = sqrt(215132.8) - 1 = 462.83 s, 46 steps. Below b, D = x: x* = sqrt(1 + (108000 - 364.1)
    // / 1.5) - 1 = 266.9 s, beyond b, so that range's best is its end, 6 steps, lower.
    ASSERT_TRUE(g.local_best);
    EXPECT_EQ(g.local_best->every_steps, 46);
    // At k = 46: C = 46 x 10 + 1 = 461 s; (459.54 / 461) x (1 - (362.6 + 230.5 + 1 + 70) / 108000)
    EXPECT_NEAR(g.local_best->goodput, 459.54 / 461 * (1 - 664.1 / 108000), 1e-12);
}

TEST(PlanGoodput, TheBestIntervalBeatsEveryOther) {
    const GoodputPlan g = hand_case();
    for (const bool local : {false, true}) {
        const SaveCadence base = local ? *g.local : g.persistent;
        const double other = local ? 0.01 : 0;  // the persistent checkpoints' stall per step beside snapshots
        const int64_t best = local ? g.local_best->every_steps : g.persistent_best.every_steps;
        const auto at = [&](int64_t k) {
            SaveCadence p = base;
            p.every_steps = k;
            return goodput_at(g.step_seconds, other, p, kM).goodput;
        };
        for (int64_t k = 1; k <= 2000; ++k)
            if (k != best) EXPECT_GT(at(best), at(k)) << (local ? "snapshots" : "checkpoints") << " every " << k << " steps";
    }
}

// A save due while the one before is still being written waits for it: k = 10, k T = 99.9 s
// against d = 200 s, w = 100.1 s, C = 99.9 + 1 + 100.1 = 201 s; D = max(200, 10 x 9.99) = 200;
// goodput = (99.9 / 201) x (1 - (370 + 1 + 200 + 100.5) / 108000).
TEST(PlanGoodput, ASaveWaitsForTheOneBefore) {
    SaveCadence p = hand_case().persistent;
    p.every_steps = 10;
    const GoodputAt a = goodput_at(9.99, 0, p, kM);
    EXPECT_NEAR(a.cycle_seconds, 201, 1e-9);
    EXPECT_NEAR(a.restorable_after_seconds, 200, 1e-9);
    EXPECT_NEAR(a.goodput, 99.9 / 201 * (1 - 671.5 / 108000), 1e-12);
    // The best interval then is at least d: a shorter one only waits longer.
    SaveCadence slow = p;
    slow.stall_seconds = 0.01;  // x* = sqrt(2 x 0.01 x (108000 - 370 - 209.79 - 0.01)) - 0.01 = 46.3 s < d = 200 s
    const int64_t best = best_every_steps(9.99, 0, slow, kM);
    EXPECT_EQ(best, 21);  // ceil(200 / 9.99): the first interval that does not wait
}

// Without a replica a node's loss takes its snapshots with it: failures restore from the
// persistent checkpoint (R = 370, d = 200 and b = 21 as above), the snapshots adding their
// stall, 1 s per 50 steps: T' = 9.99 + 0.02 = 10.01, C = 100 x 10.01 + 1 = 1002 s, steps 999 s,
// D = max(200, 21 x 10.01) = 210.21 s;
// goodput = (999 / 1002) x (1 - (370 + 501 + 1 + 210.21) / 108000).
TEST(PlanGoodput, SnapshotsWithoutReplicaRestoreFromThePersistentCheckpoint) {
    const Config config = load_config("configs/tiny.toml",
                                      {"checkpoint.every_steps=100", "checkpoint.local.every_steps=50", "checkpoint.local.replicas=0",
                                       "parallel.timeout_seconds=300"},
                                      DataFiles::unchecked);
    const GoodputPlan g = plan_goodput(config, make_mesh(config.parallel, 64), eight_nodes(), checkpoint_times(), 9.99);
    EXPECT_FALSE(g.local_survives_node_loss);
    EXPECT_FALSE(g.local_best);
    ASSERT_TRUE(g.with_local);
    EXPECT_NEAR(g.with_local->goodput, 999.0 / 1002 * (1 - 1082.21 / 108000), 1e-12);
}

#include "plan/goodput.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace llmtrain {

double stall_per_save(const SaveCadence& save, double loop_seconds_per_step) {
    const double between_saves = static_cast<double>(save.every_steps) * loop_seconds_per_step;
    return save.stall_seconds + std::max(0.0, save.work_seconds - between_saves);
}

namespace {

// D = max(d, min(b, k) T'): restorable once its work is done and its boundaries passed, or
// at once when the next save falls due first.
double restorable_after(const SaveCadence& save, double loop_seconds_per_step) {
    const int64_t boundaries = std::min(save.boundaries, save.every_steps);
    return std::max(save.work_seconds, static_cast<double>(boundaries) * loop_seconds_per_step);
}

}  // namespace

GoodputAt goodput_at(double step_seconds, double other_stall_per_step, const SaveCadence& restored, double job_mtbf_seconds) {
    const double k = static_cast<double>(restored.every_steps);
    const double loop_seconds_per_step = step_seconds + other_stall_per_step;  // T'
    GoodputAt at;
    at.every_steps = restored.every_steps;
    at.cycle_seconds = k * loop_seconds_per_step + stall_per_save(restored, loop_seconds_per_step);  // C = k T' + s + w
    at.step_share = k * step_seconds / at.cycle_seconds;
    at.restart_seconds = restored.restart_seconds;
    at.restorable_after_seconds = restorable_after(restored, loop_seconds_per_step);
    at.lost_work_seconds = at.cycle_seconds / 2 + restored.stall_seconds + at.restorable_after_seconds;  // W = C/2 + s + D
    at.goodput = at.step_share * std::max(0.0, 1 - (at.restart_seconds + at.lost_work_seconds) / job_mtbf_seconds);
    return at;
}

namespace {

// The maximum of x / (x + s) (1 - (c + q x) / M): x* = sqrt(s^2 + s (M - c) / q) - s; 0 where
// M <= c (failures outpace any interval).
double best_x(double s, double c, double q, double M) {
    const double room = (M - c) / q;
    return room > 0 ? std::sqrt(s * s + s * room) - s : 0;
}

}  // namespace

int64_t best_every_steps(double step_seconds, double other_stall_per_step, const SaveCadence& restored, double job_mtbf_seconds) {
    const double loop = step_seconds + other_stall_per_step, s = restored.stall_seconds, R = restored.restart_seconds, M = job_mtbf_seconds;
    const double d = restored.work_seconds;
    const double D_above = std::max(d, static_cast<double>(restored.boundaries) * loop);  // D from b on
    const double x_below = best_x(s, R + 1.5 * s, 1.5, M);                                // d <= x < b T': D = x
    const double x_above = best_x(s, R + 1.5 * s + D_above, 0.5, M);                     // x >= b T'
    const double no_wait = std::ceil(d / loop), b = static_cast<double>(restored.boundaries);
    // Each range's optimum in whole steps, and the ends of the ranges.
    const double candidates[] = {1, no_wait - 1, no_wait, b - 1, b, std::floor(x_below / loop), std::ceil(x_below / loop),
                                 std::floor(x_above / loop), std::ceil(x_above / loop)};
    int64_t best = 1;
    double best_goodput = -1;
    for (const double steps : candidates) {
        SaveCadence at = restored;
        at.every_steps = static_cast<int64_t>(std::clamp(steps, 1.0, 1e15));
        const double goodput = goodput_at(step_seconds, other_stall_per_step, at, M).goodput;
        if (goodput > best_goodput || (goodput == best_goodput && at.every_steps < best)) best_goodput = goodput, best = at.every_steps;
    }
    return best;
}

double young_daly_seconds(double stall_seconds, double job_mtbf_seconds) { return std::sqrt(2 * stall_seconds * job_mtbf_seconds); }

namespace {

FailureModel failure_model(const Config& config, const Mesh& mesh, const Cluster& cluster) {
    if (!(cluster.node_mtbf_hours > 0))
        fail(ErrorKind::config, "plan: goodput needs a node MTBF: --mtbf-hours H, or node.mtbf_hours in '", cluster.source_path, "'");
    FailureModel f;
    f.node_mtbf_hours = cluster.node_mtbf_hours;
    f.nodes = planned_nodes(mesh, cluster);
    f.job_mtbf_seconds = f.node_mtbf_hours * 3600 / f.nodes;  // M = node MTBF / nodes
    f.detection_seconds = config.parallel.timeout_seconds;
    f.launch_assumed = !(cluster.launch_seconds > 0);
    f.launch_seconds = f.launch_assumed ? kAssumedLaunchSeconds : cluster.launch_seconds;
    return f;
}

// An asynchronous checkpoint stalls the loop for the host copy and is restorable once written
// in the background and committed at the next step boundary; a synchronous one stalls it for
// both. A restart reads it back from the shared storage (CheckpointTime::resume_seconds:
// verification, load, dp exchange).
SaveCadence persistent_cadence(const Config& config, const CheckpointTime& checkpoint, const FailureModel& f, double step_seconds) {
    const bool async = config.checkpoint.async;
    SaveCadence p;
    p.every_steps = config.checkpoint.every_steps;
    p.stall_seconds = async ? checkpoint.blocked_seconds : checkpoint.blocked_seconds + checkpoint.background_seconds;
    p.work_seconds = async ? checkpoint.background_seconds : 0;
    // The boundary after the write agrees it is written and commits it.
    p.boundaries = async ? static_cast<int64_t>(std::ceil(p.work_seconds / step_seconds)) : 0;
    p.restart_seconds = f.detection_seconds + f.launch_seconds + checkpoint.resume_seconds;
    return p;
}

// How checkpoint/local_snapshots.cpp sends a snapshot's file to a peer: in messages of 64 MiB,
// at most 16 (1 GiB) in flight per peer, posted at step boundaries (kept in step with that file).
constexpr double kSnapshotMessageBytes = 64.0 * 1024 * 1024;
constexpr double kSnapshotMessagesPerBoundary = 16;

// A snapshot is the rank's checkpoint share: the same host copy stalls the loop. Its work: the
// file written into node-local memory (assumed at the host copy's rate) with the checkpoint's
// checksum passes (Fletcher32 per chunk, XXH64 over the file: checksum_gbps), sent to `replicas`
// peers one after another at the rank's inter-node bus bandwidth, and the copies received
// stored (as many, at the host copy's rate). Its boundaries: the one after the write starts
// the replication, each later one posts 16 messages per peer, the one after the last stores.
// A restart reads it twice from node-local memory (verification, load: at the host copy's
// rate, checking the same checksums), after the lost node's replacement fetched its ranks' files from a peer over the
// inter-node link; the dp exchange follows as after any load.
SaveCadence local_cadence(const Config& config, const Cluster& cluster, const CheckpointTime& checkpoint, const FailureModel& f, double loop_seconds_per_step) {
    const LocalSnapshotConfig& local = config.checkpoint.local;
    const int64_t holders = std::min<int64_t>(local.replicas, f.nodes - 1);  // each on another node
    const double replicas = static_cast<double>(holders);
    const double host_copy = checkpoint.blocked_seconds;
    const double peer_send = checkpoint.bytes_per_rank / (cluster.inter_node.gbps * 1e9);
    const double messages = std::ceil(checkpoint.bytes_per_rank / kSnapshotMessageBytes);
    SaveCadence l;
    l.every_steps = local.every_steps;
    l.stall_seconds = host_copy;
    const double write = host_copy + checkpoint.checksum_seconds;
    l.work_seconds = write + replicas * (peer_send + host_copy);
    l.boundaries = holders == 0 ? static_cast<int64_t>(std::ceil(write / loop_seconds_per_step))
                                       : static_cast<int64_t>(std::ceil(write / loop_seconds_per_step) + std::ceil(messages / kSnapshotMessagesPerBoundary) + 1);
    l.restart_seconds = f.detection_seconds + f.launch_seconds + peer_send + 2 * host_copy + checkpoint.checksum_seconds + checkpoint.exchange_seconds;
    return l;
}

// The stall a save kind adds per step on average (T' - T), 0 where it is not taken.
double stall_share_per_step(const SaveCadence& save, double step_seconds) {
    return save.every_steps > 0 ? stall_per_save(save, step_seconds) / static_cast<double>(save.every_steps) : 0;
}

GoodputAt at_best(double step_seconds, double other_stall_per_step, SaveCadence restored, double job_mtbf_seconds) {
    restored.every_steps = best_every_steps(step_seconds, other_stall_per_step, restored, job_mtbf_seconds);
    return goodput_at(step_seconds, other_stall_per_step, restored, job_mtbf_seconds);
}

// With snapshots a failure restores from the newest snapshot, persistent checkpoints stalling
// the loop beside them; where the lost node's snapshots had no copy elsewhere (no replica, or
// a single node) it restores from the persistent checkpoint, the snapshots only stalling.
void add_local_snapshots(GoodputPlan& g, const SaveCadence& local, int64_t replicas) {
    const double T = g.step_seconds, M = g.failures.job_mtbf_seconds;
    g.local = local;
    g.local_survives_node_loss = replicas >= 1 && g.failures.nodes > 1;
    g.local_young_daly_seconds = young_daly_seconds(local.stall_seconds, M);
    if (g.local_survives_node_loss) {
        const double persistent_stall = stall_share_per_step(g.persistent, T);
        g.with_local = goodput_at(T, persistent_stall, local, M);
        g.local_best = at_best(T, persistent_stall, local, M);
    } else if (g.persistent.every_steps > 0) {
        g.with_local = goodput_at(T, stall_share_per_step(local, T), g.persistent, M);
    }
}

}  // namespace

GoodputPlan plan_goodput(const Config& config, const Mesh& mesh, const Cluster& cluster, const CheckpointTime& checkpoint, double step_seconds) {
    GoodputPlan g;
    g.failures = failure_model(config, mesh, cluster);
    g.step_seconds = step_seconds;
    const double M = g.failures.job_mtbf_seconds;
    g.persistent = persistent_cadence(config, checkpoint, g.failures, step_seconds);
    if (g.persistent.every_steps > 0) g.persistent_only = goodput_at(step_seconds, 0, g.persistent, M);
    g.persistent_best = at_best(step_seconds, 0, g.persistent, M);
    g.persistent_young_daly_seconds = young_daly_seconds(g.persistent.stall_seconds, M);
    if (config.checkpoint.local.every_steps > 0) {
        const double loop_seconds_per_step = step_seconds + stall_share_per_step(g.persistent, step_seconds);
        add_local_snapshots(g, local_cadence(config, cluster, checkpoint, g.failures, loop_seconds_per_step), config.checkpoint.local.replicas);
    }
    return g;
}

NodeLocalSnapshots plan_node_local_snapshots(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters) {
    const LocalSnapshotConfig& local = config.checkpoint.local;
    NodeLocalSnapshots n;
    n.ranks_per_node = std::min(planned_ranks_per_node(mesh, cluster), mesh.world_size());
    n.bytes_per_rank = planned_checkpoint_bytes(config, parameters) / mesh.world_size();
    n.replicas = std::min<int64_t>(local.replicas, planned_nodes(mesh, cluster) - 1);  // each on another node
    n.keep = local.keep;
    const double own = n.ranks_per_node * n.bytes_per_rank;
    n.bytes_per_snapshot = own * static_cast<double>(1 + n.replicas);
    n.bytes_kept = n.bytes_per_snapshot * static_cast<double>(n.keep);
    n.bytes_peak = n.bytes_per_snapshot * static_cast<double>(n.keep + 1);
    n.buffer_bytes = own * static_cast<double>(2 + n.replicas);
    n.host_memory_bytes = cluster.host_memory_gb * 1e9;
    n.replica_bytes_per_node = own * static_cast<double>(n.replicas);
    n.replica_seconds = static_cast<double>(n.replicas) * n.bytes_per_rank / (cluster.inter_node.gbps * 1e9);
    return n;
}

}  // namespace llmtrain

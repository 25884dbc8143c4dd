// Goodput: the expected share of a run's wall time spent on steps that count, when nodes
// fail; and what node-local snapshots (checkpoint.local) hold in each node's memory.
//
// The model, first order (Young 1974, Daly 2006), for one kind of save restored from:
//   T     the step time (the plan's prediction)
//   T'    T plus the stall other saves add per step on average (persistent checkpoints taken
//         beside node-local snapshots: their stall per save / their interval)
//   k     steps between saves of the kind restored from
//   s     the stall per save: the step loop blocked for the copy of the rank's share into host
//         memory (a synchronous checkpoint: and its write)
//   d     after the stall, the seconds the save's work takes where nothing waits for the step
//         loop: an asynchronous checkpoint's background write; a snapshot's write into
//         node-local memory, its replicas' sends to peers on other nodes and their stores
//   b     the step boundaries it needs: the trainer moves a save in flight on only at step
//         boundaries. A checkpoint: the boundary after its write agrees it is written and
//         commits it, b = ceil(d / T'). A snapshot (checkpoint/local_snapshots.cpp): the
//         boundary after its write starts the replication, each later one posts at most 4
//         messages of 64 MiB per peer, and the one after the last stores the copies,
//         b = ceil(write / T') + ceil(messages / 4) + 1
//   D     after the stall, until the save can be restored from: D = max(d, min(b, k) T'): a
//         save falling due before the one in flight is restorable finishes it first, at once
//   w     the wait for the save before it (at most one is in flight): w = max(0, d - k T')
//   C     a save cycle in wall time: C = k T' + s + w
//   R     the restart after a failure: the failure noticed (at the latest when a collective
//         has waited parallel.timeout_seconds), every rank relaunched and its communicators
//         set up (launch_seconds), the state loaded
//   M     the job's MTBF: node MTBF / nodes (independent nodes)
// A failure at a time uniform in the cycle (exponential failures are memoryless) loses the
// wall time back to the state of the newest save it can restore from: t since the last save's
// state was taken, plus the whole cycle C when t < s + D (that save not yet restorable);
// on average W = C / 2 + s + D. Each failure costs R + W of wall time and failures come
// every M on average, so a share (R + W) / M of the wall time is lost; of the rest, k T of
// every C seconds are steps. Hence
//   goodput = (k T / C) x (1 - (R + s + D + C / 2) / M)
// valid while failures are rare against a cycle and a restart (one failure at a time: none
// during a restart, and never two nodes at once, so a snapshot's replica on another node
// survives the node it copies). Not counted: the save's traffic slowing the steps, the
// storage's capacity and its other users, a failure during the save.
//
// The best interval, over x = k T' in three ranges. Below d every save waits for the one
// before (C = s + d, W the same whatever k): goodput grows with k. From d to b T', D = x; from
// b T' on, D = max(d, b T'). In either, goodput is (T / T') x / (x + s) (1 - (c + q x) / M),
// whose logarithm is concave in x with its maximum where x^2 + 2 s x = s (M - c) / q:
//   x* = sqrt(s^2 + s (M - c) / q) - s,
// c = R + 3 s / 2, q = 3 / 2 below b T'; c = R + 3 s / 2 + D, q = 1 / 2 above, where
//   x* = sqrt(2 s (M - R - D - s)) - s,
// Young's sqrt(2 s M) when s, R and D are small against M. The best k is the best of each
// range's optimum (the whole steps either side) and its ends.
#pragma once

#include <cstdint>
#include <optional>

#include "config/config.h"
#include "parallel/mesh.h"
#include "plan/cluster.h"
#include "plan/step_model.h"

namespace llmtrain {

// One kind of save as the model sees it (symbols above).
struct SaveCadence {
    int64_t every_steps = 0;               // k; 0: none taken
    double stall_seconds = 0;              // s
    double work_seconds = 0;               // d
    int64_t boundaries = 0;                // b; 0: restorable once its work is done
    double restart_seconds = 0;            // R, restoring from this kind
};

// The model at one interval.
struct GoodputAt {
    int64_t every_steps = 0;         // k
    double cycle_seconds = 0;        // C
    double step_share = 0;           // k T / C: the share of the time between failures in steps
    double restart_seconds = 0;      // R
    double restorable_after_seconds = 0;  // D
    double lost_work_seconds = 0;    // W = C / 2 + s + D
    double goodput = 0;              // clamped at 0 where failures outpace progress
};

// The stall of one save including its wait for the save before: s + max(0, d - k T'), with
// T' = loop_seconds_per_step.
double stall_per_save(const SaveCadence& save, double loop_seconds_per_step);
// goodput = (k T / C) x (1 - (R + s + D + C / 2) / M), restoring from `restored` at its
// every_steps (> 0); other_stall_per_step: the other saves' stall per step (T' - T).
GoodputAt goodput_at(double step_seconds, double other_stall_per_step, const SaveCadence& restored, double job_mtbf_seconds);
// The every_steps that maximizes goodput_at (at least 1), from the ranges above.
int64_t best_every_steps(double step_seconds, double other_stall_per_step, const SaveCadence& restored, double job_mtbf_seconds);
// Young's first-order interval, sqrt(2 s M), in seconds.
double young_daly_seconds(double stall_seconds, double job_mtbf_seconds);

// How failures are counted: node.mtbf_hours (or plan --mtbf-hours) over the job's nodes.
struct FailureModel {
    double node_mtbf_hours = 0;
    int nodes = 1;
    double job_mtbf_seconds = 0;     // M = node MTBF / nodes
    double detection_seconds = 0;    // parallel.timeout_seconds: a collective waiting for the lost node ends the job
    double launch_seconds = 0;       // node.launch_seconds, or kAssumedLaunchSeconds
    bool launch_assumed = false;     // not given: kAssumedLaunchSeconds
};
// Relaunching every rank and setting up its communicators, where the cluster does not say:
// assumed, not measured (the supervisor's first backoff is 10 s; process start, device
// initialization and communicator set-up the rest).
constexpr double kAssumedLaunchSeconds = 60;

// Goodput with persistent checkpoints only (checkpoint.every_steps), and with node-local
// snapshots too (checkpoint.local.every_steps), at the config's intervals and at the best.
struct GoodputPlan {
    FailureModel failures;
    double step_seconds = 0;
    SaveCadence persistent;              // every_steps: the config's (0: none)
    std::optional<GoodputAt> persistent_only;  // none without persistent checkpoints
    GoodputAt persistent_best;
    double persistent_young_daly_seconds = 0;
    std::optional<SaveCadence> local;    // checkpoint.local.every_steps > 0
    // A snapshot without a replica dies with its node: a failure then restores from the
    // persistent checkpoint, the snapshots adding only their stall.
    bool local_survives_node_loss = false;
    std::optional<GoodputAt> with_local;     // none where nothing survives a node's loss
    std::optional<GoodputAt> local_best;     // the snapshot interval at its best, persistent as configured
    double local_young_daly_seconds = 0;
};

// Snapshots (the rank's persistent checkpoint bytes) kept in each node's memory: its own
// ranks' and `replicas` copies of ranks' on other nodes.
struct NodeLocalSnapshots {
    int ranks_per_node = 1;
    double bytes_per_rank = 0;
    int64_t replicas = 0, keep = 0;
    double bytes_per_snapshot = 0;   // per node: ranks x bytes per rank x (1 + replicas)
    double bytes_kept = 0;           // x keep
    double bytes_peak = 0;           // x (keep + 1): the next one written before the oldest goes
    // The ranks' own buffers (checkpoint/local_snapshots.cpp): the host copy taken at the step,
    // the file's bytes kept for sending, and the copies received while replicating:
    // ranks x bytes per rank x (2 + replicas).
    double buffer_bytes = 0;
    double host_memory_bytes = 0;    // node.host_memory_gb; 0: not known
    double replica_bytes_per_node = 0;  // sent out of each node per snapshot (and as many received)
    double replica_seconds = 0;      // each rank's sends at its inter-node bus bandwidth
};

// Throws Error(config) naming the flag or key for a node MTBF that is not positive.
GoodputPlan plan_goodput(const Config& config, const Mesh& mesh, const Cluster& cluster, const CheckpointTime& checkpoint, double step_seconds);
NodeLocalSnapshots plan_node_local_snapshots(const Config& config, const Mesh& mesh, const Cluster& cluster, double parameters);

}  // namespace llmtrain

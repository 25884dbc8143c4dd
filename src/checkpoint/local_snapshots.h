// Node-local snapshots ([checkpoint.local]): recovery in seconds, on the same layout.
//
// Every checkpoint.local.every_steps steps each rank copies its share of the state to host
// memory (the persistent checkpoint's pieces: checkpoint/rank_snapshot.h), and the step loop
// goes on. Off the step loop:
//
//   1. writing      a background thread writes rank_NNNNN.h5 into the node-local directory
//                   <checkpoint.local.dir>/<run id>/step_NNNNNNNN/ (a .part name, renamed
//                   when whole) and keeps its bytes and XXH64;
//   2. replicating  once every rank's file is written (one scalar all-reduce per step
//                   boundary, then one all-gather of every file's size and XXH64), each node
//                   holds the manifest (the persistent one's format, every file listed) and
//                   each rank sends its file to checkpoint.local.replicas ranks on other
//                   nodes, in 64 MiB messages, at most 16 in flight per peer, polled at step
//                   boundaries; the receivers check the XXH64 and store the copies;
//   3. complete     when every rank has stored its copies (one scalar all-reduce per
//                   boundary): the node's oldest snapshots beyond checkpoint.local.keep go.
//
// The main thread makes every MPI call (MPI_THREAD_FUNNELED); the thread only writes files.
// At most one snapshot is in flight: one falling due before the previous completes is
// deferred to the first step boundary after it completes (checkpoint.local.when_busy =
// "defer": the step loop waits for the copy to host alone), or waits for it ("wait": the wait
// counted in its blocked time); warned about once.
//
// A restart (--resume auto) asks agree_on_local_snapshot for the newest step whose every
// piece is somewhere: on the rank's own node, or as a replica on a surviving node, from
// which it is fetched over the world communicator. A piece counts only when its size and
// XXH64 match the manifest; a snapshot short of one piece yields to the next newest, then to
// the persistent checkpoints. Snapshots restore on the layout that wrote them only (the
// manifest's world size, tp, cp, dp, pp and ZeRO stage); another layout loads the
// persistent checkpoints.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_snapshot.h"
#include "config/config.h"
#include "metrics/step_record.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"

namespace llmtrain {

// The nodes of a job, numbered in the order of their first rank.
struct NodeMap {
    std::vector<int> node_of_rank;   // by world rank
    std::vector<std::string> names;  // by node
    int nodes() const { return static_cast<int>(names.size()); }
    std::vector<int> ranks_on(int node) const;
    // The rank's position among the ranks of its node.
    int local_index(int rank) const;
};

// Every rank's node (a collective over world).
NodeMap gather_node_map(Comm& world);
// The ranks that keep copies of `rank`'s piece: on each of the next `replicas` nodes (a ring
// over the nodes), the rank at the same local index (modulo that node's size). Fewer when
// there are not that many other nodes.
std::vector<int> replica_holders(const NodeMap& nodes, int rank, int replicas);

// <checkpoint.local.dir with "{node}" replaced>/<run id>
std::string local_snapshot_root(const LocalSnapshotConfig& config, const std::string& node, const std::string& run_id);

// Refuses (Error(config), naming checkpoint.local.dir) a directory that ranks on different
// nodes both see: a shared file system would count one copy as two. Each node's first rank
// leaves a marker with this attempt's nonce, and every rank looks for another node's. A
// collective over world; creates root.
void check_node_local(Comm& world, const NodeMap& nodes, const std::string& root);

struct LocalSnapshotHooks {
    std::function<void(int64_t step, RankSnapshot& out)> capture;  // this rank's state after a step
    std::function<Manifest(int64_t step)> manifest;               // rank 0: the manifest's scalars
    // Before this rank's file of a step is written, in the background thread (optional):
    // fault injection fails a snapshot there as a full file system would.
    std::function<void(int64_t step)> before_write;
};

// What the run log and the metrics hear of each snapshot, on every rank alike.
struct LocalSnapshotOutcome {
    int64_t step = 0;
    bool complete = false;
    std::string reason;              // a failed one's (this rank's error, or the failing rank)
    double copy_seconds = 0;         // the copy to host memory
    double blocked_seconds = 0;      // the step loop's in all: the copy, the manifest's broadcast and any wait for the one before
    uint64_t own_bytes = 0;          // this rank's file
    double write_seconds = 0;        // its write (and read back for the copies), in the background
    uint64_t replica_bytes = 0;      // copies this rank stored for others
    double seconds_to_complete = 0;  // from the capture to the agreement
};

class LocalSnapshotter : public StepObserver {
public:
    // start_step: the step the run starts from (the node's snapshots of later steps are a
    // timeline a failure abandoned, and are deleted).
    // world: the agreements; copies: the world's ranks on a communicator of their own, which
    // the copies' messages travel on.
    LocalSnapshotter(const LocalSnapshotConfig& config, Comm& world, Comm& copies, FileAttributes file, NodeMap nodes, std::string root, int64_t start_step,
                     LocalSnapshotHooks hooks);
    ~LocalSnapshotter() override;
    LocalSnapshotter(const LocalSnapshotter&) = delete;
    LocalSnapshotter& operator=(const LocalSnapshotter&) = delete;

    void after_step(const StepRecord& record) override;
    // A rollback restored an older checkpoint: the snapshots hold the steps it abandoned (and
    // predate the data it skips), so they all go, after the one in flight completes.
    void after_anomaly(const AnomalyRecord& anomaly) override;
    // Waits for the snapshot in flight to complete or fail (the end of a run).
    void finish();
    void on_outcome(std::function<void(const LocalSnapshotOutcome&)> listener) { listeners_.push_back(std::move(listener)); }

private:
    enum class Phase { idle, writing, replicating };
    struct Transfer;  // one peer's copy, in 64 MiB messages

    void start(int64_t step, double waited_seconds);
    void advance(bool wait);
    // Sum over the world of what each rank says: 1 done, W + 1 failed, 0 not yet. nullopt while
    // some rank is not done; else the lowest failing rank (-1: none).
    std::optional<int> agree_done(bool done, bool failed);
    void begin_replication();
    bool transfers_done();
    void complete();
    void abandon(int failed_rank);
    void notify(const LocalSnapshotOutcome& outcome);
    std::string step_dir(int64_t step) const;

    // The background thread: one job at a time, its error kept.
    void post(std::function<void()> job);
    bool job_running();
    void wait_job();
    void worker_loop();
    void write_own_file();
    void store_replicas();
    void write_manifest();
    void apply_retention();

    LocalSnapshotConfig config_;
    Comm& world_;
    Comm& copies_;
    FileAttributes file_;
    NodeMap nodes_;
    std::string root_;
    LocalSnapshotHooks hooks_;
    std::vector<int> holders_;  // who keeps copies of this rank's piece
    std::vector<int> sources_;  // whose pieces this rank keeps
    std::vector<std::function<void(const LocalSnapshotOutcome&)>> listeners_;

    RankSnapshot snapshot_;
    Phase phase_ = Phase::idle;
    LocalSnapshotOutcome in_flight_;
    double started_at_ = 0;
    Manifest manifest_;
    std::vector<char> own_bytes_;            // this rank's file, as written (in whole 32-bit words)
    size_t own_length_ = 0;
    uint64_t own_xxh64_ = 0;
    double write_seconds_ = 0;
    std::vector<std::unique_ptr<Transfer>> transfers_;
    std::map<int, std::vector<char>> received_;  // the copies of each source rank's file, kept allocated
    bool storing_ = false;                   // the received copies are being written
    std::optional<int64_t> newest_complete_;
    int64_t busy_snapshots_ = 0;  // snapshots that fell due while the one before was in flight
    bool deferred_ = false;  // a snapshot fell due while one was in flight: take it once that completes
    int64_t completed_ = 0;

    std::mutex mutex_;
    std::condition_variable changed_;
    std::function<void()> job_;
    bool busy_ = false, stopping_ = false;
    std::string job_error_;
    std::thread worker_;
};

// Whether a snapshot's manifest was written by this layout; nullopt: it was, else why not.
using LayoutCheck = std::function<std::optional<std::string>(const Manifest&)>;

struct LocalResume {
    std::string path;   // the node-local snapshot directory
    Manifest manifest;
    int fetched = 0;    // pieces fetched from other nodes (over the job)
    uint64_t fetched_bytes = 0;
};

// The newest local snapshot of run_id newer than `newer_than` (the persistent checkpoint's
// step, -1: none) whose every piece is available; this rank's own piece is fetched from a
// peer when its node lost it. Every candidate passed over is told to `skipped` (on every
// rank alike). A collective over world (the pieces travel on `copies`, the world's ranks on a
// communicator of their own); nullopt when none qualifies.
std::optional<LocalResume> agree_on_local_snapshot(Comm& world, Comm& copies, const NodeMap& nodes, const std::string& root, const std::string& run_id, int64_t newer_than,
                                                   const LayoutCheck& same_layout, const std::function<void(const std::string&)>& skipped);

}  // namespace llmtrain

// Saving checkpoints during training, asynchronously (checkpoint.async) and crash-safely.
//
// At a step boundary the trainer's state is copied to host memory (the only time the step
// loop waits); one background thread per rank then makes every HDF5 call of this rank's file
// while training goes on. The thread never calls MPI (the session is MPI_THREAD_FUNNELED):
// at each later step boundary the main thread asks, with one scalar all-reduce over the
// world, whether every rank's file is durable. Once all are, rank 0's thread commits
// (checkpoint_store.h: the manifest, the directory's rename, `latest`, then retention) while
// the step loop goes on, so that O(world) record reads, fsyncs and the deletion of an old
// checkpoint never hold a step boundary; at the following boundaries one more scalar
// all-reduce tells every rank whether the commit succeeded. Every rank thus records the same
// outcome of every save, and acts on it alike: a failed save is warned about (or stops the
// run: checkpoint.on_save_error = "abort", or checkpoint.max_failed_saves failures in a row,
// Error(storage), exit 74) on every rank at the same step. At most one save is in flight: a
// save falling due while one is still being written or committed waits for it first.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/io_report.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_snapshot.h"
#include "config/config.h"
#include "metrics/step_record.h"
#include "parallel/comm.h"

namespace llmtrain {

struct CheckpointerHooks {
    // This rank's state after a step, into a snapshot whose buffer is reused.
    std::function<void(int64_t step, RankSnapshot& out)> capture;
    // The manifest's fields for the state after a step (taken with the snapshot, on rank 0);
    // files are filled at the commit.
    std::function<Manifest(int64_t step)> manifest;
    // Rank 0's commit thread, before each filesystem step of a commit (optional): fault
    // injection slows or fails a commit there.
    CommitProbe commit_probe;
};

struct SaveReport {
    int64_t step = 0;
    uint64_t bytes = 0;             // this rank's file
    double blocked_seconds = 0;     // the step loop waiting: the copy to host (and a synchronous write)
    double background_seconds = 0;  // the writer thread's time for this rank's file
    bool synchronous = false;       // the step loop waited for the write too
};

// What became of one save: the same verdict on every rank.
struct SaveOutcome {
    int64_t step = 0;
    bool committed = false;
    // A failed save: the lowest rank that failed (the commit's failures are rank 0's) and, on
    // that rank, its error; on the others "rank N failed (its log names the reason)".
    int failed_rank = -1;
    std::string reason;
    int64_t failures_in_a_row = 0;
    // Rank 0, after a failure: the newest checkpoint of this run that exists ("" none).
    std::string newest_checkpoint;
};

class Checkpointer : public StepObserver {
public:
    Checkpointer(const CheckpointConfig& config, Comm& world, FileAttributes file, CheckpointerHooks hooks);
    ~Checkpointer() override;
    Checkpointer(const Checkpointer&) = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;

    // Advances a save in flight (its files written, its commit done); starts one when the
    // step is due.
    void after_step(const StepRecord& record) override;
    // Saves the state after `step` and waits until every rank knows its outcome (the end of a
    // run, a stop signal); a save of that step already under way is awaited instead of repeated.
    void save_and_wait(int64_t step);
    // Waits for a save in flight until its outcome is agreed.
    void finish();
    // Every outcome, on every rank, as it is agreed (the run log and the metrics listen);
    // called before a failure that stops the run is thrown.
    void on_outcome(std::function<void(const SaveOutcome&)> listener) { listeners_.push_back(std::move(listener)); }
    // The last committed save of this rank (nullopt before the first).
    const std::optional<SaveReport>& last_save() const { return last_save_; }
    // Whether the state after `step` was committed by this run.
    bool saved(int64_t step) const { return last_save_ && last_save_->step == step; }
    int64_t failed_saves() const { return failed_saves_; }
    const std::optional<SaveOutcome>& last_failure() const { return last_failure_; }

private:
    // The background thread's work and what it reports back to the main thread.
    enum class State { idle, writing, written, write_failed, committing, committed, commit_failed };
    struct CommitResult {
        Manifest manifest;
        std::vector<std::string> deleted;  // by retention
        std::string error, retention_error;
    };

    void start_save(int64_t step, bool wait);
    void advance(bool wait);
    // The lowest rank whose file failed, -1 when every file is written; nullopt while some
    // rank is still writing. One scalar all-reduce (two when a rank failed).
    std::optional<int> agree_written(bool wait);
    // Rank 0's commit, told to every rank: nullopt while it runs, else whether it succeeded.
    std::optional<bool> agree_committed(bool wait);
    // value reduced over the world (one scalar all-reduce; none on one rank).
    double over_world(double value, ReduceOp op);
    void begin_commit();
    void complete(bool committed, int failed_rank);
    void report_commit(const SaveReport& report, const CommitResult& commit);
    void fail_save(const SaveReport& report, int failed_rank, const std::string& own_error);
    void notify(const SaveOutcome& outcome);
    void writer_loop();
    void write_file();
    void commit();

    CheckpointConfig config_;
    Comm& world_;
    FileAttributes file_;
    CheckpointerHooks hooks_;
    RankSnapshot snapshot_;
    std::optional<SaveReport> in_flight_, last_save_;
    bool committing_ = false;       // the save in flight is written everywhere; rank 0 commits it
    IoFigures written_figures_;     // every rank's bytes and seconds of the save in flight
    Manifest in_flight_manifest_;   // rank 0: the scalars of the state in flight, taken with it
    int64_t failed_saves_ = 0, failures_in_a_row_ = 0;
    std::optional<SaveOutcome> last_failure_;
    std::vector<std::function<void(const SaveOutcome&)>> listeners_;

    // The background thread and what it shares with the main thread.
    std::mutex mutex_;
    std::condition_variable changed_;
    State state_ = State::idle;
    bool stopping_ = false;
    std::string write_error_;
    double write_seconds_ = 0;
    uint64_t written_bytes_ = 0;
    CommitResult commit_result_;
    std::thread writer_;
};

}  // namespace llmtrain

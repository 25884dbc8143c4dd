// Saving checkpoints during training, asynchronously (checkpoint.async) and crash-safely.
//
// At a step boundary the trainer's state is copied to host memory (the only time the step
// loop waits); one writer thread then makes every HDF5 call of this rank's file while
// training goes on. The writer never calls MPI (the session is MPI_THREAD_FUNNELED): at each
// later step boundary the main thread asks, with one scalar all-reduce over the world,
// whether every rank's file is durable; then rank 0 commits (checkpoint_store.h) and applies
// retention. At most one save is in flight: a save falling due while one is still being
// written waits for it first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/hdf5_file.h"
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
};

struct SaveReport {
    int64_t step = 0;
    uint64_t bytes = 0;             // this rank's file
    double blocked_seconds = 0;     // the step loop waiting: the copy to host (and a synchronous write)
    double background_seconds = 0;  // the writer thread's time for this rank's file
    bool synchronous = false;       // the step loop waited for the write too
};

class Checkpointer : public StepObserver {
public:
    Checkpointer(const CheckpointConfig& config, Comm& world, FileAttributes file, CheckpointerHooks hooks);
    ~Checkpointer() override;
    Checkpointer(const Checkpointer&) = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;

    // Commits a save whose files are all written; starts one when the step is due.
    void after_step(const StepRecord& record) override;
    // Saves the state after `step` and waits until it is committed (the end of a run, a stop
    // signal); a save of that step already under way is awaited instead of repeated.
    void save_and_wait(int64_t step);
    // Waits for a save in flight and commits it.
    void finish();
    // The last committed save of this rank (nullopt before the first).
    const std::optional<SaveReport>& last_save() const { return last_save_; }

private:
    void start_save(int64_t step, bool wait);
    void writer_loop();
    // Every rank's outcome of the save in flight, the same on every rank; waits when asked.
    enum class Outcome { pending, written, failed };
    Outcome agree(bool wait);
    void complete(Outcome outcome);

    CheckpointConfig config_;
    Comm& world_;
    FileAttributes file_;
    CheckpointerHooks hooks_;
    RankSnapshot snapshot_;
    std::optional<SaveReport> in_flight_, last_save_;
    Manifest in_flight_manifest_;   // rank 0: the scalars of the state in flight, taken with it

    // The writer thread and what it shares with the main thread.
    enum class State { idle, writing, written, failed };
    std::mutex mutex_;
    std::condition_variable changed_;
    State state_ = State::idle;
    bool stopping_ = false;
    std::string write_error_;
    double write_seconds_ = 0;
    uint64_t written_bytes_ = 0;
    std::thread writer_;
};

}  // namespace llmtrain

// What guards a run before and while it trains, beyond the config's own checks: one process
// per run directory and checkpoint.dir (core/directory_lock.h), room for the checkpoints it
// keeps, and a warning when a long run saves nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "core/directory_lock.h"
#include "metrics/step_record.h"

namespace llmtrain {

// The locks of a run (rank 0): its run directory, and its checkpoint.dir when it saves. A
// directory this process made only to hold its lock, and that holds nothing else when the
// lock is released (the checkpoint.dir was refused, the trainer could not start), is removed
// again, so that a run refused at the door leaves nothing behind.
class RunLocks {
public:
    RunLocks(const std::string& run_dir, const Config& config);
    ~RunLocks();
    RunLocks(const RunLocks&) = delete;
    RunLocks& operator=(const RunLocks&) = delete;

private:
    struct Held {
        std::unique_ptr<DirectoryLock> lock;
        std::string dir;
        bool made = false;  // the directory did not exist before the lock
    };
    static void release(Held& held);
    Held run_dir_, checkpoint_dir_;
};

// Whether checkpoint.dir's file system has room for checkpoint.keep_last + 1 checkpoints (the
// ones kept and the one being written) of the size the plan computes: a warning naming the
// figures when not, or with strict an Error(storage) (exit 74). No saves: no check.
void check_checkpoint_room(const Config& config, bool strict);

// Rank 0: once the first steps are timed, warns once when the run would take more than an
// hour at their pace and saves no checkpoint (a failure would lose all of it).
class UnsavedRunWarning : public StepObserver {
public:
    UnsavedRunWarning(const Config& config, int64_t start_step);
    void after_step(const StepRecord& record) override;

private:
    static constexpr int64_t kTimedSteps = 5;  // after the first, which pays for warm-up
    int64_t total_steps_, start_step_;
    double timed_seconds_ = 0;
    int64_t timed_ = 0;
    bool judged_ = false;
};

}  // namespace llmtrain

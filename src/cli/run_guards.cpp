#include "cli/run_guards.h"

#include <cmath>
#include <filesystem>

#include "core/log.h"
#include "plan/step_model.h"

namespace llmtrain {

namespace fs = std::filesystem;

RunLocks::RunLocks(const std::string& run_dir, const Config& config) {
    const auto take = [](Held& held, const std::string& dir, const char* what) {
        std::error_code ec;
        held.dir = dir;
        held.made = !fs::exists(dir, ec);
        held.lock = std::make_unique<DirectoryLock>(dir, what);
    };
    take(run_dir_, run_dir, "run directory");
    if (config.checkpoint.every_steps == 0) return;
    try {
        take(checkpoint_dir_, config.checkpoint.dir, "checkpoint.dir");
    } catch (const Error&) {
        release(run_dir_);
        throw;
    }
}

RunLocks::~RunLocks() {
    release(checkpoint_dir_);
    release(run_dir_);
}

void RunLocks::release(Held& held) {
    if (!held.lock) return;
    const std::string lock_path = held.lock->path();
    held.lock.reset();
    if (!held.made) return;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(held.dir, ec))
        if (entry.path() != fs::path(lock_path)) return;  // the run wrote into it: it stays
    if (ec) return;
    fs::remove(lock_path, ec);
    fs::remove(held.dir, ec);
}

namespace {
// The nearest existing directory of path (checkpoint.dir may not exist yet).
fs::path existing_ancestor(fs::path path) {
    std::error_code ec;
    path = fs::absolute(path, ec);
    while (!path.empty() && !fs::exists(path, ec) && path != path.parent_path()) path = path.parent_path();
    return path;
}
}  // namespace

void check_checkpoint_room(const Config& config, bool strict) {
    const CheckpointConfig& c = config.checkpoint;
    if (c.every_steps == 0) return;
    const double bytes = planned_checkpoint_bytes(config, model_parameter_count(config.model));
    const int64_t needed = c.keep_last + 1;
    std::error_code ec;
    const fs::space_info space = fs::space(existing_ancestor(c.dir), ec);
    if (ec) {
        log_warn("checkpoint.dir '", c.dir, "': cannot tell its free space (", ec.message(), ")");
        return;
    }
    const double available = static_cast<double>(space.available);
    if (available >= bytes * static_cast<double>(needed)) return;
    const std::string text = cat("checkpoint.dir '", c.dir, "' has ", megabytes(available), " free: room for ", std::floor(available / bytes),
                                 " checkpoint(s) of about ", megabytes(bytes), " (master weights and two AdamW moments), and checkpoint.keep_last = ", c.keep_last,
                                 " needs ", needed, " (the kept ones and the one being written): saves will fail once it is full");
    if (strict) fail(ErrorKind::storage, text, " (--strict)");
    log_warn(text);
}

UnsavedRunWarning::UnsavedRunWarning(const Config& config, int64_t start_step) : total_steps_(config.train.steps), start_step_(start_step) {}

void UnsavedRunWarning::after_step(const StepRecord& record) {
    if (judged_ || record.step == start_step_ + 1) return;  // the first step pays for warm-up
    timed_seconds_ += record.step_seconds;
    if (++timed_ < kTimedSteps) return;
    judged_ = true;
    const double per_step = timed_seconds_ / static_cast<double>(timed_);
    const double planned_seconds = per_step * static_cast<double>(total_steps_ - start_step_);
    if (planned_seconds <= 3600) return;
    log_warn("this run saves no checkpoints (checkpoint.every_steps = 0) and will take about ", fixed(planned_seconds / 3600, 1), " h at ", fixed(per_step, 3),
             " s per step for ", total_steps_ - start_step_, " steps: a failure loses all of it; set checkpoint.every_steps");
}

}  // namespace llmtrain

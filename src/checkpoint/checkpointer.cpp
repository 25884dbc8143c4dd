#include "checkpoint/checkpointer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/io_report.h"
#include "core/log.h"
#include "core/timer.h"

namespace llmtrain {

namespace fs = std::filesystem;

namespace {
// A test hook: LLMTRAIN_CHECKPOINT_WRITE_DELAY_MS slows the writer down after every tensor,
// so that a test can kill a save at any point of it.
std::function<void()> write_delay_hook() {
    const char* text = std::getenv("LLMTRAIN_CHECKPOINT_WRITE_DELAY_MS");
    if (!text || !*text) return {};
    const long ms = std::strtol(text, nullptr, 10);
    if (ms <= 0) return {};
    return [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
}

}  // namespace

Checkpointer::Checkpointer(const CheckpointConfig& config, Comm& world, FileAttributes file, CheckpointerHooks hooks)
    : config_(config), world_(world), file_(file), hooks_(std::move(hooks)) {
    if (file_.world_rank == 0) create_checkpoint_root(config_.dir);
    // The host buffer is allocated and touched now, before the first step: the first save
    // then costs the step loop one copy, not an allocation and its page faults as well.
    hooks_.capture(0, snapshot_);
    writer_ = std::thread([this] { writer_loop(); });
}

Checkpointer::~Checkpointer() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    writer_.join();
}

void Checkpointer::after_step(const StepRecord& record) {
    if (in_flight_) {
        const Outcome outcome = agree(false);
        if (outcome != Outcome::pending) complete(outcome);
    }
    if (config_.every_steps > 0 && record.step % config_.every_steps == 0) start_save(record.step, !config_.async);
}

void Checkpointer::save_and_wait(int64_t step) {
    if (in_flight_ && in_flight_->step == step) return finish();
    if (last_save_ && last_save_->step == step) return;
    start_save(step, true);
}

void Checkpointer::finish() {
    if (in_flight_) complete(agree(true));
}

void Checkpointer::start_save(int64_t step, bool wait) {
    finish();  // at most one save in flight
    Stopwatch clock;
    hooks_.capture(step, snapshot_);
    if (file_.world_rank == 0) in_flight_manifest_ = hooks_.manifest(step);
    const std::string dir = pending_dir(config_.dir, step);
    std::error_code ec;
    fs::create_directories(dir, ec);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = ec ? State::failed : State::writing;
        write_error_ = ec ? cat("cannot create '", dir, "': ", ec.message()) : "";
    }
    changed_.notify_all();
    in_flight_ = SaveReport{step, 0, clock.seconds(), 0, wait};
    if (wait) complete(agree(true));
}

void Checkpointer::writer_loop() {
    // Below the training threads: where the cores are all busy training, the writer takes
    // what they leave (Linux applies nice to the calling thread alone).
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
    const std::function<void()> delay = write_delay_hook();
    for (;;) {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || state_ == State::writing; });
        if (state_ != State::writing) return;  // stopping, nothing to write
        lock.unlock();
        Stopwatch clock;
        std::string error;
        uint64_t bytes = 0;
        try {
            const std::string dir = pending_dir(config_.dir, snapshot_.step);
            const std::string path = (fs::path(dir) / rank_file_name(file_.world_rank)).string();
            FileAttributes attributes = file_;
            attributes.step = snapshot_.step;
            write_rank_file(path, snapshot_, attributes, delay);
            write_rank_record(dir, file_.world_rank, path);
            bytes = fs::file_size(path);
        } catch (const std::exception& e) {
            error = e.what();
        }
        lock.lock();
        state_ = error.empty() ? State::written : State::failed;
        write_error_ = error;
        write_seconds_ = clock.seconds();
        written_bytes_ = bytes;
        lock.unlock();
        changed_.notify_all();
    }
}

// Each rank adds 1 once its file is written and W + 1 if it failed (W ranks): the sum says
// how many did which, so one all-reduce answers both questions.
Checkpointer::Outcome Checkpointer::agree(bool wait) {
    State state;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        if (wait) changed_.wait(lock, [&] { return state_ != State::writing; });
        state = state_;
    }
    const double world = world_.size();
    const double mine = state == State::written ? 1.0 : state == State::failed ? world + 1 : 0.0;
    const double sum = world == 1 ? mine : world_.all_reduce_scalar(mine, ReduceOp::sum);
    const double failed = std::floor(sum / (world + 1)), written = sum - failed * (world + 1);
    if (failed + written < world) return Outcome::pending;
    return failed > 0 ? Outcome::failed : Outcome::written;
}

void Checkpointer::complete(Outcome outcome) {
    SaveReport report = *in_flight_;
    in_flight_.reset();
    std::string error;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        report.background_seconds = write_seconds_;
        if (report.synchronous) report.blocked_seconds += write_seconds_;
        report.bytes = written_bytes_;
        error = write_error_;
        state_ = State::idle;
    }
    // Every rank's bytes and seconds (the commit's log line): agreed before rank 0 commits.
    const IoFigures figures = outcome == Outcome::written ? agree_io_figures(world_, report.bytes, report.background_seconds) : IoFigures{};
    if (outcome == Outcome::written && file_.world_rank == 0) {
        try {
            const Manifest committed = commit_checkpoint(config_.dir, in_flight_manifest_);
            log_info("checkpoint ", (fs::path(config_.dir) / checkpoint_name(report.step)).string(), ": ", megabytes(static_cast<double>(checkpoint_bytes(committed))),
                     " in ", committed.files.size(), " file(s) | step loop blocked ", fixed(report.blocked_seconds, 3), " s | written in ", fixed(figures.seconds, 3),
                     " s", report.synchronous ? "" : " in the background", " | ", describe_io(figures, "written"));
            for (const std::string& deleted : apply_retention(config_.dir, config_.keep_last, config_.keep_every, committed.run_id))
                log_info("checkpoint retention: deleted ", deleted);
        } catch (const Error& e) {
            outcome = Outcome::failed;
            error = e.what();
        }
    }
    if (outcome == Outcome::written) {
        last_save_ = report;
        return;
    }
    if (!error.empty()) log_warn("checkpoint at step ", report.step, " failed on rank ", file_.world_rank, ": ", error);
    // Every rank is done with the failed save: its partial files go, so that they do not fill
    // the disk the next save needs (committed checkpoints are not touched).
    if (file_.world_rank == 0) {
        std::error_code ec;
        fs::remove_all(pending_dir(config_.dir, report.step), ec);
    }
    if (config_.on_save_error == SaveErrorPolicy::abort)
        fail(ErrorKind::io, "checkpoint at step ", report.step, " failed", error.empty() ? " on another rank" : cat(": ", error),
             " (checkpoint.on_save_error = \"abort\")");
    if (file_.world_rank == 0)
        log_warn("checkpoint at step ", report.step, " was not saved; training goes on, the previous checkpoint stays the latest (checkpoint.on_save_error = \"warn\")");
}

}  // namespace llmtrain

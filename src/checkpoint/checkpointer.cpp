#include "checkpoint/checkpointer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sys/resource.h>
#include <unistd.h>

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

// "the newest checkpoint of this run is 'PATH' (step N)", or that there is none: what a
// failed save leaves to resume from.
std::string describe_newest(const std::string& newest) {
    if (newest.empty()) return "this run has no checkpoint yet: a failure now loses every step since the start";
    return cat("the newest checkpoint of this run is '", newest, "'");
}

// The newest committed checkpoint of the run under root, "" when there is none (read from
// the manifests: a failure's message must name what really exists, not what was hoped for).
std::string newest_checkpoint_of(const std::string& root, const std::string& run_id) {
    try {
        const std::vector<ChainLink> chain = read_checkpoint_chains(root).chain(run_id);
        return chain.empty() ? "" : chain.back().path;
    } catch (const std::exception&) {
        return "";
    }
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
    if (in_flight_) advance(false);
    if (config_.every_steps > 0 && record.step % config_.every_steps == 0) start_save(record.step, !config_.async);
}

void Checkpointer::save_and_wait(int64_t step) {
    if (in_flight_ && in_flight_->step == step) return finish();
    if (saved(step)) return;
    start_save(step, true);
}

void Checkpointer::finish() {
    while (in_flight_) advance(true);
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
        state_ = ec ? State::write_failed : State::writing;
        write_error_ = ec ? cat("cannot create '", dir, "': ", ec.message()) : "";
    }
    changed_.notify_all();
    in_flight_ = SaveReport{step, 0, clock.seconds(), 0, wait};
    committing_ = false;
    if (wait) finish();
}

// The save in flight, one agreement further: its files written on every rank, then rank 0's
// commit. Without wait each agreement is one scalar all-reduce that does not block on the
// background thread.
void Checkpointer::advance(bool wait) {
    if (!committing_) {
        const std::optional<int> failed_rank = agree_written(wait);
        if (!failed_rank) return;
        if (*failed_rank >= 0) return complete(false, *failed_rank);
        uint64_t bytes = 0;
        double seconds = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            bytes = written_bytes_;
            seconds = write_seconds_;
        }
        written_figures_ = agree_io_figures(world_, bytes, seconds);
        begin_commit();
        if (!wait) return;
    }
    const std::optional<bool> committed = agree_committed(wait);
    if (committed) complete(*committed, *committed ? -1 : 0);
}

double Checkpointer::over_world(double value, ReduceOp op) { return world_.size() == 1 ? value : world_.all_reduce_scalar(value, op); }

// Each rank adds 1 once its file is written and W + 1 if it failed (W ranks): the sum says
// how many did which, so one all-reduce answers both questions; the lowest failing rank is
// -max(-rank) over the ranks that failed.
std::optional<int> Checkpointer::agree_written(bool wait) {
    State state;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        if (wait) changed_.wait(lock, [&] { return state_ != State::writing; });
        state = state_;
    }
    const bool failed_here = state == State::write_failed;
    const double world = world_.size();
    const double mine = state == State::written ? 1.0 : failed_here ? world + 1 : 0.0;
    const double sum = over_world(mine, ReduceOp::sum);
    const double failed = std::floor(sum / (world + 1)), written = sum - failed * (world + 1);
    if (failed + written < world) return std::nullopt;
    if (failed == 0) return -1;
    const double mine_failed = -(failed_here ? file_.world_rank : world_.size());
    return static_cast<int>(-over_world(mine_failed, ReduceOp::max));
}

// Rank 0 contributes 1 (committed) or 2 (failed) once its commit thread is done, the other
// ranks 0: the sum is rank 0's verdict.
std::optional<bool> Checkpointer::agree_committed(bool wait) {
    double mine = 0;
    if (file_.world_rank == 0) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (wait) changed_.wait(lock, [&] { return state_ != State::committing; });
        mine = state_ == State::committed ? 1 : state_ == State::commit_failed ? 2 : 0;
    }
    const double verdict = over_world(mine, ReduceOp::sum);
    if (verdict == 0) return std::nullopt;
    return verdict == 1;
}

void Checkpointer::begin_commit() {
    committing_ = true;
    if (file_.world_rank != 0) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = State::committing;
    }
    changed_.notify_all();
}

void Checkpointer::complete(bool committed, int failed_rank) {
    SaveReport report = *in_flight_;
    in_flight_.reset();
    committing_ = false;
    std::string error;
    CommitResult commit;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        report.background_seconds = write_seconds_;
        if (report.synchronous) report.blocked_seconds += write_seconds_;
        report.bytes = written_bytes_;
        error = !commit_result_.error.empty() ? commit_result_.error : write_error_;
        commit = std::move(commit_result_);
        commit_result_ = {};
        state_ = State::idle;
    }
    if (!committed) return fail_save(report, failed_rank, error);
    if (file_.world_rank == 0) report_commit(report, commit);
    last_save_ = report;
    failures_in_a_row_ = 0;
    notify({report.step, true, -1, "", 0, ""});
}

void Checkpointer::report_commit(const SaveReport& report, const CommitResult& commit) {
    const IoFigures& figures = written_figures_;
    log_info("checkpoint ", (fs::path(config_.dir) / checkpoint_name(report.step)).string(), ": ", megabytes(static_cast<double>(checkpoint_bytes(commit.manifest))),
             " in ", commit.manifest.files.size(), " file(s) | step loop blocked ", fixed(report.blocked_seconds, 3), " s | written in ", fixed(figures.seconds, 3),
             " s", report.synchronous ? "" : " in the background", " | ", describe_io(figures, "written"));
    for (const std::string& deleted : commit.deleted) log_info("checkpoint retention: deleted ", deleted);
    if (!commit.retention_error.empty())
        log_warn("checkpoint retention after step ", report.step, ": ", commit.retention_error, " (the checkpoint is committed; older ones stay until the next save)");
}

// Every rank records the failure alike; rank 0 deletes the partial files (every rank is done
// with them), so that they do not fill the disk the next save needs; committed checkpoints
// are not touched.
void Checkpointer::fail_save(const SaveReport& report, int failed_rank, const std::string& own_error) {
    const bool root = file_.world_rank == 0;
    ++failed_saves_;
    ++failures_in_a_row_;
    SaveOutcome outcome{report.step, false, failed_rank, "", failures_in_a_row_, ""};
    outcome.reason = !own_error.empty() ? own_error : cat("rank ", failed_rank, " failed (its log names the reason)");
    if (!own_error.empty()) log_warn("checkpoint at step ", report.step, " failed on rank ", file_.world_rank, ": ", own_error);
    if (root) {
        std::error_code ec;
        fs::remove_all(pending_dir(config_.dir, report.step), ec);
        outcome.newest_checkpoint = newest_checkpoint_of(config_.dir, in_flight_manifest_.run_id);
    }
    last_failure_ = outcome;
    notify(outcome);
    const std::string newest = root ? cat("; ", describe_newest(outcome.newest_checkpoint)) : "";
    if (config_.on_save_error == SaveErrorPolicy::abort)
        fail(ErrorKind::storage, "checkpoint at step ", report.step, " failed: ", outcome.reason, " (checkpoint.on_save_error = \"abort\")", newest);
    if (failures_in_a_row_ >= config_.max_failed_saves)
        fail(ErrorKind::storage, "checkpoint at step ", report.step, " failed: ", outcome.reason, "; that is ", failures_in_a_row_,
             " failed save(s) in a row (checkpoint.max_failed_saves = ", config_.max_failed_saves, "): fix the storage of checkpoint.dir '", config_.dir,
             "' and resume", newest);
    if (root)
        log_warn("checkpoint at step ", report.step, " was not saved (", failures_in_a_row_, " failed save(s) in a row; the run stops at checkpoint.max_failed_saves = ",
                 config_.max_failed_saves, "); training goes on (checkpoint.on_save_error = \"warn\"); ", describe_newest(outcome.newest_checkpoint));
}

void Checkpointer::notify(const SaveOutcome& outcome) {
    for (const auto& listener : listeners_) listener(outcome);
}

void Checkpointer::writer_loop() {
    // Below the training threads: where the cores are all busy training, the writer takes
    // what they leave (Linux applies nice to the calling thread alone).
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
    for (;;) {
        State job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            changed_.wait(lock, [&] { return stopping_ || state_ == State::writing || state_ == State::committing; });
            job = state_;
        }
        if (job == State::writing) {
            write_file();
        } else if (job == State::committing) {
            commit();
        } else {
            return;  // stopping, nothing to do
        }
    }
}

void Checkpointer::write_file() {
    static const std::function<void()> delay = write_delay_hook();
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
    {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = error.empty() ? State::written : State::write_failed;
        write_error_ = error;
        write_seconds_ = clock.seconds();
        written_bytes_ = bytes;
    }
    changed_.notify_all();
}

// Rank 0: the commit, then retention (crash-safety order: checkpoint_store.h). Any exception,
// a std::filesystem one included, is the save's failure; retention's is only warned about.
void Checkpointer::commit() {
    CommitResult result;
    try {
        result.manifest = commit_checkpoint(config_.dir, in_flight_manifest_, hooks_.commit_probe);
    } catch (const std::exception& e) {
        result.error = e.what();
    }
    if (result.error.empty()) {
        try {
            result.deleted = apply_retention(config_.dir, config_.keep_last, config_.keep_every, result.manifest.run_id);
        } catch (const std::exception& e) {
            result.retention_error = e.what();
        }
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        state_ = result.error.empty() ? State::committed : State::commit_failed;
        commit_result_ = std::move(result);
    }
    changed_.notify_all();
}

}  // namespace llmtrain

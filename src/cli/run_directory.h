// The run directory of `llmtrain train` (rank 0): config.toml (the effective config),
// log.jsonl (metrics/run_log.h: start, steps, and one closing record, or none if the process
// was killed) and console.log (a copy of the console). It is created only after every check
// passed, and a run there is never overwritten: another run is refused, and the same run
// continued there (`--resume` with the same --run-dir: the command that started it, run
// again) appends to its files after a `resume` record.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "metrics/run_log.h"

namespace llmtrain {

// runs/<config name>-<date>-<time>
std::string default_run_dir(const std::string& config_path);

// What a run directory holds already: nothing, or a run (its log.jsonl), with the run's id
// and the checkpoint.dir it saved into as its records say (runs of earlier llmtrains recorded
// neither).
struct RunRecord {
    bool holds_run = false;
    std::optional<std::string> run_id;
    std::string checkpoint_dir;  // absolute; "" when not recorded
    int64_t last_step = -1;      // the newest step record (what a failure interrupted); -1 none
};
RunRecord read_run_record(const std::string& dir);

// A config error if dir holds a run already: a second run there would mix two runs' records.
// The message says how to continue that run instead.
void check_run_dir_is_free(const std::string& dir);

// Who is writing the run directory: the run's id, and whether this process continues the run
// recorded there.
struct RunIdentity {
    std::string run_id;
    bool continues_record = false;      // append after a `resume` record
    std::string resumed_from;           // the checkpoint this process starts from ("" none)
    int64_t start_step = 0;
    std::string config_changes;         // how the effective config differs from the record's
};

class RunDirectory {
public:
    // Creates dir with config.toml, log.jsonl (its start record) and console.log, or, for a run
    // continued there, appends a resume record to log.jsonl and the console to console.log,
    // leaving config.toml as the run first wrote it; then points the logger's copy and the
    // crash record at them.
    RunDirectory(const std::string& dir, const Config& config, const std::string& config_path, int ranks, const RunIdentity& run);
    RunLog& log() { return *log_; }

private:
    std::unique_ptr<RunLog> log_;
};

}  // namespace llmtrain

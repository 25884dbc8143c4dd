// The run directory of `llmtrain train` (rank 0): config.toml (the effective config),
// log.jsonl (metrics/run_log.h: start, steps, and one closing record, or none if the process
// was killed) and console.log (a copy of the console). It is created only after every check
// passed, and a run there is never overwritten.
#pragma once

#include <memory>
#include <string>

#include "config/config.h"
#include "metrics/run_log.h"

namespace llmtrain {

// runs/<config name>-<date>-<time>
std::string default_run_dir(const std::string& config_path);
// A config error if dir holds a run already: a second run there would mix two runs' records.
void check_run_dir_is_free(const std::string& dir);

class RunDirectory {
public:
    // Creates dir with config.toml, log.jsonl (its start record) and console.log, and points
    // the logger's copy and the crash record at them.
    RunDirectory(const std::string& dir, const Config& config, const std::string& config_path, int ranks);
    RunLog& log() { return *log_; }

private:
    std::unique_ptr<RunLog> log_;
};

}  // namespace llmtrain

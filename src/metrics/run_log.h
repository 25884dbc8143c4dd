// log.jsonl of a run directory: one JSON object per line, appended and flushed as it
// happens, so the file alone tells what became of a run:
//   {"event":"start",...}        first line: version, command, config, ranks, host, pid, run id
//   {"event":"step",...}         one per optimizer step; {"event":"eval",...} per evaluation;
//   {"event":"corrupt_block",...} a corrupt block of the training data met and skipped
//   then exactly one of
//   {"event":"end",...}          finished (exit_code 0)
//   {"event":"interrupted",...}  stopped by SIGINT / SIGTERM / SIGUSR1 at a step boundary
//   {"event":"error",...}        an error ended it (kind, message, exit_code)
//   {"event":"crash",...}        a fatal signal (SIGSEGV, SIGABRT, ...), written by its handler
//   or no closing record at all: the process was killed (SIGKILL, the node lost).
// A run continued in its own run directory (`--resume` with the same --run-dir) appends a
//   {"event":"resume",...}       the step and checkpoint it continues from, the process
// and then its own steps and closing record, after the earlier ones.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "metrics/step_record.h"

namespace llmtrain {

class RunLog : public StepObserver {
public:
    // Creates path (it must not exist: a run directory is never reused by another run), or
    // with `append` opens the existing file of the run this process continues.
    explicit RunLog(const std::string& path, bool append = false);
    ~RunLog() override;
    RunLog(const RunLog&) = delete;
    RunLog& operator=(const RunLog&) = delete;

    // Appends one record: the event, its fields and the wall-clock time (UTC).
    void write(const std::string& event, nlohmann::json fields = nlohmann::json::object());
    void after_step(const StepRecord& s) override;
    void after_eval(const EvalRecord& e) override;
    void after_corrupt_block(const CorruptBlockRecord& c) override;
    // Appends one record to the log.jsonl of another process (a rank other than 0 that ends the
    // job with an error). Best effort: false if the file is not there or not writable.
    static bool append_to(const std::string& path, const std::string& event, nlohmann::json fields);
    // The open file, for the crash record written from a signal handler.
    int fd() const { return fd_; }

private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace llmtrain

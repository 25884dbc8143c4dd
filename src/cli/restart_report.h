// What a restart cost, told once its first step is done: the steps trained before the failure
// that must be trained again, and where the time went between the process's start and that
// first step, in log.jsonl ("restart") and Prometheus (llmtrain_restart_*).
//
//   launch         the process's start (by the kernel) to MPI ready and the config read
//   communicators  the mesh's groups made (MPI sub-communicators, NCCL)
//   load           the model and optimizer built, the restart point agreed (local snapshot
//                  pieces fetched from peers) and the state read
//   first_step     the first step after it
#pragma once

#include <cstdint>
#include <string>

#include "cli/run_metrics.h"
#include "metrics/run_log.h"
#include "metrics/step_record.h"

namespace llmtrain {

// Unix seconds now, and when this process was started (from /proc; now where unknown).
double unix_now();
double process_start_unix();

struct RestartMarks {
    double process_start = 0, launched = 0, communicators = 0, loaded = 0;  // Unix seconds
};

struct RestartFacts {
    int64_t resumed_step = 0;
    std::string source;             // "local snapshot" or "checkpoint"
    std::string path;               // what was read
    int64_t interrupted_step = -1;  // the newest step the run had logged before (rank 0; -1 unknown)
    RestartMarks marks;
};

class RestartReport : public StepObserver {
public:
    // log: rank 0's run log (null elsewhere).
    RestartReport(RestartFacts facts, RunLog* log, RunMetrics& metrics) : facts_(std::move(facts)), log_(log), metrics_(metrics) {}
    void after_step(const StepRecord& record) override;

private:
    RestartFacts facts_;
    RunLog* log_;
    RunMetrics& metrics_;
    bool told_ = false;
};

}  // namespace llmtrain

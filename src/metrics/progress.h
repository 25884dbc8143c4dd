// The live progress line of `llmtrain train` on a terminal (rank 0):
//   step 120/500 | 1.97M tokens | loss 3.2101 | 25.3K tok/s | ETA 2m31s
// redrawn in place after every step (at most 10 times a second); step and evaluation lines
// print above it. Where stdout is not a terminal (a log file, a batch job) or the run is under
// mpirun it is not made, and the console keeps its one line per train.log_every steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "metrics/step_record.h"

namespace llmtrain {

class ProgressLine : public StepObserver {
public:
    // start_step: steps done before this process (a resumed run).
    ProgressLine(int64_t start_step, int64_t total_steps) : start_step_(start_step), total_steps_(total_steps) {}
    ~ProgressLine() override;
    void after_step(const StepRecord& s) override;
    // The line after step s, with `seconds_per_step` for the ETA.
    std::string text(const StepRecord& s, double seconds_per_step) const;

private:
    int64_t start_step_, total_steps_;
    int64_t tokens_ = 0;            // since this process started
    double mean_step_seconds_ = 0;  // exponential moving average, for the ETA
    std::chrono::steady_clock::time_point last_drawn_{};
};

// "1.97M", "25.3K", "812": three significant figures with a K / M / G / T suffix.
std::string short_count(double value);
// "2m31s", "1h04m", "45s".
std::string short_duration(double seconds);

}  // namespace llmtrain

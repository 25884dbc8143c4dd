// The step and evaluation lines of `llmtrain train` on the console (rank 0).
#pragma once

#include <cstdint>

#include "metrics/step_record.h"

namespace llmtrain {

class ConsoleObserver : public StepObserver {
public:
    // A line every log_every steps and at the last of total_steps.
    ConsoleObserver(int64_t log_every, int64_t total_steps) : log_every_(log_every), total_steps_(total_steps) {}
    void after_step(const StepRecord& s) override;
    void after_eval(const EvalRecord& e) override;

private:
    int64_t log_every_, total_steps_;
};

}  // namespace llmtrain

// anomalies.jsonl of a run directory: the quarantine log. One JSON object per health event,
// appended and flushed as it happens: the step, the kind, the statistic and its threshold,
// the action, the words of the log line, and for data whose update was not applied the
// global sample range and where those samples come from (files and document ids), so that a
// person can look at what was skipped.
#pragma once

#include <string>

#include "metrics/run_log.h"
#include "metrics/step_record.h"

namespace llmtrain {

class AnomalyLog : public StepObserver {
public:
    // Creates path (it must not exist), or with `append` continues the run's file.
    explicit AnomalyLog(const std::string& path, bool append = false) : log_(path, append) {}
    void after_anomaly(const AnomalyRecord& event) override;

private:
    RunLog log_;
};

}  // namespace llmtrain

#include "health/anomaly_log.h"

#include <cmath>

namespace llmtrain {

namespace {
// JSON has no NaN or Inf: such a statistic is written as null.
nlohmann::json number(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }
}  // namespace

void AnomalyLog::after_anomaly(const AnomalyRecord& e) {
    nlohmann::json fields = {{"step", e.step}, {"kind", e.kind}, {"action", e.action}, {"statistic", number(e.statistic)},
                             {"threshold", number(e.threshold)}, {"detail", e.detail}};
    if (e.rollback_to >= 0) fields["rollback_to"] = e.rollback_to;
    if (e.samples_end > e.samples_begin) {
        fields["skipped_samples"] = {e.samples_begin, e.samples_end};
        fields["skipped_data"] = e.samples_origin;
    }
    log_.write("anomaly", fields);
}

}  // namespace llmtrain

#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace llmtrain {

std::vector<PipeAction> one_f_one_b_schedule(int64_t stages, int64_t stage, int64_t micro_batches) {
    if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
        fail(ErrorKind::runtime, "1F1B schedule for stage ", stage, " of ", stages, " with ", micro_batches, " micro-batches");
    const int64_t warmup = std::min(stages - stage - 1, micro_batches);
    std::vector<PipeAction> actions;
    int64_t next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) actions.push_back({PipeOp::forward, next_forward});
    while (next_forward < micro_batches) {
        actions.push_back({PipeOp::forward, next_forward++});
        actions.push_back({PipeOp::backward, next_backward++});
    }
    while (next_backward < micro_batches) actions.push_back({PipeOp::backward, next_backward++});
    return actions;
}

int64_t one_f_one_b_in_flight(int64_t stages, int64_t stage, int64_t micro_batches) { return std::min(stages - stage, micro_batches); }

std::string schedule_text(const std::vector<PipeAction>& actions) {
    std::string text;
    for (const PipeAction& a : actions) text += cat(text.empty() ? "" : " ", a.op == PipeOp::forward ? "F" : "B", a.micro_batch);
    return text;
}

}  // namespace llmtrain

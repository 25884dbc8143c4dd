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

namespace {

// The k-th forward or backward of a stage under interleaving (see the header).
PipeAction interleaved_action(PipeOp op, int64_t k, int64_t stages, int64_t chunks) {
    const int64_t group = stages * chunks, in_group = k % group;
    const int64_t chunk = in_group / stages;
    return {op, (k / group) * stages + k % stages, op == PipeOp::forward ? chunk : chunks - 1 - chunk};
}

}  // namespace

std::vector<PipeAction> interleaved_schedule(int64_t stages, int64_t stage, int64_t micro_batches, int64_t chunks) {
    if (chunks == 1) return one_f_one_b_schedule(stages, stage, micro_batches);
    if (stages < 2 || stage < 0 || stage >= stages || chunks < 1 || micro_batches < 1 || micro_batches % stages)
        fail(ErrorKind::runtime, "interleaved schedule for stage ", stage, " of ", stages, " with ", chunks, " chunks and ", micro_batches,
             " micro-batches (a multiple of the stages)");
    const int64_t total = micro_batches * chunks;
    const int64_t warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
    std::vector<PipeAction> actions;
    int64_t next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) actions.push_back(interleaved_action(PipeOp::forward, next_forward, stages, chunks));
    while (next_forward < total) {
        actions.push_back(interleaved_action(PipeOp::forward, next_forward++, stages, chunks));
        actions.push_back(interleaved_action(PipeOp::backward, next_backward++, stages, chunks));
    }
    while (next_backward < total) actions.push_back(interleaved_action(PipeOp::backward, next_backward++, stages, chunks));
    return actions;
}

int64_t chunk_in_flight(const std::vector<PipeAction>& actions, int64_t chunk) {
    int64_t now = 0, most = 0;
    for (const PipeAction& a : actions) {
        if (a.chunk != chunk) continue;
        now += a.op == PipeOp::forward ? 1 : -1;
        most = std::max(most, now);
    }
    return most;
}

double pipeline_bubble_fraction(int64_t stages, int64_t micro_batches, int64_t chunks) {
    return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro_batches + stages - 1);
}

std::string schedule_text(const std::vector<PipeAction>& actions) {
    const bool chunked = std::any_of(actions.begin(), actions.end(), [](const PipeAction& a) { return a.chunk != 0; });
    std::string text;
    for (const PipeAction& a : actions) {
        text += cat(text.empty() ? "" : " ", a.op == PipeOp::forward ? "F" : "B", a.micro_batch);
        if (chunked) text += cat(".", a.chunk);
    }
    return text;
}

}  // namespace llmtrain

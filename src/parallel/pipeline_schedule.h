// Pipeline schedules as data: the list of actions one stage runs in one training step, for
// an interpreter (train/pipeline_runner) to execute. The transfers are implied: a forward
// on a stage other than the first receives its input from the previous stage, and a stage
// other than the last sends its output on; a backward receives the output's gradient from
// the next stage (unless last) and sends the input's gradient back (unless first).
//
// 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron's non-interleaved schedule):
// stage s of P runs W = min(P - s - 1, M) warm-up forwards, then alternates one forward and
// one backward, then drains the remaining backwards. At most min(P - s, M) micro-batches
// are in flight on a stage (W + 1, or all M when M <= W), so it keeps that many activation
// sets instead of GPipe's M. Fewer micro-batches than stages (M < P) are allowed: the
// early stages then run all forwards before any backward, and the bubble, (P - 1) /
// (M + P - 1) of the step, grows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmtrain {

enum class PipeOp { forward, backward };

struct PipeAction {
    PipeOp op;
    int64_t micro_batch;
    bool operator==(const PipeAction&) const = default;
};

std::vector<PipeAction> one_f_one_b_schedule(int64_t stages, int64_t stage, int64_t micro_batches);
// Micro-batches a stage holds at once under 1F1B: min(P - s, M).
int64_t one_f_one_b_in_flight(int64_t stages, int64_t stage, int64_t micro_batches);
// "F0 F1 B0 F2 B1 B2": for tests and logs.
std::string schedule_text(const std::vector<PipeAction>& actions);

}  // namespace llmtrain

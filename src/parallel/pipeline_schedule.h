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
//
// Interleaved 1F1B (Narayanan et al. 2021, Megatron's interleaved schedule): the model is cut
// into P * V chunks and stage s holds the V chunks s, s + P, s + 2P, ... (its chunk c is model
// chunk c * P + s). A micro-batch crosses the stages V times: the output of chunk c on the last
// stage goes on to chunk c + 1 on the first (the transfers wrap around the ring), and a
// gradient of chunk c + 1 on the first stage goes back to chunk c on the last. Forwards run in
// groups of P micro-batches per chunk: forward k of a stage is micro-batch
// (k / PV) * P + k % P of chunk (k % PV) / P, and backward k the same micro-batch of chunk
// V - 1 - (k % PV) / P; so every stage sends and receives in the same order, which an
// in-order transport (NCCL, MPI without tags) needs. Stage s warms up with
// min((P - s - 1) * 2 + (V - 1) * P, M * V) forwards, then alternates, then drains. M must be a
// multiple of P (Megatron's rule). Each chunk is 1/V of a stage's work, so the idle time is
// (P - 1) chunk slots of the V * M + P - 1 a step takes: the bubble falls to
// (P - 1) / (V * M + P - 1), at the price of V times as many transfers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmtrain {

enum class PipeOp { forward, backward };

struct PipeAction {
    PipeOp op;
    int64_t micro_batch;
    int64_t chunk = 0;  // which of the stage's model chunks (0 without interleaving)
    bool operator==(const PipeAction&) const = default;
};

std::vector<PipeAction> one_f_one_b_schedule(int64_t stages, int64_t stage, int64_t micro_batches);
// Micro-batches a stage holds at once under 1F1B: min(P - s, M).
int64_t one_f_one_b_in_flight(int64_t stages, int64_t stage, int64_t micro_batches);
// The interleaved schedule of a stage holding `chunks` chunks; with one chunk, 1F1B.
std::vector<PipeAction> interleaved_schedule(int64_t stages, int64_t stage, int64_t micro_batches, int64_t chunks);
// The most micro-batches of `chunk` whose forward has run and backward has not, at any point
// of a stage's schedule: the activation sets that chunk keeps.
int64_t chunk_in_flight(const std::vector<PipeAction>& actions, int64_t chunk);
// The share of a step each stage idles: (P - 1) / (V * M + P - 1).
double pipeline_bubble_fraction(int64_t stages, int64_t micro_batches, int64_t chunks);
// "F0 F1 B0 F2 B1 B2": for tests and logs. Tables with chunks name them: "F0.1" is the
// forward of micro-batch 0 on chunk 1.
std::string schedule_text(const std::vector<PipeAction>& actions);

}  // namespace llmtrain

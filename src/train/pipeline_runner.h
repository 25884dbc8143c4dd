// The interpreter of pipeline schedules: runs this stage's actions (parallel/
// pipeline_schedule) on the model, with the transfers each action implies over the pp
// group. With one stage the same code runs the micro-batches one after another, so a
// single process and every pipeline layout share one path. With model chunks (interleaved
// 1F1B) the pieces of the model form a ring: chunk c of the last stage feeds chunk c + 1 of
// the first, so the previous and next stage are taken modulo the stages.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"
#include "parallel/context.h"
#include "parallel/pipeline_schedule.h"

namespace llmtrain {

// Tokens and targets of one micro-batch (i32 [batch * seq_len] each).
struct MicroBatch {
    Tensor tokens, targets;
};

class PipelineRunner {
public:
    // pp: the Comm of the pp group's transfers (the context's, or an event-ordered one).
    PipelineRunner(Transformer& model, const ParallelContext& ctx, Comm& pp, int64_t micro_batches);

    // One training step's forwards and backwards, in (interleaved) 1F1B order. batch_of(m) gives
    // micro-batch m (called just before the forward of the chunk that reads it, once per
    // micro-batch and in order; the returned tensors are read at once).
    // before_backward(m) runs before each backward. Every backward scales the loss by
    // loss_scale. On the last stage the micro-batches' mean losses add up in the model's
    // loss_sum() on the device (reset here first); nothing is read back.
    void train_step(const std::function<MicroBatch(int64_t)>& batch_of, int64_t batch, int64_t seq_len, double loss_scale,
                    const std::function<void(int64_t)>& before_backward);
    // A forward pass only (evaluation): the mean loss on the last stage, 0 on other stages.
    double forward_only(const MicroBatch& micro_batch, int64_t batch, int64_t seq_len);

private:
    void forward(const PipeAction& action, const MicroBatch& data, int64_t batch, int64_t seq_len, double loss_scale);
    void backward(const PipeAction& action, int64_t batch, int64_t seq_len, double loss_scale);
    // The chunk this stage reads micro-batches for: the head's on the last stage (targets),
    // chunk 0 elsewhere (tokens on the first stage).
    bool reads_data(int64_t chunk) const { return chunk == (ctx_.last_stage() ? chunks_ - 1 : 0); }
    bool first_piece(int64_t chunk) const { return ctx_.first_stage() && chunk == 0; }
    bool last_piece(int64_t chunk) const { return ctx_.last_stage() && chunk == chunks_ - 1; }
    int prev() const { return (pp_.rank() + pp_.size() - 1) % pp_.size(); }
    int next() const { return (pp_.rank() + 1) % pp_.size(); }

    Transformer& model_;
    const ParallelContext& ctx_;
    Comm& pp_;
    int64_t chunks_;
    std::vector<PipeAction> schedule_;
    std::vector<CommHandle> activation_sends_;  // per activation set (of every chunk)
    std::vector<CommHandle> grad_sends_;        // per gradient buffer (Transformer::grad_buffer)
};

}  // namespace llmtrain

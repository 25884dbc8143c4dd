// The interpreter of pipeline schedules: runs this stage's actions (parallel/
// pipeline_schedule) on the model, with the transfers each action implies over the pp
// group. With one stage the same code runs the micro-batches one after another, so a
// single process and every pipeline layout share one path.
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

    // One training step's forwards and backwards, in 1F1B order. batch_of(m) gives micro-batch
    // m (called just before its forward; the returned tensors are read at once).
    // before_backward(m) runs before each backward. Every backward scales the loss by
    // loss_scale. Returns the sum of the micro-batches' mean losses on the last stage (0 on
    // other stages).
    double train_step(const std::function<MicroBatch(int64_t)>& batch_of, int64_t batch, int64_t seq_len, double loss_scale,
                      const std::function<void(int64_t)>& before_backward);
    // A forward pass only (evaluation): the mean loss on the last stage, 0 on other stages.
    double forward_only(const MicroBatch& micro_batch, int64_t batch, int64_t seq_len);

private:
    void forward(int64_t micro_batch, const MicroBatch& data, int64_t batch, int64_t seq_len, double& loss_sum);
    void backward(int64_t micro_batch, int64_t batch, int64_t seq_len, double loss_scale);
    int prev() const { return pp_.rank() - 1; }
    int next() const { return pp_.rank() + 1; }

    Transformer& model_;
    const ParallelContext& ctx_;
    Comm& pp_;
    std::vector<PipeAction> schedule_;
    int64_t sets_;
    std::vector<CommHandle> activation_sends_;  // per activation set
    CommHandle grad_send_;
};

}  // namespace llmtrain

#include "train/pipeline_runner.h"

namespace llmtrain {

PipelineRunner::PipelineRunner(Transformer& model, const ParallelContext& ctx, Comm& pp, int64_t micro_batches)
    : model_(model), ctx_(ctx), pp_(pp), schedule_(one_f_one_b_schedule(ctx.mesh.pp(), ctx.coord().pp, micro_batches)),
      sets_(model.partition().activation_sets), activation_sends_(static_cast<size_t>(sets_)) {
    const int64_t needed = one_f_one_b_in_flight(ctx.mesh.pp(), ctx.coord().pp, micro_batches);
    if (sets_ < needed) fail(ErrorKind::runtime, "pipeline stage ", ctx.coord().pp, " holds ", sets_, " activation sets; 1F1B needs ", needed);
}

double PipelineRunner::train_step(const std::function<MicroBatch(int64_t)>& batch_of, int64_t batch, int64_t seq_len, double loss_scale,
                                  const std::function<void(int64_t)>& before_backward) {
    double loss_sum = 0;
    for (const PipeAction& action : schedule_) {
        if (action.op == PipeOp::forward) {
            forward(action.micro_batch, batch_of(action.micro_batch), batch, seq_len, loss_sum);
        } else {
            before_backward(action.micro_batch);
            backward(action.micro_batch, batch, seq_len, loss_scale);
        }
    }
    for (CommHandle& h : activation_sends_) h.wait();
    grad_send_.wait();
    return loss_sum;
}

// A stage's output goes to the next stage asynchronously; the set's buffer is reused only
// after that send has completed.
void PipelineRunner::forward(int64_t micro_batch, const MicroBatch& data, int64_t batch, int64_t seq_len, double& loss_sum) {
    const int64_t set = micro_batch % sets_;
    activation_sends_[static_cast<size_t>(set)].wait();
    if (!ctx_.first_stage()) pp_.recv(model_.hidden_in(set, batch, seq_len), prev());
    const double loss = model_.forward(set, data.tokens, data.targets, batch, seq_len);
    if (ctx_.last_stage()) loss_sum += loss;
    else activation_sends_[static_cast<size_t>(set)] = pp_.send_async(model_.hidden_out(set), next());
}

void PipelineRunner::backward(int64_t micro_batch, int64_t batch, int64_t seq_len, double loss_scale) {
    const int64_t set = micro_batch % sets_;
    grad_send_.wait();  // the gradient buffer is about to be overwritten
    if (!ctx_.last_stage()) pp_.recv(model_.grad_output(batch, seq_len), next());
    model_.backward(set, loss_scale);
    if (!ctx_.first_stage()) grad_send_ = pp_.send_async(model_.grad_input(), prev());
}

double PipelineRunner::forward_only(const MicroBatch& data, int64_t batch, int64_t seq_len) {
    for (CommHandle& h : activation_sends_) h.wait();
    if (!ctx_.first_stage()) pp_.recv(model_.hidden_in(0, batch, seq_len), prev());
    const double loss = model_.forward(0, data.tokens, data.targets, batch, seq_len);
    if (!ctx_.last_stage()) pp_.send(model_.hidden_out(0), next());
    return ctx_.last_stage() ? loss : 0.0;
}

}  // namespace llmtrain

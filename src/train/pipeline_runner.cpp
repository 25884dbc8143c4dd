#include "train/pipeline_runner.h"

namespace llmtrain {

PipelineRunner::PipelineRunner(Transformer& model, const ParallelContext& ctx, Comm& pp, int64_t micro_batches)
    : model_(model), ctx_(ctx), pp_(pp), chunks_(model.partition().chunks),
      schedule_(interleaved_schedule(ctx.mesh.pp(), ctx.coord()[mesh_dim::pp], micro_batches, chunks_)) {
    int64_t sets = 0;
    for (int64_t c = 0; c < chunks_; ++c) {
        const int64_t held = model.partition().activation_sets[static_cast<size_t>(c)], needed = chunk_in_flight(schedule_, c);
        if (held < needed)
            fail(ErrorKind::runtime, "pipeline stage ", ctx.coord()[mesh_dim::pp], " chunk ", c, " holds ", held, " activation sets; its schedule needs ", needed);
        sets += held;
    }
    activation_sends_.resize(static_cast<size_t>(sets));
    grad_sends_.resize(static_cast<size_t>(model.grad_buffer(sets - 1) + 1));
}

void PipelineRunner::train_step(const std::function<MicroBatch(int64_t)>& batch_of, int64_t batch, int64_t seq_len, double loss_scale,
                                const std::function<void(int64_t)>& before_backward) {
    model_.reset_loss_sum();  // every stage: the MoE layers' loads and balancing losses too
    for (const PipeAction& action : schedule_) {
        if (action.op == PipeOp::forward) {
            forward(action, reads_data(action.chunk) ? batch_of(action.micro_batch) : MicroBatch{}, batch, seq_len, loss_scale);
        } else {
            before_backward(action.micro_batch);
            backward(action, batch, seq_len, loss_scale);
        }
    }
    for (CommHandle& h : activation_sends_) h.wait();
    for (CommHandle& h : grad_sends_) h.wait();
}

// A stage's output goes to the next stage asynchronously; the set's buffer is reused only
// after that send has completed.
// The backward of every micro-batch follows with loss_scale: the classifier computes the
// logits' gradient in its forward pass.
void PipelineRunner::forward(const PipeAction& action, const MicroBatch& data, int64_t batch, int64_t seq_len, double loss_scale) {
    const int64_t set = model_.activation_set(action.chunk, action.micro_batch);
    activation_sends_[static_cast<size_t>(set)].wait();
    if (!first_piece(action.chunk)) pp_.recv(model_.hidden_in(set, batch, seq_len), prev());
    model_.forward_pass(set, data.tokens, data.targets, batch, seq_len, loss_scale);
    if (!last_piece(action.chunk)) activation_sends_[static_cast<size_t>(set)] = pp_.send_async(model_.hidden_out(set), next());
}

void PipelineRunner::backward(const PipeAction& action, int64_t batch, int64_t seq_len, double loss_scale) {
    const int64_t set = model_.activation_set(action.chunk, action.micro_batch);
    CommHandle& grad_send = grad_sends_[static_cast<size_t>(model_.grad_buffer(set))];
    grad_send.wait();  // the gradient buffer is about to be overwritten
    if (!last_piece(action.chunk)) pp_.recv(model_.grad_output(set, batch, seq_len), next());
    model_.backward(set, loss_scale);
    if (!first_piece(action.chunk)) grad_send = pp_.send_async(model_.grad_input(set), prev());
}

// The chunks in order, each waiting for the one before it (the previous stage's, or the
// last stage's previous chunk).
double PipelineRunner::forward_only(const MicroBatch& data, int64_t batch, int64_t seq_len) {
    for (CommHandle& h : activation_sends_) h.wait();
    double loss = 0;
    for (int64_t c = 0; c < chunks_; ++c) {
        const int64_t set = model_.activation_set(c, 0);
        if (!first_piece(c)) pp_.recv(model_.hidden_in(set, batch, seq_len), prev());
        const double chunk_loss = model_.forward(set, data.tokens, data.targets, batch, seq_len);
        if (last_piece(c)) loss = chunk_loss;
        else pp_.send(model_.hidden_out(set), next());
    }
    return loss;
}

}  // namespace llmtrain

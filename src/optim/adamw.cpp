#include "optim/adamw.h"

#include <cmath>

namespace llmtrain {

double clip_scale(double grad_norm, double max_norm) {
    if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0;
    return max_norm / (grad_norm + 1e-6);
}

namespace {
std::vector<OwnedPiece> everything(const Parameters& params) { return {{0, params.all_grads().numel(), params.all_grads(), {}, {}}}; }

int64_t total_length(const std::vector<OwnedPiece>& pieces) {
    int64_t n = 0;
    for (const OwnedPiece& p : pieces) n += p.end - p.begin;
    return n;
}
}  // namespace

AdamW::AdamW(const OptimizerConfig& config, Parameters& params) : AdamW(config, params, everything(params)) {}

AdamW::AdamW(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces)
    : config_(config), params_(params), pieces_(std::move(pieces)), m_(params.new_tensor(params.dtype(), {total_length(pieces_)})),
      v_(params.new_tensor(params.dtype(), {total_length(pieces_)})) {}

Tensor AdamW::moment(bool second, FlatRange range) const {
    int64_t state_offset = 0;  // where the current piece's moments start
    for (const OwnedPiece& piece : pieces_) {
        if (range.begin >= piece.begin && range.end <= piece.end) return (second ? v_ : m_).view().slice_rows(state_offset + range.begin - piece.begin, range.size());
        state_offset += piece.end - piece.begin;
    }
    fail(ErrorKind::runtime, "AdamW: flat elements [", range.begin, ", ", range.end, ") are not inside one of the pieces this rank updates");
}

void AdamW::set_rank_local_state(const std::string& name, const std::vector<double>&) {
    fail(ErrorKind::data, "checkpoint: optimizer/", name, " is no state of AdamW");
}

void AdamW::step(Backend& backend, double lr, double grad_scale) {
    ++steps_taken_;
    const Tensor values = params_.all_values();
    // The compute copy of what this rank updates is written with the update; under ZeRO-1
    // the other ranks' pieces of it arrive by the all-gather of the compute copy.
    const Tensor copy = params_.has_compute_copy() ? params_.all_compute_values() : Tensor();
    int64_t state_offset = 0;  // where the current piece's moments start
    for (const OwnedPiece& piece : pieces_) {
        for_each_param_in(params_, piece, [&](size_t index, int64_t begin, int64_t end) {
            AdamWStep s;
            s.lr = lr;
            s.beta1 = config_.beta1;
            s.beta2 = config_.beta2;
            s.eps = config_.eps;
            s.weight_decay = params_.info(index).weight_decay ? config_.weight_decay : 0.0;
            s.grad_scale = grad_scale;
            s.step = steps_taken_;
            const int64_t in_piece = begin - piece.begin, count = end - begin;
            const bool own_values = !piece.values.empty();  // ZeRO-3: the piece's shards
            const Tensor master = own_values ? piece.values.slice_rows(in_piece, count) : values.slice_rows(begin, count);
            const Tensor compute = own_values ? (piece.compute_values.empty() ? Tensor() : piece.compute_values.slice_rows(in_piece, count))
                                              : (copy.empty() ? Tensor() : copy.slice_rows(begin, count));
            backend.adamw({.param = master, .grad = piece.grads.slice_rows(in_piece, count),
                           .m = m_.view().slice_rows(state_offset + in_piece, count), .v = v_.view().slice_rows(state_offset + in_piece, count),
                           .param_copy = compute, .step = s});
        });
        state_offset += piece.end - piece.begin;
    }
}

}  // namespace llmtrain

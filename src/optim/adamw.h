// AdamW over the parts of a Parameters registry this rank updates. Each part is a range of
// the flat parameter buffer with its reduced gradients (OwnedPiece): one range covering
// everything on a single process or under plain data parallelism, this rank's pieces under
// ZeRO-1. Moments m and v are kept for those ranges only, so the optimizer state per rank
// is 1/dp of the whole under ZeRO-1. Weight decay is decoupled and applies only to
// parameters registered with weight_decay (matrices and embeddings, not norms or biases).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/parameters.h"
#include "parallel/gradient_sync.h"

namespace llmtrain {

// The factor that brings the gradient norm down to max_norm (1 when within it or max_norm = 0).
double clip_scale(double grad_norm, double max_norm);

// The gradients in `pieces` of the parameters for which counts(index) holds, as runs of
// consecutive elements (a parameter replicated on several ranks is counted on one of them
// only): what the gradient norm sums the squares of, in one pass.
template <class Counts>
std::vector<Tensor> gradient_runs(const Parameters& params, const std::vector<OwnedPiece>& pieces, Counts&& counts);

// State a rank keeps for itself alone (1-bit Adam's error feedback): saved in its own
// checkpoint file under optimizer/<name> and restored on the same layout.
struct RankLocalState {
    std::string name;
    const std::vector<float>* values;
};

class AdamW {
public:
    // Every parameter, with the gradients in place (a single process).
    AdamW(const OptimizerConfig& config, Parameters& params);
    AdamW(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces);
    virtual ~AdamW() = default;
    // One update with learning rate lr and the gradient multiplied by grad_scale.
    virtual void step(Backend& backend, double lr, double grad_scale);
    // Whether the next step wants the gradients reduced over dp first (1-bit Adam after the
    // freeze works on each rank's own gradients).
    virtual bool reduces_gradients() const { return true; }
    // Bytes of momentum this rank has sent so far (compressed optimizers).
    virtual int64_t bytes_sent() const { return 0; }
    virtual std::vector<RankLocalState> rank_local_state() const { return {}; }
    // Sets the state named `name` (one of rank_local_state()'s) from a checkpoint.
    virtual void set_rank_local_state(const std::string& name, const std::vector<double>& values);
    int64_t steps_taken() const { return steps_taken_; }
    // Checkpoints: the ranges this rank updates, their moments back to back in piece order,
    // and the step count a resumed run continues from.
    const std::vector<OwnedPiece>& pieces() const { return pieces_; }
    Tensor exp_avg() const { return m_.view(); }
    Tensor exp_avg_sq() const { return v_.view(); }
    // The first (second: second = true) moments of flat elements `range`, which lie in one piece.
    Tensor moment(bool second, FlatRange range) const;
    void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
    size_t state_bytes() const { return state_bytes_for(m_.view().numel(), m_.view().dtype()); }
    // Moments m and v for owned_numel elements in the master dtype.
    static size_t state_bytes_for(int64_t owned_numel, DType master) { return 2 * static_cast<size_t>(owned_numel) * dtype_size(master); }

protected:
    OptimizerConfig config_;
    Parameters& params_;
    std::vector<OwnedPiece> pieces_;
    OwnedTensor m_, v_;
    int64_t steps_taken_ = 0;
};

// For each parameter overlapping the piece: fn(parameter index, first flat element, end).
template <class Fn>
void for_each_param_in(const Parameters& params, const OwnedPiece& piece, Fn&& fn) {
    for (size_t i = 0; i < params.count(); ++i) {
        const ParamInfo& p = params.info(i);
        const int64_t begin = std::max(piece.begin, p.offset), end = std::min(piece.end, p.offset + p.shape.numel());
        if (begin < end) fn(i, begin, end);
    }
}

// Consecutive counted parameters make one run (on one process: all of them).
template <class Counts>
std::vector<Tensor> gradient_runs(const Parameters& params, const std::vector<OwnedPiece>& pieces, Counts&& counts) {
    std::vector<Tensor> runs;
    for (const OwnedPiece& piece : pieces) {
        int64_t run_begin = 0, run_end = 0;  // the run of counted elements not listed yet
        const auto flush = [&] {
            if (run_end > run_begin) runs.push_back(piece.grads.slice_rows(run_begin - piece.begin, run_end - run_begin));
            run_begin = run_end = 0;
        };
        for_each_param_in(params, piece, [&](size_t index, int64_t begin, int64_t end) {
            if (!counts(index)) return flush();
            if (run_end != begin) flush(), run_begin = begin;
            run_end = end;
        });
        flush();
    }
    return runs;
}

}  // namespace llmtrain

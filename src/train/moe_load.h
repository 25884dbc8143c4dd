// What the mixture-of-experts layers did in a training step, reduced over the job, and the
// balancing that follows from it:
//  - each MoE layer's expert load (its most loaded expert's assignments over the mean
//    expert's: 1 is perfect balance, E is every assignment on one expert) and the share of
//    assignments a capacity dropped, into the step record;
//  - the balancing losses (aux and z, with their coefficients): the mean over the step's
//    micro-batches and the data-parallel ranks;
//  - load_balancing = "expert_bias" (DeepSeek-V3's auxiliary-loss-free balancing): after each
//    step, before the update, expert e's bias of each layer moves by
//        b_e += rate * sign(mean_e' load_e' - load_e)
//    from the job's load of the step. Every rank holds every layer's biases (the loads are
//    reduced over the world, so all compute the same ones) and sets those of the layers it
//    holds; they are saved in the checkpoint's manifest and restored exactly.
// One reduction over the world of n_layers * (E + 1) + 1 numbers and one read of the
// balancing losses (a host synchronization) per step; nothing for a dense model.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "metrics/step_record.h"
#include "model/transformer.h"
#include "parallel/context.h"

namespace llmtrain {

class MoeBalance {
public:
    explicit MoeBalance(const Config& config);
    // The step's MoE figures into s.moe and s.balance_loss, and the expert biases moved.
    void close_step(Transformer& model, const ParallelContext& ctx, StepRecord& s);
    // The expert biases as JSON for the manifest ({"expert_bias": {"layer": [...]}}); empty
    // when there are none.
    std::string state() const;
    // From a manifest's state (empty: zeros, as a run from a checkpoint without them), set
    // into the model. Throws a data error naming `path` when the layers or expert counts differ.
    void restore(const std::string& state, const std::string& path, Transformer& model);

private:
    void set_biases(Transformer& model) const;
    Config config_;
    std::map<int64_t, std::vector<float>> bias_;  // by global layer; expert_bias only
};

// max_e load[e] / mean_e load[e]; 0 when nothing was routed.
double load_max_over_mean(const std::vector<double>& load);

}  // namespace llmtrain

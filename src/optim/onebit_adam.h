// 1-bit Adam (Tang et al. 2021): AdamW, gradients all-reduced, for optimizer.freeze_step
// steps; then the variance v is frozen and each step is
//   m_r = b1 m + (1 - b1) g_r            on each rank r, from its own gradient g_r (no all-reduce)
//   m   = compressed average of m_r      (optim/onebit_compression.h: sign bits + error feedback)
//   p  -= lr ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^F)) + eps) + wd p )
// with F = freeze_step: the frozen variance keeps the bias correction of its last update.
// Every rank ends with the same m, so m and v are saved as AdamW's moments; each rank's
// error feedback is its own state (rank_local_state).
//
// The gradient each rank holds is its share of the job's sum (the loss is divided by
// dp * grad_accum), so g_r = dp x that share is the rank's own estimate of the gradient and
// the average over ranks is the batch gradient.
//
// The compression runs on the host, on one range covering the whole flat buffer: 1-bit Adam
// keeps the full momentum on every rank, which rules out ZeRO's sharding.
#pragma once

#include <memory>

#include "optim/adamw.h"
#include "optim/onebit_compression.h"

namespace llmtrain {

// Refuses, naming the keys, what 1-bit Adam cannot run with on a dp group of `dp` ranks.
void check_optimizer_layout(const OptimizerConfig& optimizer, const ParallelConfig& parallel, int64_t dp);

class OnebitAdam final : public AdamW {
public:
    OnebitAdam(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces, Comm& dp);
    void step(Backend& backend, double lr, double grad_scale) override;
    bool reduces_gradients() const override { return steps_taken() < config_.freeze_step; }
    int64_t bytes_sent() const override { return allreduce_.bytes_sent(); }
    std::vector<RankLocalState> rank_local_state() const override;
    void set_rank_local_state(const std::string& name, const std::vector<double>& values) override;

private:
    Comm& dp_;
    CompressedAllReduce allreduce_;
};

// AdamW or OnebitAdam, as optimizer.name says.
std::unique_ptr<AdamW> make_optimizer(const OptimizerConfig& config, Parameters& params, std::vector<OwnedPiece> pieces, Comm& dp);

}  // namespace llmtrain

// AdamW over a Parameters registry: moments m and v in one flat buffer each, laid out like
// the parameters. Weight decay is decoupled and applies only to parameters registered with
// weight_decay (matrices and embeddings, not norms or biases).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "config/config.h"
#include "model/parameters.h"

namespace llmtrain {

// sqrt(sum of squares of every gradient): the global gradient norm.
double global_grad_norm(Backend& backend, const Parameters& params);
// The factor that brings the gradient norm down to max_norm (1 when within it or max_norm = 0).
double clip_scale(double grad_norm, double max_norm);

class AdamW {
public:
    AdamW(const OptimizerConfig& config, Parameters& params);
    // One update with learning rate lr and the gradient multiplied by grad_scale.
    void step(Backend& backend, double lr, double grad_scale);
    int64_t steps_taken() const { return steps_taken_; }
    size_t state_bytes() const { return 2 * m_.view().bytes(); }

private:
    OptimizerConfig config_;
    Parameters& params_;
    OwnedTensor m_, v_;
    int64_t steps_taken_ = 0;
};

}  // namespace llmtrain

// The N of the MFU formula (ops/step_model.h, model_flops_per_token: PaLM's count, which
// bench, plan and the metrics' llmtrain_mfu_ratio share) for a running trainer.
#pragma once

#include "plan/step_model.h"
#include "train/trainer.h"

namespace llmtrain {

// Parameters of the whole model, summed over the tp x pp ranks of dp rank 0 (a collective
// over the world: every rank calls it).
double total_parameters(Trainer& trainer);

}  // namespace llmtrain

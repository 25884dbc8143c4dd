// Model FLOPs of training, for MFU (bench, and the metrics' llmtrain_mfu_ratio): PaLM's
// count (Chowdhery et al. 2022, appendix B), 6N + 12*L*H*Q*T FLOPs per token, N all
// parameters (as llm.c counts them), L layers, H heads, Q head dimension, T the sequence.
#pragma once

#include "config/config.h"
#include "train/trainer.h"

namespace llmtrain {

double model_flops_per_token(const Config& config, double parameters);
// Parameters of the whole model, summed over the tp x pp ranks of dp rank 0 (a collective
// over the world: every rank calls it).
double total_parameters(Trainer& trainer);

}  // namespace llmtrain

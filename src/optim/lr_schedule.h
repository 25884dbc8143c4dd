// Learning-rate schedule: linear warmup, then decay to a floor.
//   warmup = min(warmup_steps, total_steps): a run shorter than its warmup (a smoke test
//            with --set train.steps=5) warms up over the whole run and ends at lr
//   step < warmup:  lr * (step + 1) / warmup
//   after:          p = (step - warmup) / (steps - warmup) in [0, 1]
//     cosine:   floor + (lr - floor) * (1 + cos(pi p)) / 2
//     linear:   floor + (lr - floor) * (1 - p)
//     constant: lr
//   floor = lr * min_lr_ratio. Steps are 0-based.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace llmtrain {

double learning_rate_at(const OptimizerConfig& optimizer, int64_t step, int64_t total_steps);

}  // namespace llmtrain

// Loading a checkpoint into this rank, whatever tp / pp / dp / ZeRO-1 layout saved it: each
// tensor this rank holds is assembled whole from the parts in every rank file (each part
// says where its values sit in the global tensor), and this rank's part is taken from it;
// the AdamW moments likewise for the ranges this rank updates. No offline converter.
#pragma once

#include <string>

#include "backend/backend.h"
#include "checkpoint/manifest.h"
#include "model/parameters.h"
#include "optim/adamw.h"

namespace llmtrain {

// Fills the master weights (and rebuilds the compute copy from them) and the moments.
// Throws Error(data) naming the file and the tensor when a part is missing, damaged or of
// another shape.
// The master weights alone (generate, eval: no optimizer), refreshing the compute copy.
void load_checkpoint_weights(const std::string& path, const Manifest& manifest, Parameters& params, Backend& backend);
void load_checkpoint_tensors(const std::string& path, const Manifest& manifest, Parameters& params, AdamW& optimizer, Backend& backend);
// The optimizer's rank-local state (1-bit Adam's error feedback) from world rank
// `world_rank`'s file, when the checkpoint was saved by the same layout (tp, dp, pp as in
// `manifest_of_run`); otherwise the state stays as it is (zero: a fresh error feedback).
// Returns whether it was loaded.
bool load_rank_local_state(const std::string& path, const Manifest& manifest, int world_rank, bool same_layout, AdamW& optimizer);

}  // namespace llmtrain

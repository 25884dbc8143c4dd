// train.init_from: the weights a fresh run starts from (step 0, a fresh optimizer and data
// order), verified before a value is read:
//  - Hugging Face weights: a .safetensors file, or a directory holding model.safetensors (such
//    as `checkpoint export` writes): the header's layout, and the XXH64 of the data where the
//    export recorded one;
//  - an llmtrain checkpoint directory (its weights alone, whatever layout saved them): its
//    manifest's own checksum and every rank file's size and XXH64, as a resume verifies them,
//    and a model of the config's shape.
#pragma once

#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "model/parameters.h"

namespace llmtrain {

// What a run starting from `path` reads: the checkpoint directory, or the .safetensors file.
std::string initial_weights_source(const std::string& path);
// Fills this rank's part of every parameter's master weights (and refreshes the compute copy)
// from the weights at path. Throws Error(data) when they fail verification, Error(config)
// naming the key or tensor when they are another model's.
void load_weights_to_start_from(const std::string& path, const Config& config, Parameters& params, Backend& backend);

}  // namespace llmtrain

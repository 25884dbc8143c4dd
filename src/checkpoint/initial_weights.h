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

#include <optional>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "config/config.h"

namespace llmtrain {

// Before the model is allocated: Hugging Face weights at config.train.init_from whose experts
// do not fit model.moe (their count, width, or which layers hold them) are refused naming the
// key and the value they need (checkpoint/hf_moe.h). An llmtrain checkpoint's model is
// checked by checkpoint_to_start_from, once its files are verified.
void check_initial_weights_fit(const Config& config);
// What a run starting from `path` reads: the checkpoint directory, or the .safetensors file.
std::string initial_weights_source(const std::string& path);
// When path is an llmtrain checkpoint directory: its manifest, once problem_of (a resume's
// verification, split over the ranks) passed it and its model is of the config's shape; the
// run then loads its weights as a resume does (checkpoint/state_load.h). None when path holds
// Hugging Face weights (checkpoint/safetensors.h: HfWeights verifies them). Throws
// Error(data) when the checkpoint fails verification, Error(config) naming the first model
// key that differs.
std::optional<Manifest> checkpoint_to_start_from(const std::string& path, const Config& config, const ProblemOf& problem_of);

}  // namespace llmtrain

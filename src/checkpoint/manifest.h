// manifest.json of a checkpoint: the state that is not tensors (step, optimizer step count,
// loss scale, data position, seed), the effective config of the run that saved it, the mesh
// it was saved on, and every rank file with its size and XXH64 checksum. It is written last,
// by rank 0, once every rank's file is durable: a directory without it is not a checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/loader.h"

namespace llmtrain {

struct CheckpointFile {
    std::string name;    // "rank_00003.h5", in the checkpoint directory
    uint64_t bytes = 0;
    uint64_t xxh64 = 0;
};

struct Manifest {
    int64_t step = 0;                 // optimizer steps taken: the run resumes at this step
    int64_t tokens_seen = 0;
    int64_t resumes = 0;              // times the run that saved it had been resumed (restarts)
    int64_t optimizer_steps = 0;      // AdamW's bias-correction count (skipped steps excluded)
    double loss_scale = 1;
    int64_t loss_scale_good_steps = 0;
    std::optional<LoaderState> data;  // the loader's position; none for the stateless text / tokens windows
    uint64_t seed = 0;
    int world_size = 1, tp = 1, dp = 1, pp = 1;
    int zero_stage = 0;               // as it applied (0 on one dp rank)
    std::string monitor_state;        // the health monitor's windows and counters (JSON); empty: none
    std::string config_toml;          // the effective config of the run that saved it
    std::string created;              // UTC time of the commit
    std::vector<CheckpointFile> files;
};

std::string manifest_to_json(const Manifest& manifest);
// Throws Error(data) naming path and the key that is missing or malformed. A checkpoint of an
// earlier version is read as this one (its config's retired keys replaced).
Manifest manifest_from_json(const std::string& text, const std::string& path);

}  // namespace llmtrain

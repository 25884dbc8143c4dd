// manifest.json of a checkpoint: the state that is not tensors (step, optimizer step count,
// loss scale, data position, seed, global batch), the effective config of the run that saved
// it, the mesh it was saved on, the run it belongs to, and every rank file with its size and
// XXH64 checksum. It is written last, by rank 0, once every rank's file is durable: a
// directory without it is not a checkpoint.
//
// The manifest checks itself: `manifest_xxh64` is the XXH64 of the rest of the document in
// compact JSON (nlohmann's dump() of the object without that key), so a hand-edited `step`,
// a cut file or a flipped byte in the config is found before anything trusts it.
//
// Format versions: 1 (no run id, no global batch, no checksum of its own: read as a run of
// an earlier llmtrain), 2 (all three, the checksum required; the mesh's zero1) and 3 (the
// mesh's zero_stage; rank files of pieces by placement, checkpoint/rank_snapshot.h).
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
    // The run that wrote it, the same for every checkpoint of its chain whatever the restarts
    // in between (16 hex digits); empty: a checkpoint of an earlier llmtrain (format 1).
    std::string run_id;
    // The place of this save in its run's chain: one more than the chain's newest at the
    // commit. The newest save of a run is the one of the highest sequence, even where a run
    // resumed from an older checkpoint saves steps below those of the abandoned ones.
    int64_t sequence = 0;
    std::string run_directory;        // the run directory of the process that saved it ("" unknown)
    int64_t step = 0;                 // optimizer steps taken: the run resumes at this step
    int64_t tokens_seen = 0;
    int64_t resumes = 0;              // times the run that saved it had been resumed (restarts)
    int64_t optimizer_steps = 0;      // AdamW's bias-correction count (skipped steps excluded)
    double loss_scale = 1;
    int64_t loss_scale_good_steps = 0;
    std::optional<LoaderState> data;  // the loader's position; none for the stateless text / tokens windows
    uint64_t seed = 0;
    // Sequences per optimizer step over the whole job (batch_size x grad_accum x dp of the
    // run that saved it): a resume on another layout keeps it. 0: not recorded (format 1).
    int64_t global_batch = 0;
    int world_size = 1, tp = 1, dp = 1, pp = 1, cp = 1;  // cp: absent (1) in checkpoints saved before context parallelism
    int zero_stage = 0;               // as it applied (0 on one dp rank)
    std::string monitor_state;        // the health monitor's windows and counters (JSON); empty: none
    std::string moe_state;            // the MoE layers' expert biases (JSON, train/moe_load.h); empty: none
    std::string fp8_state;            // where the FP8 delayed recipe's state is (JSON, train/fp8_state.h); empty: none
    std::string config_toml;          // the effective config of the run that saved it
    std::string created;              // UTC time of the commit
    std::vector<CheckpointFile> files;
};

std::string manifest_to_json(const Manifest& manifest);
// Throws Error(data) naming path and the key that is missing or malformed, or saying that the
// manifest fails its own checksum. A checkpoint of an earlier version is read as this one (its
// config's retired keys replaced).
Manifest manifest_from_json(const std::string& text, const std::string& path);

// A new run's id: 16 hex digits from the system's entropy source and the clock.
std::string new_run_id();
// "run 3f9c0a1b2c3d4e5f", or "a run of an earlier llmtrain (no run id)".
std::string describe_run(const std::string& run_id);

}  // namespace llmtrain

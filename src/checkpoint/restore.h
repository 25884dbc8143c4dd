// Loading a checkpoint, whatever tp / pp / dp / ZeRO layout saved it: into the ranks of a run
// (state_load.h, through the trainer), into a whole model in this one process (generate,
// eval), and the optimizer's rank-local state. No offline converter: the checkpoint's pieces
// say where they sit in the global tensors.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/manifest.h"
#include "checkpoint/state_load.h"
#include "checkpoint/tensor_assembly.h"
#include "model/parameters.h"
#include "optim/adamw.h"

namespace llmtrain {

// Where the parallel layer works on the backend's buffers: its fill_zero, add and copy.
FlatOps backend_ops(Backend& backend);

// The checkpoint's values of tensors as a load reads them (hyperslab reads into `out`).
ReadTensor checkpoint_reader(const CheckpointTensors& checkpoint, Backend& backend);

// The master weights alone into a model held whole by this process (generate, eval: no
// optimizer, one rank), refreshing the compute copy. Throws Error(data) naming the file and
// the tensor when a piece is missing, damaged or of another shape.
void load_checkpoint_weights(const std::string& path, const Manifest& manifest, Parameters& params, Backend& backend);
// The optimizer's rank-local state (1-bit Adam's error feedback) from world rank
// `world_rank`'s file, when the checkpoint was saved by the same layout (tp, dp, pp as in
// `manifest_of_run`); otherwise the state stays as it is (zero: a fresh error feedback).
// Returns whether it was loaded.
bool load_rank_local_state(const std::string& path, const Manifest& manifest, int world_rank, bool same_layout, AdamW& optimizer);
// Every host-state dataset (SnapshotSource::host_state) whose path starts with `prefix` in the
// files of world ranks `world_ranks`, by path: state a few ranks write for the whole job and
// every rank of any layout reads. Throws Error(data) naming the file when one is missing,
// damaged or of no such rank.
std::map<std::string, std::vector<float>> read_host_state(const std::string& path, const Manifest& manifest, const std::vector<int>& world_ranks,
                                                          const std::string& prefix);

}  // namespace llmtrain

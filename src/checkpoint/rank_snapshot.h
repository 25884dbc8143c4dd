// What one rank writes into its checkpoint file: a host copy of its part of the training
// state, taken at a step boundary, and the description of every tensor in it. Each tensor
// is named by its global (Hugging Face) parameter name and says how this rank's part sits in
// the global tensor (global shape, tensor-parallel split and rank), so that a checkpoint
// loads on any other layout (checkpoint/restore.h).
//
// Who writes what, so that every value is stored once:
//   model/<name>                                  master weights: dp rank 0 of each (tp, pp) place;
//                                                 a tensor replicated over tp: tp rank 0 only;
//                                                 the tied embedding's last-stage copy: never
//   optimizer/exp_avg/<name>/elements_<b>_<e>     AdamW moments of local elements [b, e) of the
//   optimizer/exp_avg_sq/<name>/elements_<b>_<e>  tensor: every rank for the ranges it updates
//                                                 (ZeRO-1: its shard; else dp rank 0), same rules
//   optimizer/<state>                             state of this rank alone (1-bit Adam's error
//                                                 feedback, f32): every rank, for the same layout
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <optional>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "model/parameters.h"
#include "optim/adamw.h"

namespace llmtrain {

struct SavedTensor {
    std::string dataset;       // path in the file
    std::string name;          // global parameter name
    Shape local_shape;         // this rank's part of the tensor, whole
    Shape global_shape;
    TensorSplit split;
    int tp_rank = 0, tp_size = 1;
    int64_t begin = 0, end = 0;  // the elements of the local part stored here (all of them for model/)
    DType dtype = DType::f32;
    size_t byte_offset = 0;    // in RankSnapshot::data
    int64_t numel() const { return end - begin; }
    bool whole() const { return begin == 0 && end == local_shape.numel(); }
};

struct RankSnapshot {
    int64_t step = 0;
    int world_rank = 0;
    std::vector<SavedTensor> tensors;
    std::vector<char> data;   // every tensor's values, back to back; reused from save to save
    size_t bytes() const { return data.size(); }
};

// What a rank holds, for capture_snapshot.
struct SnapshotSource {
    const Parameters& params;
    const AdamW& optimizer;
    Backend& backend;                   // copies device memory to the host
    int world_rank = 0;
    int dp_rank = 0;
    bool shards_optimizer = false;      // ZeRO-1: the optimizer's pieces are this rank's alone
    std::optional<size_t> tied_copy;    // the last stage's copy of the tied embedding
};

// Fills out with this rank's tensors after step `step` (a blocking copy to host memory,
// into out.data, which keeps its allocation from one save to the next).
void capture_snapshot(const SnapshotSource& source, int64_t step, RankSnapshot& out);

// The dataset names above.
std::string model_dataset(const std::string& name);
std::string moment_dataset(const char* moment, const std::string& name, int64_t begin, int64_t end);
std::string rank_state_dataset(const std::string& state);

}  // namespace llmtrain

// What one rank writes into its checkpoint file: a host copy of its share of the training
// state, taken at a step boundary, and the description of every piece in it. Each piece is
// a box of a global tensor (its global name and shape, and where the box sits in it: an
// HDF5 hyperslab), so that a checkpoint is read on any other layout by intersecting boxes
// (checkpoint/state_load.h), and by any HDF5 reader without llmtrain.
//
// Who writes what: the rank's placement decides (parallel/placement.h, checkpoint_share):
// every element of the job's state is written by exactly one of the ranks that hold it, so
// each rank writes about 1/world of the checkpoint. Datasets:
//   model/<name>[/<start>]                  master weights
//   optimizer/exp_avg/<name>[/<start>]      AdamW moments
//   optimizer/exp_avg_sq/<name>[/<start>]
//   optimizer/<state>                       state of this rank alone (1-bit Adam's error
//                                           feedback, f32): every rank, for the same layout
//   <dataset>                               small named state the caller gives whole, f32
//                                           (SnapshotSource::host_state: the FP8 delayed
//                                           recipe's histories, "fp8/<linear>/<tensor>_...")
// A piece that is a whole tensor is named by the tensor alone; a part of one adds its box's
// start ("model/transformer.wte.weight/128_0").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "optim/adamw.h"
#include "parallel/placement.h"

namespace llmtrain {

// What a stored tensor is to its parameter.
enum class TensorRole { weights, exp_avg, exp_avg_sq };
const char* tensor_role_name(TensorRole role);  // "weights", "AdamW first moment", ...
inline constexpr TensorRole kTensorRoles[] = {TensorRole::weights, TensorRole::exp_avg, TensorRole::exp_avg_sq};

// A box of the global tensor whose values a dataset holds from element `offset` of its
// values (row-major, flattened) on.
struct StoredBox {
    GlobalBox box;
    int64_t offset = 0;
};

// One dataset of a rank file.
struct SavedTensor {
    std::string dataset;        // path in the file
    std::string name;           // global tensor name
    Shape global_shape;
    DType dtype = DType::f32;   // as stored
    // Its values are these boxes' values one after the other. A dataset written by this
    // version is one box, its shape the box's; older files hold a tp part, or a range of
    // one, and so several.
    std::vector<StoredBox> boxes;
    size_t byte_offset = 0;     // in RankSnapshot::data, when writing
    int64_t numel() const;
};

struct RankSnapshot {
    int64_t step = 0;
    int world_rank = 0;
    std::vector<SavedTensor> tensors;
    std::vector<char> data;   // every tensor's values, back to back; reused from save to save
    // data's allocation page-locked by the backend (null on the CPU), so a GPU copies into it
    // at its link's rate; declared after data: unpinned before it is freed.
    std::shared_ptr<void> pinned;
    size_t bytes() const { return data.size(); }

    RankSnapshot() = default;
    RankSnapshot(const RankSnapshot&) = delete;  // a copy's buffer would not be the one pinned
    RankSnapshot& operator=(const RankSnapshot&) = delete;
};

// A dataset of f32 values the caller names and holds on the host (written whole).
struct HostDataset {
    std::string dataset;
    std::vector<float> values;
};

// What a rank holds, for capture_snapshot.
struct SnapshotSource {
    const Placement& placement;
    // This rank's values of a role for flat elements `range` (a range of its share).
    std::function<Tensor(TensorRole role, FlatRange range)> state;
    std::vector<RankLocalState> rank_local;
    Backend& backend;                   // copies device memory to the host
    int world_rank = 0;
    DType dtype = DType::f32;           // the master weights' and moments'
    std::vector<HostDataset> host_state;
};

// Fills out with this rank's share after step `step` (a blocking copy to host memory, into
// out.data, which keeps its allocation from one save to the next).
void capture_snapshot(const SnapshotSource& source, int64_t step, RankSnapshot& out);

// The dataset of a piece of tensor `name` (of this global shape) in a role.
std::string piece_dataset(TensorRole role, const std::string& name, const Shape& global_shape, const GlobalBox& box);
std::string rank_state_dataset(const std::string& state);
// The role of a dataset, from its path; false for other datasets (rank-local state).
bool role_of_dataset(const std::string& dataset, TensorRole& role);

}  // namespace llmtrain

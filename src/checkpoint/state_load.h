// Loading state into this rank, whatever layout saved it (tp, pp, dp, ZeRO stage, hybrid
// sharding): the parallel load by placement (parallel/placement.h).
//
//   1. Each rank reads its share of the state (Placement::checkpoint_share, as a save
//      writes it; the two copies of a tied embedding each read their own) from storage:
//      the boxes of the tensors it needs, intersected with the stored ones, each
//      intersection one hyperslab read in the stored dtype straight into the rank's buffers.
//   2. Replicas exchange what they read (parallel/replica_exchange.h): the tp ranks their
//      parts of the tensors tp does not split, then hybrid sharding's blocks their parts of
//      each piece.
//   3. The data-parallel group completes what each of its ranks holds whole: the master
//      weights below ZeRO-3 (ParameterStore::after_load: all-gathered cut by cut, the compute
//      copy refreshed) and, under stage 0, the AdamW moments.
// So every byte is read from storage about once, whatever the layout, and no rank holds more
// than its own state (ZeRO-3 loads into its shards).
#pragma once

#include <functional>

#include "backend/backend.h"
#include "checkpoint/rank_snapshot.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/parameter_store.h"
#include "parallel/placement.h"

namespace llmtrain {

// A rank's state and the groups it shares it with.
struct RankState {
    const Placement& placement;
    ParameterStore& store;
    AdamW* optimizer = nullptr;  // null: weights only (a model without an optimizer, train.init_from)
    Backend& backend;
    FlatOps ops;
    std::function<OwnedTensor(DType, Shape)> allocate;  // in the state's memory
    Comm* tp = nullptr;          // the tp group; null: none
    Comm* replicas = nullptr;    // hybrid sharding's replica group; null: none
    Comm* dp = nullptr;          // the shard group (stage 0: the dp group); null: none
};

// Where this rank's values of a role for flat elements `range` are.
Tensor state_region(const RankState& rank, TensorRole role, FlatRange range);

// Fills `out` (host or device memory: local.size() elements) with local elements `local` of
// tensor `t` in a role: the checkpoint's hyperslab reads, or Hugging Face weights.
using ReadTensor = std::function<void(TensorRole role, const TensorPlace& t, FlatRange local, const Tensor& out)>;

// Loads the weights and, with an optimizer, its moments: steps 1-3 above. A collective over
// every group given.
void load_state(const RankState& rank, const ReadTensor& read);

// A ReadTensor's values into device memory through a host buffer (host memory directly).
void read_to(const Tensor& out, Backend& backend, const std::function<void(void* host, DType as)>& read);

}  // namespace llmtrain

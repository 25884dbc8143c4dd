// What the trainer asks of the data-parallel gradient reduction, whatever the ZeRO stage:
// GradBuckets (stage 0: all-reduce; stage 1: reduce-scatter, this rank updates its pieces)
// or ShardedGradients (stage 2: no whole gradient buffer; each micro-batch's gradients are
// reduce-scattered group by group into this rank's shard). It works on flat ranges and
// parameter indices of the flat layout, and knows nothing of the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmtrain {

struct OwnedPiece;

// Where the gradients of parameters [first, end) are written: `values`, whose element 0 is
// element flat_offset of the flat layout.
struct GradStorageBinding {
    size_t first = 0, end = 0;
    Tensor values;
    int64_t flat_offset = 0;
};

class GradientReduction {
public:
    virtual ~GradientReduction() = default;
    // Storage bound for the whole run (what every step accumulates into); the rest is bound by open().
    virtual std::vector<GradStorageBinding> run_storage() const = 0;
    // Before the backward of a step's first micro-batch. reduce = false: this step's gradients
    // stay each rank's own (1-bit Adam after its freeze step communicates the momentum
    // instead); owned() then holds the local gradients.
    virtual void begin_step(bool reduce) = 0;
    // Backward is about to write the gradients of parameters [first, end) (one group of the
    // model's): where they go now; nullopt: where they were.
    virtual std::optional<GradStorageBinding> open(size_t first, size_t end) = 0;
    // Whether parameter `param`'s gradient, ready after this micro-batch's backward, is handed
    // on now (and so must be complete, e.g. summed over the tp group first).
    virtual bool consumes(size_t param, bool last_micro_batch) const = 0;
    // Parameters [first, end) have their gradients of this micro-batch.
    virtual void ready(size_t first, size_t end, bool last_micro_batch) = 0;
    // After the step's last backward: afterwards owned() holds the gradients summed over dp.
    virtual void finish() = 0;
    // After the update: every rank's updated parameters everywhere (compute copy, or master weights).
    virtual void gather_parameters() = 0;
    // Before a checkpoint reads the master weights whole (a collective over the dp group).
    virtual void gather_master_values() = 0;
    // After the master weights were written whole (a load): this rank keeps its pieces of them
    // (ZeRO-3, which then frees them; nothing to do otherwise).
    virtual void scatter_master_values() {}
    // ZeRO-3: group `position` of a pass is about to compute (forward or backward); `pass`
    // lists the first parameter of each group the pass computes with, in order. Its values
    // are gathered when this returns, and the next groups' gathers may be under way.
    virtual void before_group(const std::vector<size_t>& /*pass*/, size_t /*position*/) {}
    // Bytes allocated for parameter values beside the model's flat buffers (ZeRO-3's shards
    // and gather buffers).
    virtual size_t value_bytes() const { return 0; }
    // The ranges this rank updates and their reduced gradients.
    virtual const std::vector<OwnedPiece>& owned() const = 0;
    // Whether owned() is this rank's shard or everything.
    virtual bool sharded() const = 0;
    // Whether owned() is the first copy of its reduced gradients in the dp group: the copy the
    // global norm counts and a checkpoint saves (plain dp: dp rank 0; a shard: the rank in the
    // first block of hybrid sharding, every rank otherwise).
    virtual bool holds_first_copy() const = 0;
    // Bytes allocated for gradients: a whole flat buffer and / or shards and working buffers.
    virtual size_t gradient_bytes() const = 0;
    // Gradient bytes this rank has sent so far: a ring all-reduce of B bytes over p ranks
    // sends 2 (p - 1) B / p of them, a reduce-scatter (p - 1) B / p.
    virtual int64_t bytes_sent() const = 0;
    // For the start-up line, e.g. "ZeRO-2 (gradients sharded), 6 groups".
    virtual std::string describe() const = 0;
};

}  // namespace llmtrain

// Gradient sync: what makes a step's gradients the sum over the data-parallel group, whatever
// the ZeRO stage. GradBuckets (stage 0: all-reduce; stage 1: reduce-scatter, each rank keeps
// the sum of its pieces) or ShardedGradients (stages 2 and 3: no whole gradient buffer; each
// micro-batch's gradients are reduce-scattered group by group into this rank's shard). Both
// take their cuts of the flat buffer from the rank's placement (parallel/placement.h) and
// know nothing of the model: flat ranges and parameter indices only.
//
// Where the parameters live and how the updated ones reach every rank is the parameter
// store's (parallel/parameter_store.h), not this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/flat_range.h"
#include "core/tensor.h"

namespace llmtrain {

// A range [begin, end) of the flat parameter buffer this rank updates, and where its
// reduced gradients are (a view of end - begin elements).
struct OwnedPiece {
    int64_t begin = 0, end = 0;
    Tensor grads;
    // ZeRO-3: the piece's master weights (and compute copy; empty without one), kept in this
    // rank's shards, not in flat buffers. Empty values: the flat buffers hold them.
    Tensor values, compute_values;
};

// The flat buffers the data-parallel code works on: the parameters (master weights) and
// their gradients in one layout (either may be absent: ZeRO-3 keeps no whole parameters,
// ZeRO-2 no whole gradients), each parameter's range in it, and how to allocate more of
// that memory.
struct FlatParameters {
    DType master = DType::f32;      // the master weights' and the gradients' dtype
    Tensor values, grads;
    Tensor compute_values;          // the 16-bit compute copy in the same layout; empty: none
    std::vector<FlatRange> ranges;  // in registration order: the order readiness counts in
    std::function<OwnedTensor(DType, Shape)> allocate;
};

// The device operations the data-parallel code needs on its buffers, supplied by the caller
// (the backend's fill_zero, add and copy): the parallel layer knows no Backend.
struct FlatOps {
    std::function<void(const Tensor& x)> zero;
    std::function<void(const Tensor& out, const Tensor& a, const Tensor& b)> add;
    std::function<void(const Tensor& out, const Tensor& in)> copy;  // converts dtypes
};

// Where the gradients of parameters [first, end) are written: `values`, whose element 0 is
// element flat_offset of the flat layout.
struct GradStorageBinding {
    size_t first = 0, end = 0;
    Tensor values;
    int64_t flat_offset = 0;
};

class GradientSync {
public:
    virtual ~GradientSync() = default;
    // Storage bound for the whole run (what every step accumulates into); the rest is bound by open().
    virtual std::vector<GradStorageBinding> run_storage() const { return {}; }
    // Before the backward of a step's first micro-batch. reduce = false: this step's gradients
    // stay each rank's own (1-bit Adam after its freeze step communicates the momentum
    // instead); owned() then holds the local gradients.
    virtual void begin_step(bool reduce) = 0;
    // Backward is about to write the gradients of parameters [first, end) (one group of the
    // model's): where they go now; nullopt: where they were.
    virtual std::optional<GradStorageBinding> open(size_t /*first*/, size_t /*end*/) { return std::nullopt; }
    // Whether parameter `param`'s gradient, ready after this micro-batch's backward, is handed
    // on now (and so must be complete, e.g. summed over the tp group first).
    virtual bool consumes(size_t param, bool last_micro_batch) const = 0;
    // Parameters [first, end) have their gradients of this micro-batch: the buckets (groups)
    // they complete start their reductions at once, asynchronously.
    virtual void ready(size_t first, size_t end, bool last_micro_batch) = 0;
    // After the step's last backward: afterwards owned() holds the gradients summed over dp.
    virtual void finish() = 0;
    // The ranges this rank updates and their reduced gradients.
    virtual const std::vector<OwnedPiece>& owned() const = 0;
    // Whether owned() is the first copy of its reduced gradients in the dp group: the copy the
    // global norm counts (plain dp: dp rank 0; a shard: the rank in the first block of hybrid
    // sharding, every rank otherwise).
    virtual bool holds_first_copy() const = 0;
    // Bytes allocated for gradients: a whole flat buffer and / or shards and working buffers.
    virtual size_t gradient_bytes() const = 0;
    // Gradient bytes this rank has sent so far: a ring all-reduce of B bytes over p ranks
    // sends 2 (p - 1) B / p of them, a reduce-scatter (p - 1) B / p.
    virtual int64_t bytes_sent() const = 0;
    // For the start-up line, e.g. "ZeRO-2 (gradients sharded), 6 groups".
    virtual std::string describe() const = 0;
    // Working memory idle between finish() and the next begin_step(), at least as long as
    // cut `cut` padded, which the parameter store may use to stage that cut's all-gather
    // (ZeRO-2's pool buffer, or a resident group's own); empty: none.
    virtual Tensor idle_buffer(size_t /*cut*/) const { return {}; }
};

}  // namespace llmtrain

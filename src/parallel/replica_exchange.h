// The ranks that hold the same values (replicas: tp ranks of a tensor tp does not split,
// hybrid sharding's blocks) each load a part of them from storage and then exchange the
// parts: every byte is read once and the interconnect carries the rest (Megatron's fully
// parallel load). Each part has one holder; the holders broadcast theirs in turn, packed
// into staging buffers of bounded size, so a load adds little memory beside the state.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/gradient_sync.h"

namespace llmtrain {

// Values of the group's state in the same place on every rank of it: filled on the rank
// `holder` (its group rank), wanted by every other.
struct ReplicaPart {
    Tensor values;
    int holder = 0;
};

// Every rank of `group` calls it with the same list (the same parts in the same order, of
// one dtype); afterwards every rank has every part. allocate: staging memory where the parts
// are (at most max_staging_elements); ops: device copies.
void exchange_parts(Comm& group, const std::vector<ReplicaPart>& parts, const FlatOps& ops, const std::function<OwnedTensor(DType, Shape)>& allocate,
                    int64_t max_staging_elements = int64_t{1} << 24);

}  // namespace llmtrain

// ZeRO-3 / FSDP (Rajbhandari et al., "ZeRO", SC'20; Zhao et al., "PyTorch FSDP", VLDB'23):
// the parameters are sharded like the gradients and the AdamW state. Each rank keeps only its
// piece of every group of parameters (a layer, the head, the embedding part): the master
// weights and, under 16-bit compute, their compute copy, in shards laid out group by group
// as ZeRO-2's gradient shard is (sharded_group_layout). No flat compute copy exists.
//
// Before a group's forward, and again before its backward, its pieces are all-gathered into
// a group-sized buffer, to which the model's views of those parameters are bound
// (Parameters::bind_values); the buffer is reused once the group is done. With
// prefetch = p, the gathers of the next p groups of the pass are started (asynchronously)
// before the current group computes, so they proceed behind its compute; a group's gather
// is waited for just before it runs. p + 1 buffers of the largest group make the ring: the
// buffer a new gather takes is one whose group is not among the current and the next p
// groups of the pass (there is always one: p + 1 buffers, p + 1 groups, the new one in none).
// A group still in the ring from an earlier pass, with the values unchanged since, is not
// gathered again: the last p + 1 groups of a forward pass are the first p + 1 of its
// backward, and the last ones of a backward may start the next micro-batch's forward. An
// update (gather_parameters) or a load empties the ring.
//
// A resident group (the one holding a tied embedding, read by the embedding and by the head)
// keeps its own gathered buffer for the whole step, gathered again after every update.
//
// The gradients are ZeRO-2's (ShardedGradients): reduce-scattered group by group; under
// hybrid sharding (parallel.shard_size) summed across the blocks after the last backward.
// The updates then agree in every block, so the parameters are gathered within the block.
//
// The whole master weights exist only for a while: at initialization (the run's random
// weights, cut into shards at construction), when weights are loaded (scatter_master_values)
// and when a checkpoint reads them (gather_master_values; released at the next step).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/sharded_gradients.h"

namespace llmtrain {

// What the model supplies: the whole master weights, allocated on demand (a view of them)
// and freed; and where forward and backward read a group's values from.
struct ShardedValueHooks {
    std::function<Tensor()> acquire_master;
    std::function<void()> release_master;
    std::function<void(size_t first, size_t end, const Tensor& storage, int64_t flat_offset)> bind_values;
};

// Elements ZeRO-3 allocates for parameter values, beside the gradients: the master shard,
// the compute shard (when compute differs from master), the ring of gather buffers and the
// resident groups whole; as bytes for those dtypes.
size_t fully_sharded_value_bytes(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int shard_size, int prefetch,
                                 DType master, DType compute);

class FullyShardedGradients : public ShardedGradients {
public:
    // params.values: the whole master weights, initialized; this rank's pieces are taken
    // from them, and then they are released. compute: the dtype forward and backward read.
    FullyShardedGradients(FlatParameters params, std::vector<GradGroup> groups, Comm& shard, Comm* replicas, FlatOps ops, DType compute,
                          int prefetch, ShardedValueHooks hooks);

    void begin_step(bool reduce) override;
    void gather_parameters() override;  // the resident groups (the others are gathered as they compute)
    void gather_master_values() override;
    void scatter_master_values() override;
    void before_group(const std::vector<size_t>& pass, size_t position) override;
    size_t value_bytes() const override { return value_bytes_; }
    std::string describe() const override;

private:
    struct Ring {
        OwnedTensor buffer;
        int group = -1;  // whose gather it holds or has in flight
        CommHandle handle;
    };
    size_t group_starting_at(size_t param) const;
    // The ring buffer holding (or gathering) the group; nullptr: none.
    Ring* ring_holding(size_t group);
    // A buffer for a new gather: one whose group is not in `window`, the oldest first.
    Ring& free_ring(const std::vector<size_t>& window);
    void empty_ring();
    // The group's pieces (compute copy, or master weights) into place in `buffer` and the
    // all-gather started there.
    CommHandle start_gather(size_t group, const Tensor& buffer);
    Tensor gather_source() const { return compute_shard_.view().empty() ? master_shard_.view() : compute_shard_.view(); }
    void take_shards(const Tensor& whole);
    void bind(size_t group, const Tensor& buffer) const;

    std::vector<GradGroup> groups_;
    std::vector<ShardedGroupLayout> layout_;
    DType compute_;
    int prefetch_;
    ShardedValueHooks hooks_;
    FlatOps value_ops_;
    std::function<OwnedTensor(DType, Shape)> allocate_;
    int replicas_;  // blocks holding the same shards (hybrid sharding); 1: none
    OwnedTensor master_shard_, compute_shard_;
    std::vector<OwnedTensor> resident_;  // per group; empty unless resident
    std::vector<Ring> ring_;
    size_t next_ring_ = 0;  // where the search for a free buffer starts: the oldest gather
    bool holds_whole_master_ = false;
    size_t value_bytes_ = 0;
    int64_t ring_elements_ = 0;
};

}  // namespace llmtrain

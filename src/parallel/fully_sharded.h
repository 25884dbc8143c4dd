// ZeRO-3 / FSDP (Rajbhandari et al., "ZeRO", SC'20; Zhao et al., "PyTorch FSDP", VLDB'23):
// the parameters are sharded like the gradients and the AdamW state. Each rank keeps only its
// piece of every group of parameters (a layer, the head, the embedding part): the master
// weights and, under 16-bit compute, their compute copy, in shards laid out group by group
// as ZeRO-2's gradient shard is (the placement's group cuts). No whole master weights and no
// flat compute copy exist, ever: the shards are initialized in place (the Philox
// initialization computes any element alone), and a checkpoint saves and loads them as they
// are (parallel/placement.h: checkpoint_share).
//
// Before a group's forward, and again before its backward, its pieces are all-gathered into
// a group-sized buffer, to which the model's views of those parameters are bound
// (Parameters::bind_values); the model holds the buffer through the handle weights()
// returns. With prefetch = p, the gathers of the next p groups of the pass are started
// (asynchronously) before the current group computes, so they proceed behind its compute; a
// group's gather is waited for just before it runs. p + 1 buffers of the largest group make
// the ring: the buffer a new gather takes is one whose group is not among the current and the
// next p groups of the pass and whose handle is released (there is always one: p + 1
// buffers, p + 1 groups, the new one in none). A group still in the ring from an earlier
// pass, with the values unchanged since, is not gathered again: the last p + 1 groups of a
// forward pass are the first p + 1 of its backward, and the last ones of a backward may start
// the next micro-batch's forward. An update or a load empties the ring.
//
// A resident group (the one holding a tied embedding, read by the embedding and by the head)
// keeps its own gathered buffer for the whole step, gathered again after every update.
//
// The gradients are ZeRO-2's (ShardedGradients): reduce-scattered group by group; under
// hybrid sharding (parallel.shard_size) summed across the blocks after the last backward.
// The updates then agree in every block, so the parameters are gathered within the block.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/parameter_store.h"

namespace llmtrain {

// Bytes ZeRO-3 allocates for parameter values: the master shard, the compute shard (when
// compute differs from master), the ring of gather buffers and the resident groups whole.
size_t fully_sharded_value_bytes(const Placement& placement, int prefetch, DType master, DType compute);

// Where forward and backward read parameters [first, end) from: `storage` (compute dtype),
// whose element 0 is flat element flat_offset (Parameters::bind_values).
using BindValues = std::function<void(size_t first, size_t end, const Tensor& storage, int64_t flat_offset)>;

class FullyShardedParameters : public ParameterStore {
public:
    // placement: its group cuts over `shard`; params: the registry's ranges, master dtype and
    // allocator (no whole buffers); compute: the dtype forward and backward read.
    FullyShardedParameters(FlatParameters params, const Placement& placement, Comm& shard, FlatOps ops, DType compute, int prefetch, BindValues bind);

    void initialize(const ValueInit& init) override;
    void after_update() override;  // the resident groups (the others are gathered as they compute)
    void after_load() override;
    GroupWeights weights(const std::vector<size_t>& pass, size_t position) override;
    Tensor master(FlatRange range) const override;
    void place(std::vector<OwnedPiece>& pieces) const override;
    bool gathers_in_forward() const override { return true; }
    size_t value_bytes() const override { return value_bytes_; }
    std::string describe() const override;

private:
    struct Ring {
        OwnedTensor buffer;
        int group = -1;  // whose gather it holds or has in flight
        int holders = 0;  // live handles on it: not reused before they are released
        CommHandle handle;
    };
    size_t group_starting_at(size_t param) const;
    // The ring buffer holding (or gathering) the group; nullptr: none.
    Ring* ring_holding(size_t group);
    // A buffer for a new gather: one whose group is not in `window` and that no handle holds, the oldest first.
    Ring& free_ring(const std::vector<size_t>& window);
    void empty_ring();
    // The group's pieces (compute copy, or master weights) into place in `buffer` and the
    // all-gather started there.
    CommHandle start_gather(size_t group, const Tensor& buffer);
    Tensor gather_source() const { return compute_shard_.view().empty() ? master_shard_.view() : compute_shard_.view(); }
    // The shard position of flat elements `range`, which lie in one piece of this rank's.
    int64_t shard_offset(FlatRange range) const;
    void refresh_compute_shard();
    void bind(size_t group, const Tensor& buffer) const;

    std::vector<FlatCut> cuts_;
    Comm& shard_;
    int replicas_;
    DType compute_;
    int prefetch_;
    BindValues bind_;
    FlatOps ops_;
    OwnedTensor master_shard_, compute_shard_;
    std::vector<OwnedTensor> resident_;  // per group; empty unless resident
    std::vector<Ring> ring_;
    size_t next_ring_ = 0;  // where the search for a free buffer starts: the oldest gather
    size_t value_bytes_ = 0;
};

}  // namespace llmtrain

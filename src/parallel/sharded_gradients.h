// ZeRO-2 (Rajbhandari et al., "ZeRO", SC'20): the gradients are sharded over the dp group like
// the AdamW state. No whole gradient buffer exists: backward writes each group of parameters
// (a layer, the head, the embedding part) into one of a small pool of group-sized buffers;
// when the group's gradients of a micro-batch are complete, the buffer is reduce-scattered
// (asynchronously, while backward goes on with the next group in the other pool buffer) and
// this rank adds its piece to its shard. As in DeepSpeed, every micro-batch is reduced, so
// the traffic grows with the micro-batches; the memory does not. ZeRO-3 reduces its
// gradients the same way.
//
// The groups are the placement's cuts (group_cuts): a group of length n is padded to
// P = dp * ceil(n / dp) in its buffer; rank r owns the flat elements [begin + r P/dp,
// begin + min((r + 1) P/dp, n)) of it (the last pieces may be short or empty). Per rank: the
// shard (~total / dp), two pool buffers of the largest pooled group, two receive pieces, and
// the resident groups whole.
//
// A resident group (the one holding a tied embedding, whose gradient is written twice in a
// backward, by the head first and the embedding last, and summed across pipeline stages after
// the last micro-batch) keeps its own buffer for the whole step and is reduce-scattered once,
// in finish().
//
// Hybrid sharding (parallel.shard_size = s < dp): the shard group is a block of s dp ranks,
// and "dp" above reads s. The blocks hold the same shards, each summed over its own ranks'
// micro-batches; after the step's last backward every shard is all-reduced once across the
// replica group (the ranks at the same place in every block), which makes it the sum over
// all dp ranks. The updates then agree in every block, so the parameter store all-gathers
// within the block only: the large all-gathers and reduce-scatters stay inside it (a node's
// fast links), and only 1/s of the gradients crosses between the blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "parallel/gradient_sync.h"
#include "parallel/placement.h"

namespace llmtrain {

// The elements ShardedGradients allocates for the placement's group cuts, all in the master
// dtype: what the memory plan predicts.
int64_t sharded_gradient_numel(const Placement& placement);

class ShardedGradients : public GradientSync {
public:
    // groups: the placement's group cuts, in the order backward writes them; together they
    // cover every parameter once. shard: the ranks that shard (the dp group, or a block of
    // it); replicas: the ranks at this one's place in every block (null, or a group of one,
    // without hybrid sharding).
    ShardedGradients(FlatParameters params, std::vector<FlatCut> groups, Comm& shard, Comm* replicas, FlatOps ops);

    std::vector<GradStorageBinding> run_storage() const override;
    void begin_step(bool reduce) override;  // reduce = false is refused: stage 2 keeps no whole local gradient
    std::optional<GradStorageBinding> open(size_t first, size_t end) override;
    bool consumes(size_t param, bool last_micro_batch) const override;
    void ready(size_t first, size_t end, bool last_micro_batch) override;
    void finish() override;
    const std::vector<OwnedPiece>& owned() const override { return owned_; }
    bool holds_first_copy() const override { return !replicas_ || replicas_->rank() == 0; }
    size_t gradient_bytes() const override { return bytes_; }
    int64_t bytes_sent() const override { return bytes_sent_; }
    std::string describe() const override;
    Tensor idle_buffer(size_t cut) const override;

    static constexpr int kPoolBuffers = 2;

private:
    struct Group {
        FlatCut cut;
        int waiting = 0;          // parameters whose gradients are not ready yet in this micro-batch
        int slot = -1;            // pooled: the pool buffer it is written into; -1: none
        Tensor resident_buffer;   // resident: its own buffer of piece * dp
    };
    struct Slot {
        OwnedTensor buffer, received;
        int group = -1;           // whose reduction is in flight or pending accumulation
        CommHandle handle;
    };
    size_t group_of(size_t param) const { return group_of_param_.at(param); }
    Tensor padded_buffer(const Group& g) const;
    void reduce(size_t group, Slot& slot, const Tensor& buffer);
    void settle(Slot& slot);  // waits for the slot's reduction and adds it into the shard

    FlatParameters params_;
    std::vector<Group> groups_;
    std::vector<size_t> group_of_param_;
    Comm& group_;      // the shard group
    Comm* replicas_;   // null: none
    FlatOps ops_;
    OwnedTensor shard_;
    std::vector<OwnedPiece> owned_;
    std::vector<OwnedTensor> resident_buffers_;
    std::vector<Slot> slots_;
    int next_slot_ = 0;
    size_t bytes_ = 0;
    int64_t bytes_sent_ = 0;
};

}  // namespace llmtrain

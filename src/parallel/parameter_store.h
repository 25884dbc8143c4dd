// The parameter store: where a rank's parameter values live, how a group of them reaches the
// model for its compute, and how every rank's updates (or a load) reach the others. Two
// kinds, by ZeRO stage (parallel/placement.h):
//
//   ReplicatedParameters (stages 0-2): the model's flat buffers hold every value of the
//     rank's part: the fp32 master weights and, under 16-bit compute, the compute copy that
//     forward reads. Under stages 1 and 2 a rank updates only its pieces; after_update()
//     all-gathers them cut by cut (the compute copy, or the master weights without one), so
//     that forward reads current values everywhere. The master weights of other ranks'
//     pieces are then stale here: a checkpoint saves each rank's own pieces, and a load
//     writes this rank's share and gathers the master weights (after_load).
//     With parallel.overlap_param_gather the all-gathers run behind the next forward
//     instead of after the update (see ReplicatedParameters).
//   FullyShardedParameters (stage 3, parallel/fully_sharded.h): only this rank's pieces
//     exist; a group is all-gathered when the model asks for its weights.
//
// The model asks for a group's weights through one scoped handle (weights()): the values are
// in place while the handle lives, and the memory that holds them is not reused before it is
// released. Gradients are the gradient sync's (parallel/gradient_sync.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/gradient_sync.h"
#include "parallel/placement.h"

namespace llmtrain {

// A group's weights, in place (bound where the model reads them) while the handle lives.
class GroupWeights {
public:
    GroupWeights() = default;
    explicit GroupWeights(std::function<void()> release) : release_(std::move(release)) {}
    GroupWeights(GroupWeights&& other) noexcept : release_(std::exchange(other.release_, nullptr)) {}
    GroupWeights& operator=(GroupWeights&& other) noexcept;
    GroupWeights(const GroupWeights&) = delete;
    GroupWeights& operator=(const GroupWeights&) = delete;
    ~GroupWeights();

private:
    std::function<void()> release_;
};

// Fills `out` with the initial master weights of flat elements `range` (the model's Philox
// initialization: any range of any rank computes alone).
using ValueInit = std::function<void(FlatRange range, const Tensor& out)>;

// Working memory for the all-gather of cut `cut` that is not aligned in the flat buffer:
// staging slot `slot` (0 or 1) of the gradient sync's idle buffers.
using GatherStaging = std::function<Tensor(size_t cut, int slot)>;

class ParameterStore {
public:
    virtual ~ParameterStore() = default;
    // Writes the initial master weights this rank holds (and the compute copy from them).
    virtual void initialize(const ValueInit& init) = 0;
    // After the optimizer updated this rank's pieces: every rank's updated values where the
    // model reads them.
    virtual void after_update() = 0;
    // After a load wrote the master weights of this rank's share of a checkpoint (and its
    // replicas' exchanges completed every piece it owns): the whole of what it holds, the
    // compute copy refreshed.
    virtual void after_load() = 0;
    // Group `position` of a pass is about to compute (forward or backward): its weights, in
    // place while the handle lives. `pass` lists the first parameter of each group the pass
    // computes with, in order (stores that gather start the next groups' gathers here).
    virtual GroupWeights weights(const std::vector<size_t>& /*pass*/, size_t /*position*/) { return GroupWeights(); }
    // Where this rank's master weights of flat elements `range` are: any range of the flat
    // buffer (replicated), or one inside one of its pieces (ZeRO-3).
    virtual Tensor master(FlatRange range) const = 0;
    // Points each optimizer piece at the values it updates, where they are not in the flat
    // buffers (ZeRO-3's shards).
    virtual void place(std::vector<OwnedPiece>& /*pieces*/) const {}
    // Whether computing a group is a collective over the shard group (ZeRO-3's gathers): a
    // forward then needs every rank of it.
    virtual bool gathers_in_forward() const { return false; }
    // Completes every gather still in flight from the last update: before anything but a
    // training forward reads or writes the values (a load, a checkpoint, evaluation,
    // sampling), and before a backward's collectives on the shard group. A collective over
    // the shard group when gathers are in flight.
    virtual void settle() {}
    // Bytes allocated for parameter values (master weights, compute copy, shards, gather buffers).
    virtual size_t value_bytes() const = 0;
    // Bytes this rank has sent in ZeRO-3's parameter all-gathers since the start (ring
    // all-gather: (parts - 1) / parts of each gathered buffer); 0 for the other stages.
    virtual int64_t bytes_sent() const { return 0; }
    // For the start-up line; empty when there is nothing to say beyond the gradient sync.
    virtual std::string describe() const { return ""; }
};

// All-gathers `flat` (a buffer of the flat layout: master weights, compute copy or moments)
// over the shard group, cut by cut: every rank's piece of each cut is copied everywhere. A
// cut whose padded length is its length is gathered in place; another through
// `staging(cut)`, a buffer of at least its padded length (any dtype: its memory is reused).
// All cuts' gathers are started before the first is waited for.
void gather_over_cuts(Comm& group, const Tensor& flat, const std::vector<FlatCut>& cuts, const std::function<Tensor(size_t cut)>& staging,
                      const FlatOps& ops);

// Stages 0-2. Without overlap, after_update() all-gathers every rank's updated pieces before
// it returns. With overlap (parallel.overlap_param_gather, stages 1 and 2), it only starts
// them, in the order the next forward reads the flat buffer (from its start: embedding,
// layers, head), and the forward waits for each cut just before the first group that reads
// it computes (weights()), as ZeRO-3's prefetch does:
//   - cuts aligned in the flat buffer (ZeRO-1's buckets) are gathered in place, all in flight
//     at once;
//   - the others (ZeRO-2's layer groups, padded) go through the gradient sync's two idle pool
//     buffers as a ring: two in flight, and a cut's completion (its values copied into the
//     flat buffer) starts the next; a resident group's (a tied embedding's), staged in its
//     own gradient buffer, which the next step zeroes before its forward, completes at once.
// Every rank starts the same gathers in the same order; completions happen in that order too,
// whichever group asks first. A group waits for every cut that starts before its end, so a
// group that reads another's weights (the tied head reads the embedding) finds them there,
// since forward reads the flat buffer from its start. MPI moves a nonblocking collective only
// inside MPI calls: each weights() call polls the gathers still in flight.
class ReplicatedParameters : public ParameterStore {
public:
    // params: the model's flat buffers (master weights, compute copy); cuts and shards: the
    // placement's; staging: idle working memory for the cuts that are not aligned (the
    // gradient sync's); ops: copies that convert dtypes; overlap: as above.
    ReplicatedParameters(FlatParameters params, const Placement& placement, Comm& shard, GatherStaging staging, FlatOps ops, bool overlap = false);
    ~ReplicatedParameters() override;

    void initialize(const ValueInit& init) override;
    void after_update() override;
    void after_load() override;
    GroupWeights weights(const std::vector<size_t>& pass, size_t position) override;
    void settle() override;
    Tensor master(FlatRange range) const override { return params_.values.slice_rows(range.begin, range.size()); }
    size_t value_bytes() const override;
    std::string describe() const override;
    // The master weights of every rank's pieces, here too (a collective over the shard group).
    void gather_master();

private:
    // A cut's all-gather started by after_update() and not yet complete here.
    struct InFlight {
        size_t cut = 0;
        bool pooled = false;  // staged in a pool slot (not aligned)
        int slot = -1;        // the pool slot, once started
        bool started = false;
        CommHandle handle;
    };
    void gather(const Tensor& flat);
    const Tensor& gathered() const { return params_.compute_values.empty() ? params_.values : params_.compute_values; }
    bool aligned(const FlatCut& cut) const { return cut.flat.size() == cut.padded(shard_.size()); }
    Tensor staging_of(const InFlight& f) const;
    void start(InFlight& f);
    void finish(InFlight& f);
    void complete_front();
    void start_waiting();
    int64_t end_of_group(const std::vector<size_t>& pass, size_t position) const;

    FlatParameters params_;
    std::vector<FlatCut> cuts_;
    bool sharded_;  // stages 1 and 2: each rank updates its pieces
    bool overlap_;
    Comm& shard_;
    GatherStaging staging_;
    FlatOps ops_;
    std::vector<InFlight> in_flight_;  // in forward order; the front completes first
    std::vector<int> free_slots_;      // pool slots no gather in flight uses
};

}  // namespace llmtrain

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
//
// FP8 weights gathered in FP8 (fp8.param_gather; Transformer Engine's and torchao's FP8
// all-gather): the weights of the FP8 linears travel as e4m3 bytes, one per element, and land
// in the linears' FP8 copies; everything else in a group (norms, biases, the weights of the
// layers kept in the compute dtype) travels in the compute dtype as before. A rank's piece of
// a group is a contiguous flat range, so it splits into runs: FP8 runs (of the FP8 weights)
// and compute runs (the rest). Each rank packs its runs of each kind, in flat order, into a
// slot of the largest size any rank needs (F_g bytes and N_g elements for group g), and two
// all-gathers move the slots:
//     bytes per gather of group g = parts (F_g + N_g c)   instead of   parts p_g c
// (c the compute dtype's size, p_g the piece; F_g + N_g >= p_g, equal unless the runs fall
// unevenly). With F_g close to p_g and N_g a few norm and bias vectors, that is half the bf16
// bytes. The FP8 slots come from this rank's FP8 shard, F_g bytes per group, which the
// callback casts once per update at the first gather after it (the scale agreed over every
// rank holding a piece: model/fp8_linear.h); the FP8 part of a group is gathered once per
// update too, since its destination (the linears' FP8 copies) lives for the step, while the
// compute part is gathered whenever the ring gathers the group. Memory on top of the plain
// ZeRO-3 store: the FP8 shard (sum of F_g bytes) and per ring buffer the two staging areas
// (parts max F_g bytes and parts max N_g elements); the ring buffers keep their size, the FP8
// weights' places in them unused.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/parameter_store.h"

namespace llmtrain {

// A piece of an FP8 weight this rank holds: its values in the compute dtype (`source`) and
// where their e4m3 bytes go in this rank's FP8 shard (`out`), both [elements].
struct Fp8ShardPiece {
    size_t weight = 0;  // index in Fp8ParamGather::weights
    Tensor source, out;
};

// fp8.param_gather: the FP8 weights of the groups and what to do with them.
struct Fp8ParamGather {
    std::vector<FlatRange> weights;  // each FP8 weight's flat elements, ascending, inside one group each
    std::vector<Tensor> bytes;       // [elements] e4m3 each: where its gathered bytes go
    // Casts this rank's pieces into its FP8 shard with scales agreed over every rank that
    // holds a piece of the same weight (a collective, called on every rank of the shard group).
    std::function<void(const std::vector<Fp8ShardPiece>&)> cast;
};

// Bytes ZeRO-3 allocates for parameter values: the master shard, the compute shard (when
// compute differs from master), the ring of gather buffers and the resident groups whole;
// with FP8 weights gathered in FP8 (their flat ranges), the FP8 shard and the staging areas.
size_t fully_sharded_value_bytes(const Placement& placement, int prefetch, DType master, DType compute, const std::vector<FlatRange>& fp8_weights = {});

// Where forward and backward read parameters [first, end) from: `storage` (compute dtype),
// whose element 0 is flat element flat_offset (Parameters::bind_values).
using BindValues = std::function<void(size_t first, size_t end, const Tensor& storage, int64_t flat_offset)>;

class FullyShardedParameters : public ParameterStore {
public:
    // placement: its group cuts over `shard`; params: the registry's ranges, master dtype and
    // allocator (no whole buffers); compute: the dtype forward and backward read.
    // fp8: FP8 weights gathered in FP8 (none: every group in the compute dtype).
    FullyShardedParameters(FlatParameters params, const Placement& placement, Comm& shard, FlatOps ops, DType compute, int prefetch, BindValues bind,
                           Fp8ParamGather fp8 = {});

    void initialize(const ValueInit& init) override;
    void after_update() override;  // the resident groups (the others are gathered as they compute)
    void after_load() override;
    GroupWeights weights(const std::vector<size_t>& pass, size_t position) override;
    Tensor master(FlatRange range) const override;
    void place(std::vector<OwnedPiece>& pieces) const override;
    bool gathers_in_forward() const override { return true; }
    size_t value_bytes() const override { return value_bytes_; }
    int64_t bytes_sent() const override { return bytes_sent_; }
    std::string describe() const override;

    // A group's runs of FP8 weights and of the rest, per rank, packed into equal slots (the
    // header's FP8 gather). fp8_slot = 0: the group holds no FP8 weight.
    struct Run {
        FlatRange flat;
        int64_t at = 0;     // where it starts in its rank's slot
        size_t weight = 0;  // an FP8 run's weight
    };
    struct PackedGroup {
        int64_t fp8_slot = 0, compute_slot = 0;  // F_g bytes and N_g elements per rank
        int64_t fp8_shard_at = 0;                // where the group's slot starts in the FP8 shard
        std::vector<std::vector<Run>> fp8, compute;
    };
    static PackedGroup packed_group(const FlatCut& cut, int parts, const std::vector<FlatRange>& fp8_weights);

private:
    struct Ring {
        OwnedTensor buffer;
        int group = -1;  // whose gather it holds or has in flight
        int holders = 0;  // live handles on it: not reused before they are released
        CommHandle handle;
        // A packed gather (a group with FP8 weights): its staging, the FP8 part's gather, and
        // whether the runs still wait to be unpacked.
        OwnedTensor fp8_staging, compute_staging;
        CommHandle fp8_handle;
        bool with_fp8 = false, unpack = false;
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
    // A group's gather into a ring buffer: plain (start_gather), or packed when it holds FP8 weights.
    void start_ring_gather(size_t group, Ring& ring);
    // Waits for the ring's gathers and unpacks a packed one's runs where they belong.
    void finish_ring_gather(Ring& ring);
    // This rank's FP8 shard cast from the current values (once per update, at the first gather).
    void cast_fp8_shard();
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
    int64_t bytes_sent_ = 0;
    Fp8ParamGather fp8_;
    std::vector<PackedGroup> packed_;  // per group; empty without FP8 weights gathered in FP8
    OwnedTensor fp8_shard_;            // e4m3: this rank's FP8 runs, group by group
    bool fp8_shard_current_ = false;   // cast from the values since the last update or load
    std::vector<bool> fp8_gathered_;   // per group: its FP8 weights in place since then
};

}  // namespace llmtrain

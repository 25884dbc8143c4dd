// State placement: where every piece of a rank's training state lives in the job, in one
// description that gradient sync, the parameter store, the optimizer, the checkpoint writer
// and reader and the memory plan all read (nothing else derives ownership).
//
// A rank holds a part of the model (its pipeline stage's tensors, each cut by tensor
// parallelism) laid out in one flat buffer. For each tensor the placement knows its global
// name and shape, how tensor parallelism split it, and where its local part lies in the flat
// buffer. Data parallelism then cuts the flat buffer (FlatCut): into buckets (ZeRO stages 0
// and 1) or into the model's layer groups (stages 2 and 3), each cut padded to a multiple of
// the shard group's size and split into one piece per rank. A rank's pieces are the ranges it
// updates (stages >= 1) and whose gradients, AdamW moments (and under stage 3 master weights)
// it alone keeps in its shard group.
//
// The same element is held by several ranks where state is replicated:
//   - over the shard group's blocks under hybrid sharding (parallel.shard_size): the blocks
//     hold the same pieces (replicas);
//   - over tp, for a tensor tensor parallelism does not split (norms, row-parallel biases);
//   - over the pipeline's ends, for a token embedding tied to the head (two copies);
//   - over dp, for the master weights below stage 3 and for everything under stage 0.
// A checkpoint stores each element once: a rank writes the part of its pieces that is its
// own among those replicas (checkpoint_share), so every rank writes about 1/world of it.
// Loading reads the same share from storage and the replicas exchange their parts.
//
// Like Megatron's ShardedTensor (global name, global shape, local offset, replica id) and a
// DTensor's placements, but with the flat buffer's cuts as the one notion of ownership: a
// context-parallel dimension would add one more replica level for the parameters, as dp does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/flat_range.h"
#include "core/tensor.h"

namespace llmtrain {

// How tensor parallelism cuts a tensor (Megatron):
//  - rows: the output rows of a [out, in] weight (column-parallel linear, vocab-parallel
//    embedding) or a bias; `blocks` > 1 splits each of that many equal row blocks on its own
//    (GPT-2's fused c_attn holds q, k, v blocks: rank r keeps its heads of each).
//  - cols: the input columns of a [out, in] weight (row-parallel linear).
//  - none: every tp rank holds the whole tensor (norms, row-parallel biases, positions).
enum class TpSplit { none, rows, cols };

struct TensorSplit {
    TpSplit kind = TpSplit::none;
    int64_t blocks = 1;  // rows only: equal row blocks, each split on its own
};

// Flat index in the global tensor of element `local` of tp rank tp_rank's part (of shape
// `shape`) of a tensor of global_shape split among tp_size ranks: the one formula that
// initialization, checkpoints and their loading on another layout share.
int64_t tp_global_index(const Shape& shape, const Shape& global_shape, TensorSplit split, int tp_rank, int tp_size, int64_t local);

// A box of a global tensor: the elements [start[d], start[d] + count[d]) along every
// dimension d. In HDF5 terms a hyperslab of one block (start, stride 1, count 1, block).
struct GlobalBox {
    Shape start, count;
    int64_t numel() const { return count.numel(); }
    bool operator==(const GlobalBox&) const = default;
    // Whether it lies inside a tensor of this shape.
    bool inside(const Shape& shape) const;
    std::string str() const;  // "[0:128, 32:64]"
};
// The box of every element of a tensor of this shape.
GlobalBox whole_box(const Shape& shape);
// The elements both hold; nullopt when they share none.
std::optional<GlobalBox> intersect(const GlobalBox& a, const GlobalBox& b);

// One tensor of a rank's part of the model.
struct TensorPlace {
    std::string name;          // global (Hugging Face) name
    Shape global_shape;
    Shape local_shape;         // this rank's part
    TensorSplit split;
    int tp_rank = 0, tp_size = 1;
    FlatRange flat;            // the local part's elements in the flat buffer
    int64_t numel() const { return flat.size(); }
    bool replicated_over_tp() const { return tp_size > 1 && split.kind == TpSplit::none; }
};

// The boxes of the global tensor that hold local elements `local` (of the local part, 0 at
// its first element), in local order: the range's values are the boxes' values one after
// the other, each box row-major. A range of whole rows inside one tp row block is one box; a
// range starting or ending inside a row adds a box of that partial row; a row-split tensor's
// blocks (fused QKV) each add their own.
std::vector<GlobalBox> boxes_of(const TensorPlace& tensor, FlatRange local);

// Parameters [first, end) whose gradients backward writes together (a layer, the head, the
// embedding part); resident: kept whole for the step (a tied embedding, written twice).
struct GradGroup {
    size_t first = 0, end = 0;
    bool resident = false;
};

// A cut of the flat buffer over the `parts` ranks of a shard group: padded to piece * parts
// elements, piece = ceil(size / parts); rank r's piece is [begin + r piece, begin + (r + 1)
// piece) clipped to the cut's real elements (the last ones may be short or empty).
struct FlatCut {
    FlatRange flat;
    int64_t piece = 0;
    int64_t shard_at = 0;       // where the piece starts in a shard laid out cut by cut
    GradGroup group;            // a group cut's parameters; {0, 0} for a bucket
    FlatRange piece_of(int rank) const;
    int64_t padded(int parts) const { return piece * parts; }
};

// Buckets of about bucket_bytes (elements of elem_bytes), each a multiple of `parts` long,
// from the end of a buffer of padded_numel elements (a multiple of parts) to its start:
// backward produces the last parameters' gradients first.
std::vector<FlatCut> bucket_cuts(int64_t padded_numel, size_t elem_bytes, int parts, int64_t bucket_bytes);
// One cut per group (in the order backward writes them), over parameters of these flat ranges.
std::vector<FlatCut> group_cuts(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts);

// Local elements `range` of a tensor, by index in Placement::tensors().
struct TensorRange {
    size_t tensor = 0;
    FlatRange local;
};

struct PlacementSpec {
    std::vector<TensorPlace> tensors;   // in flat order
    int64_t padded_numel = 0;           // the flat buffer's length
    int zero_stage = 0;                 // as it applies: 0 where there is one dp rank
    std::vector<FlatCut> cuts;          // the flat buffer over the shard group
    int shard_rank = 0, shard_size = 1;
    int replica_rank = 0, replicas = 1;  // blocks holding the same pieces (hybrid sharding)
    std::optional<size_t> tied;         // a tensor held by the first and the last pipeline stage
    int tied_end = 0;                   // 0: this rank holds the first stage's copy; 1: the last's
};

class Placement {
public:
    // Throws Error(runtime) when the cuts do not cover the buffer once, or a tensor lies outside it.
    explicit Placement(PlacementSpec spec);

    const std::vector<TensorPlace>& tensors() const { return spec_.tensors; }
    const std::vector<FlatCut>& cuts() const { return spec_.cuts; }
    int64_t padded_numel() const { return spec_.padded_numel; }
    int zero_stage() const { return spec_.zero_stage; }
    int shard_rank() const { return spec_.shard_rank; }
    int shard_size() const { return spec_.shard_size; }
    int replica_rank() const { return spec_.replica_rank; }
    int replicas() const { return spec_.replicas; }
    std::optional<size_t> tied() const { return spec_.tied; }
    int tied_end() const { return spec_.tied_end; }
    bool shards_optimizer() const { return spec_.zero_stage >= 1; }
    bool shards_gradients() const { return spec_.zero_stage >= 2; }
    bool shards_parameters() const { return spec_.zero_stage >= 3; }

    // This rank's piece of every cut, the empty ones left out: what it updates (stage >= 1).
    std::vector<FlatRange> pieces() const;
    // Elements of the shard (every cut's piece, padded): ZeRO's per-rank state length.
    int64_t shard_numel() const;
    // Elements whose AdamW moments this rank keeps: its pieces (stage >= 1), else the buffer.
    int64_t optimizer_numel() const;
    // Its part of each of its pieces among the replicas: what it writes and reads first.
    std::vector<FlatRange> first_pieces() const;
    // What this rank writes to a checkpoint, tensor by tensor: its first pieces, the part of
    // each tensor replicated over tp that is its tp rank's (split_tp), and the half of a tied
    // tensor that is its end's (split_tied). With both, every element of the job's state is
    // in exactly one rank's share. A load reads the share without the tied split (the two
    // ends lay the tensor out differently, so each reads its copy), then the replicas
    // exchange their parts.
    std::vector<TensorRange> checkpoint_share(bool split_tied, bool split_tp = true) const;
    // The tensors overlapping flat range `range`, with the local elements of each it holds.
    std::vector<TensorRange> tensors_in(FlatRange range) const;

    // Part `index` of `range` cut into `parts` near-equal parts (the first ones longer).
    static FlatRange part_of(FlatRange range, int parts, int index);

private:
    PlacementSpec spec_;
};

}  // namespace llmtrain

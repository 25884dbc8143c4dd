// Mesh: the world's ranks as a 4-D grid tp x cp x dp x pp. With the default order "tp-dp-pp"
// (fastest first) consecutive world ranks differ in tp, so a tensor-parallel group stays
// inside a node; then cp, then dp; pp is slowest, so pipeline neighbours are usually in
// other nodes. Context parallelism (cp) always sits just inside dp, whatever the order names
// (as in Megatron-Core's tp-cp-ep-dp-pp): its ring passes keys and values every layer, so it
// should be as near as tp allows.
//
//   world_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))   (order tp-dp-pp)
//
// The ranks sharing tp and pp coordinates (dp x cp of them) hold the same weights: they are
// the data group, over which gradients are reduced and ZeRO shards the training state, in
// the order cp_rank + cp * dp_rank (data_index). The cp ranks of one dp rank read the same
// sequences, each its chunks of them.
//
// Any group comes from one formula: the ranks that share every coordinate but one.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace llmtrain {

enum class MeshDim { tp = 0, dp = 1, pp = 2, cp = 3 };
const char* mesh_dim_name(MeshDim dim);

struct MeshCoord {
    int tp = 0, dp = 0, pp = 0, cp = 0;
    int operator[](MeshDim dim) const {
        switch (dim) {
            case MeshDim::tp: return tp;
            case MeshDim::dp: return dp;
            case MeshDim::pp: return pp;
            case MeshDim::cp: return cp;
        }
        return 0;
    }
    int& operator[](MeshDim dim) { return dim == MeshDim::tp ? tp : dim == MeshDim::dp ? dp : dim == MeshDim::pp ? pp : cp; }
    bool operator==(const MeshCoord&) const = default;
};

class Mesh {
public:
    // order: the three dims fastest first, e.g. "tp-dp-pp" or "tp-pp-dp" (cp goes just before
    // dp). Throws a config error if tp * cp * dp * pp != world_size or order is not a
    // permutation of tp, dp, pp.
    Mesh(int world_size, int tp, int dp, int pp, const std::string& order = "tp-dp-pp", int cp = 1);

    int world_size() const { return world_size_; }
    int size(MeshDim dim) const { return sizes_[static_cast<size_t>(dim)]; }
    int tp() const { return size(MeshDim::tp); }
    int dp() const { return size(MeshDim::dp); }
    int pp() const { return size(MeshDim::pp); }
    int cp() const { return size(MeshDim::cp); }
    // The data group's size: the ranks holding the same weights.
    int data_size() const { return dp() * cp(); }
    int data_index(const MeshCoord& c) const { return c.cp + cp() * c.dp; }

    MeshCoord coord(int world_rank) const;
    int world_rank(const MeshCoord& coord) const;
    // World ranks of the group along dim that contains world_rank, in group-rank order.
    std::vector<int> group(MeshDim dim, int world_rank) const;
    // The data group of world_rank (see above), in data_index order.
    std::vector<int> data_group(int world_rank) const;
    // Hybrid sharding: the data group cut into blocks of shard_size consecutive dp ranks (a
    // divisor of dp; with their cp ranks). The shard group of world_rank is its block (gradients and AdamW state
    // are sharded within it); its replica group holds the rank at its place in every block
    // (the shards' sums are all-reduced across it). shard_size = dp: one block, replicas alone.
    std::vector<int> shard_group(int world_rank, int shard_size) const;
    std::vector<int> replica_group(int world_rank, int shard_size) const;
    // "tp 1, dp 0, pp 1" (and ", cp 1" when cp > 1)
    std::string describe(int world_rank) const;
    // "tp 2 x dp 4 x pp 1"; "tp 2 x cp 2 x dp 1 x pp 1" with cp > 1
    std::string describe_sizes() const;

private:
    int world_size_;
    std::array<int, 4> sizes_;       // indexed by MeshDim
    std::array<MeshDim, 4> order_;   // fastest first
};

// Parses "tp-dp-pp"-style orders (three dims, fastest first); throws a config error naming
// the allowed ones.
std::array<MeshDim, 3> parse_mesh_order(const std::string& order);

}  // namespace llmtrain

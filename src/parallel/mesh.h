// Mesh: the world's ranks as a 3-D grid tp x dp x pp. With the default order "tp-dp-pp"
// (fastest first) consecutive world ranks differ in tp, so a tensor-parallel group stays
// inside a node; then dp; pp is slowest, so pipeline neighbours are usually in other nodes.
//
//   world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)          (order tp-dp-pp)
//
// Any group comes from one formula: the ranks that share every coordinate but one.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace llmtrain {

enum class MeshDim { tp = 0, dp = 1, pp = 2 };
const char* mesh_dim_name(MeshDim dim);

struct MeshCoord {
    int tp = 0, dp = 0, pp = 0;
    int operator[](MeshDim dim) const { return dim == MeshDim::tp ? tp : dim == MeshDim::dp ? dp : pp; }
    bool operator==(const MeshCoord&) const = default;
};

class Mesh {
public:
    // order: the three dims fastest first, e.g. "tp-dp-pp" or "tp-pp-dp". Throws a config
    // error if tp * dp * pp != world_size or order is not a permutation of tp, dp, pp.
    Mesh(int world_size, int tp, int dp, int pp, const std::string& order = "tp-dp-pp");

    int world_size() const { return world_size_; }
    int size(MeshDim dim) const { return sizes_[static_cast<size_t>(dim)]; }
    int tp() const { return size(MeshDim::tp); }
    int dp() const { return size(MeshDim::dp); }
    int pp() const { return size(MeshDim::pp); }

    MeshCoord coord(int world_rank) const;
    int world_rank(const MeshCoord& coord) const;
    // World ranks of the group along dim that contains world_rank, in group-rank order.
    std::vector<int> group(MeshDim dim, int world_rank) const;
    // Hybrid sharding: the dp group cut into blocks of shard_size consecutive dp ranks (a
    // divisor of dp). The shard group of world_rank is its block (gradients and AdamW state
    // are sharded within it); its replica group holds the rank at its place in every block
    // (the shards' sums are all-reduced across it). shard_size = dp: one block, replicas alone.
    std::vector<int> shard_group(int world_rank, int shard_size) const;
    std::vector<int> replica_group(int world_rank, int shard_size) const;
    // "tp 1, dp 0, pp 1"
    std::string describe(int world_rank) const;

private:
    int world_size_;
    std::array<int, 3> sizes_;       // indexed by MeshDim
    std::array<MeshDim, 3> order_;   // fastest first
};

// Parses "tp-dp-pp"-style orders; throws a config error naming the allowed ones.
std::array<MeshDim, 3> parse_mesh_order(const std::string& order);

}  // namespace llmtrain

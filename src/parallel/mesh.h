// Mesh: the world's ranks as a grid of named dimensions, fastest first. The dense layers see
// tp x cp x dp x pp; with the default order "tp-dp-pp" consecutive world ranks differ in tp, so
// a tensor-parallel group stays inside a node; then cp, then dp; pp is slowest, so pipeline
// neighbours are usually in other nodes. Context parallelism (cp) always sits just inside dp,
// whatever the order names (as in Megatron-Core's tp-cp-ep-dp-pp): its ring passes keys and
// values every layer, so it should be as near as tp allows.
//
// A rank's coordinate on dimension d is (world_rank / stride_d) % size_d, where stride_d is the
// product of the sizes of the dimensions before d in the list; so, with the order tp-dp-pp,
//
//   world_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
//
// Every group comes from one formula: the ranks that share every coordinate but those of some
// dimensions, which count through their values as one mixed-radix number (the first fastest).
// The tp group varies tp; the ranks sharing tp and pp coordinates (cp x dp of them) hold the
// same weights: they are the data group, over which gradients are reduced and ZeRO shards the
// training state, in the order cp_rank + cp * dp_rank (data_index). The cp ranks of one dp
// rank read the same sequences, each its chunks of them. Hybrid sharding cuts a group into
// blocks of consecutive members: a rank's block, and its replicas at the same place in the
// other blocks.
//
// Expert parallelism folds the same ranks differently (Megatron-Core's "parallel folding",
// with expert tensor parallelism etp = 1): the expert layers see etp x ep x edp x pp. Within
// one pipeline stage, the stage's tp * cp * dp ranks are numbered s in world-rank order (the
// stage group: every dimension but pp varied), and
//
//   ep_rank = s mod ep,   edp_rank = s / ep          (ep divides tp * cp * dp; edp = that / ep)
//
// The expert group (the ep ranks that exchange tokens by all-to-all, each holding its share of
// the experts) is a block of ep consecutive s; the expert-data group (the edp ranks holding the
// same experts, over which expert gradients are reduced and expert state is sharded) takes
// every ep-th s. Worked example, tp 2 x dp 4 x pp 1 (order tp-dp-pp) with ep 4:
//
//   world rank  0  1  2  3  4  5  6  7      dense:  tp groups {0,1} {2,3} {4,5} {6,7}
//   tp rank     0  1  0  1  0  1  0  1              data groups {0,2,4,6} {1,3,5,7}
//   dp rank     0  0  1  1  2  2  3  3
//   ep rank     0  1  2  3  0  1  2  3      experts: expert groups {0,1,2,3} {4,5,6,7}
//   edp rank    0  0  0  0  1  1  1  1               expert-data groups {0,4} {1,5} {2,6} {3,7}
//
// So an expert group is ep consecutive world ranks with the default order (two tp groups here:
// its all-to-all stays as near as tp's collectives allow), and the ranks holding the same
// experts are ep ranks apart, as a data group's are tp apart. Hybrid
// sharding of expert state keeps the dense layout's number of replica blocks (dp / shard_size)
// and cuts the expert-data group into that many blocks: with the default order an expert shard
// block lies within the ranks of a dense shard block.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain {

// The names of the mesh's dimensions, which also name their groups and communicators.
namespace mesh_dim {
inline constexpr std::string_view tp = "tp", cp = "cp", dp = "dp", pp = "pp";
// The expert layers' folding of a stage's ranks (above).
inline constexpr std::string_view ep = "ep", edp = "edp";
}  // namespace mesh_dim

// One dimension: its name (one of mesh_dim's) and its size.
struct MeshDim {
    std::string_view name;
    int size = 1;
};

// A rank's coordinate on each dimension of its mesh, by name: coord[mesh_dim::pp]. Built from
// {name, value} pairs in any order; a dimension left out is at 0.
class MeshCoord {
public:
    static constexpr size_t kMaxDims = 6;
    struct Entry {
        std::string_view name;
        int value = 0;
    };
    MeshCoord() = default;
    MeshCoord(std::initializer_list<Entry> entries);
    int operator[](std::string_view dim) const;
    int& operator[](std::string_view dim);  // adds the dimension at 0 if absent
    bool operator==(const MeshCoord& other) const;

private:
    const Entry* find(std::string_view dim) const;
    std::array<Entry, kMaxDims> entries_{};
    size_t count_ = 0;
};

class Mesh {
public:
    // order: tp, dp and pp fastest first, e.g. "tp-dp-pp" or "tp-pp-dp" (cp goes just before
    // dp). ep: the expert layers' ranks per expert group (see above). Throws a config error if
    // tp * cp * dp * pp != world_size, order is not a permutation of tp, dp, pp, or ep does not
    // divide tp * cp * dp.
    Mesh(int world_size, int tp, int dp, int pp, const std::string& order = "tp-dp-pp", int cp = 1, int ep = 1);

    int world_size() const { return world_size_; }
    // The dense layers' dimensions, fastest first.
    const std::vector<MeshDim>& dims() const { return dims_; }
    int size(std::string_view dim) const { return dims_[position(dim)].size; }
    int tp() const { return size(mesh_dim::tp); }
    int cp() const { return size(mesh_dim::cp); }
    int dp() const { return size(mesh_dim::dp); }
    int pp() const { return size(mesh_dim::pp); }
    // The data group's size: the ranks holding the same weights.
    int data_size() const { return dp() * cp(); }
    int data_index(const MeshCoord& c) const { return c[mesh_dim::cp] + cp() * c[mesh_dim::dp]; }

    MeshCoord coord(int world_rank) const;
    int world_rank(const MeshCoord& coord) const;
    // World ranks of the group along dim that contains world_rank, in group-rank order.
    std::vector<int> group(std::string_view dim, int world_rank) const;
    // The data group of world_rank (see above), in data_index order.
    std::vector<int> data_group(int world_rank) const;
    // Hybrid sharding: the data group cut into blocks of shard_size consecutive dp ranks (a
    // divisor of dp; with their cp ranks). The shard group of world_rank is its block (gradients and AdamW state
    // are sharded within it); its replica group holds the rank at its place in every block
    // (the shards' sums are all-reduced across it). shard_size = dp: one block, replicas alone.
    std::vector<int> shard_group(int world_rank, int shard_size) const;
    std::vector<int> replica_group(int world_rank, int shard_size) const;

    // Expert parallelism (see above). ep = 1: every rank holds every expert, its expert group
    // is itself and its expert-data group is its stage's ranks.
    int ep() const { return ep_; }
    int edp() const { return stage_size() / ep_; }
    int ep_rank(int world_rank) const { return stage_index(world_rank) % ep_; }
    int edp_rank(int world_rank) const { return stage_index(world_rank) / ep_; }
    // The ep ranks exchanging tokens with world_rank, in ep_rank order.
    std::vector<int> expert_group(int world_rank) const;
    // The edp ranks holding world_rank's experts, in edp_rank order.
    std::vector<int> expert_data_group(int world_rank) const;
    // Hybrid sharding of expert state: the expert-data group cut into dp / shard_size blocks
    // (as many as the data group's), each of edp * shard_size / dp ranks; a config error if
    // they do not divide edp.
    std::vector<int> expert_shard_group(int world_rank, int shard_size) const;
    std::vector<int> expert_replica_group(int world_rank, int shard_size) const;

    // "tp 1, dp 0, pp 1" (and ", cp 1" when cp > 1, ", ep 1, edp 0" when ep > 1)
    std::string describe(int world_rank) const;
    // "tp 2 x dp 4 x pp 1"; "tp 2 x cp 2 x dp 1 x pp 1" with cp > 1; "... (experts: ep 4 x edp 2)" with ep > 1
    std::string describe_sizes() const;

private:
    size_t position(std::string_view dim) const;
    // The ranks sharing world_rank's coordinates but those at `positions` (of dims_), counted
    // as one mixed-radix number over them, the first fastest: the formula of every group.
    std::vector<int> ranks_varying(const std::vector<size_t>& positions, int world_rank) const;
    int stage_size() const { return world_size_ / pp(); }
    // world_rank's place s among its stage's ranks, in world-rank order.
    int stage_index(int world_rank) const;
    int expert_shard_block(int shard_size) const;

    int world_size_;
    std::vector<MeshDim> dims_;  // fastest first
    std::vector<int> strides_;   // of dims_
    std::vector<size_t> stage_positions_;  // every dimension but pp, fastest first
    int ep_ = 1;
};

// Parses "tp-dp-pp"-style orders (tp, dp and pp, fastest first); throws a config error naming
// the allowed ones.
std::vector<std::string_view> parse_mesh_order(const std::string& order);

}  // namespace llmtrain

#include "parallel/mesh.h"

#include <algorithm>

#include "core/error.h"

namespace llmtrain {

const char* mesh_dim_name(MeshDim dim) {
    switch (dim) {
        case MeshDim::tp: return "tp";
        case MeshDim::dp: return "dp";
        case MeshDim::pp: return "pp";
        case MeshDim::cp: return "cp";
    }
    return "?";
}

std::array<MeshDim, 3> parse_mesh_order(const std::string& order) {
    static const char* const allowed = "tp-dp-pp, tp-pp-dp, dp-tp-pp, dp-pp-tp, pp-tp-dp, pp-dp-tp";
    std::array<MeshDim, 3> dims{};
    if (order.size() != 8 || order[2] != '-' || order[5] != '-') fail(ErrorKind::config, "mesh order \"", order, "\" (allowed: ", allowed, ")");
    for (size_t i = 0; i < 3; ++i) {
        const std::string name = order.substr(3 * i, 2);
        if (name == "tp") dims[i] = MeshDim::tp;
        else if (name == "dp") dims[i] = MeshDim::dp;
        else if (name == "pp") dims[i] = MeshDim::pp;
        else fail(ErrorKind::config, "mesh order \"", order, "\" (allowed: ", allowed, ")");
    }
    if (dims[0] == dims[1] || dims[1] == dims[2] || dims[0] == dims[2])
        fail(ErrorKind::config, "mesh order \"", order, "\" names a dimension twice (allowed: ", allowed, ")");
    return dims;
}

namespace {
// The three named dims with cp inserted just before dp.
std::array<MeshDim, 4> with_cp_inside_dp(const std::array<MeshDim, 3>& order) {
    std::array<MeshDim, 4> dims{};
    size_t i = 0;
    for (MeshDim dim : order) {
        if (dim == MeshDim::dp) dims[i++] = MeshDim::cp;
        dims[i++] = dim;
    }
    return dims;
}
}  // namespace

Mesh::Mesh(int world_size, int tp, int dp, int pp, const std::string& order, int cp)
    : world_size_(world_size), sizes_{tp, dp, pp, cp}, order_(with_cp_inside_dp(parse_mesh_order(order))) {
    if (tp < 1 || dp < 1 || pp < 1 || cp < 1 || static_cast<long long>(tp) * cp * dp * pp != world_size)
        fail(ErrorKind::config, "world size ", world_size, " is not tp * ", cp > 1 ? "cp * " : "", "dp * pp = ", tp, " * ", cp > 1 ? cat(cp, " * ") : "", dp,
             " * ", pp, " = ", static_cast<long long>(tp) * cp * dp * pp);
}

MeshCoord Mesh::coord(int world_rank) const {
    if (world_rank < 0 || world_rank >= world_size_) fail(ErrorKind::runtime, "rank ", world_rank, " outside the world of ", world_size_);
    MeshCoord c;
    int rest = world_rank;
    for (MeshDim dim : order_) {
        c[dim] = rest % size(dim);
        rest /= size(dim);
    }
    return c;
}

int Mesh::world_rank(const MeshCoord& coord) const {
    int rank = 0;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) rank = rank * size(*it) + coord[*it];
    return rank;
}

std::vector<int> Mesh::group(MeshDim dim, int rank) const {
    MeshCoord c = coord(rank);
    std::vector<int> ranks;
    for (int i = 0; i < size(dim); ++i) {
        c[dim] = i;
        ranks.push_back(world_rank(c));
    }
    return ranks;
}

std::vector<int> Mesh::data_group(int rank) const {
    MeshCoord c = coord(rank);
    std::vector<int> ranks;
    for (c.dp = 0; c.dp < dp(); ++c.dp)
        for (c.cp = 0; c.cp < cp(); ++c.cp) ranks.push_back(world_rank(c));
    return ranks;
}

namespace {
void check_shard_size(int dp, int shard_size) {
    if (shard_size < 1 || dp % shard_size != 0) fail(ErrorKind::config, "shard size ", shard_size, " does not divide dp = ", dp);
}
}  // namespace

// A block is shard_size dp ranks with their cp ranks: shard_size * cp consecutive entries
// of the data group.
std::vector<int> Mesh::shard_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    const std::vector<int> data = data_group(rank);
    const int block_size = shard_size * cp();
    const auto block = data.begin() + data_index(coord(rank)) / block_size * block_size;
    return {block, block + block_size};
}

std::vector<int> Mesh::replica_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    const std::vector<int> data = data_group(rank);
    const size_t block_size = static_cast<size_t>(shard_size * cp());
    std::vector<int> ranks;
    for (size_t i = static_cast<size_t>(data_index(coord(rank))) % block_size; i < data.size(); i += block_size) ranks.push_back(data[i]);
    return ranks;
}

std::string Mesh::describe(int rank) const {
    const MeshCoord c = coord(rank);
    return cat("tp ", c.tp, ", dp ", c.dp, ", pp ", c.pp, cp() > 1 ? cat(", cp ", c.cp) : "");
}

std::string Mesh::describe_sizes() const { return cat("tp ", tp(), cp() > 1 ? cat(" x cp ", cp()) : "", " x dp ", dp(), " x pp ", pp()); }

}  // namespace llmtrain

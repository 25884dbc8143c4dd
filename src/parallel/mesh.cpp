#include "parallel/mesh.h"

#include <algorithm>

#include "core/error.h"

namespace llmtrain {

const char* mesh_dim_name(MeshDim dim) {
    switch (dim) {
        case MeshDim::tp: return "tp";
        case MeshDim::dp: return "dp";
        case MeshDim::pp: return "pp";
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

Mesh::Mesh(int world_size, int tp, int dp, int pp, const std::string& order)
    : world_size_(world_size), sizes_{tp, dp, pp}, order_(parse_mesh_order(order)) {
    if (tp < 1 || dp < 1 || pp < 1 || static_cast<long long>(tp) * dp * pp != world_size)
        fail(ErrorKind::config, "world size ", world_size, " is not tp * dp * pp = ", tp, " * ", dp, " * ", pp, " = ",
             static_cast<long long>(tp) * dp * pp);
}

MeshCoord Mesh::coord(int world_rank) const {
    if (world_rank < 0 || world_rank >= world_size_) fail(ErrorKind::runtime, "rank ", world_rank, " outside the world of ", world_size_);
    std::array<int, 3> c{};
    int rest = world_rank;
    for (MeshDim dim : order_) {
        c[static_cast<size_t>(dim)] = rest % size(dim);
        rest /= size(dim);
    }
    return {c[0], c[1], c[2]};
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
        (dim == MeshDim::tp ? c.tp : dim == MeshDim::dp ? c.dp : c.pp) = i;
        ranks.push_back(world_rank(c));
    }
    return ranks;
}

namespace {
void check_shard_size(int dp, int shard_size) {
    if (shard_size < 1 || dp % shard_size != 0) fail(ErrorKind::config, "shard size ", shard_size, " does not divide dp = ", dp);
}
}  // namespace

std::vector<int> Mesh::shard_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    const std::vector<int> dp_group = group(MeshDim::dp, rank);
    const auto block = dp_group.begin() + coord(rank).dp / shard_size * shard_size;
    return {block, block + shard_size};
}

std::vector<int> Mesh::replica_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    const std::vector<int> dp_group = group(MeshDim::dp, rank);
    std::vector<int> ranks;
    for (size_t i = static_cast<size_t>(coord(rank).dp % shard_size); i < dp_group.size(); i += static_cast<size_t>(shard_size)) ranks.push_back(dp_group[i]);
    return ranks;
}

std::string Mesh::describe(int rank) const {
    const MeshCoord c = coord(rank);
    return cat("tp ", c.tp, ", dp ", c.dp, ", pp ", c.pp);
}

}  // namespace llmtrain

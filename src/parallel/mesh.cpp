#include "parallel/mesh.h"

#include <algorithm>

#include "core/error.h"

namespace llmtrain {

MeshCoord::MeshCoord(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) (*this)[e.name] = e.value;
}

const MeshCoord::Entry* MeshCoord::find(std::string_view dim) const {
    for (size_t i = 0; i < count_; ++i)
        if (entries_[i].name == dim) return &entries_[i];
    return nullptr;
}

int MeshCoord::operator[](std::string_view dim) const {
    const Entry* e = find(dim);
    return e ? e->value : 0;
}

int& MeshCoord::operator[](std::string_view dim) {
    if (const Entry* e = find(dim)) return const_cast<Entry*>(e)->value;
    if (count_ == kMaxDims) fail(ErrorKind::runtime, "mesh coordinate: more than ", kMaxDims, " dimensions (adding \"", dim, "\")");
    entries_[count_] = {dim, 0};
    return entries_[count_++].value;
}

// Equal when every dimension either names has the same value (absent: 0).
bool MeshCoord::operator==(const MeshCoord& other) const {
    const auto agrees = [](const MeshCoord& a, const MeshCoord& b) {
        return std::all_of(a.entries_.begin(), a.entries_.begin() + static_cast<std::ptrdiff_t>(a.count_), [&](const Entry& e) { return b[e.name] == e.value; });
    };
    return agrees(*this, other) && agrees(other, *this);
}

namespace {
// The dimensions parallel.order names, fastest first; cp goes just before dp.
constexpr std::array<std::string_view, 3> kOrderedDims = {mesh_dim::tp, mesh_dim::dp, mesh_dim::pp};
constexpr const char* kAllowedOrders = "tp-dp-pp, tp-pp-dp, dp-tp-pp, dp-pp-tp, pp-tp-dp, pp-dp-tp";
}  // namespace

std::vector<std::string_view> parse_mesh_order(const std::string& order) {
    std::vector<std::string_view> dims;
    std::string_view rest = order;
    for (size_t dash = 0; dash != std::string_view::npos; rest.remove_prefix(dash + 1)) {
        dash = rest.find('-');
        const auto known = std::find(kOrderedDims.begin(), kOrderedDims.end(), rest.substr(0, dash));
        if (known == kOrderedDims.end()) fail(ErrorKind::config, "mesh order \"", order, "\" (allowed: ", kAllowedOrders, ")");
        if (std::find(dims.begin(), dims.end(), *known) != dims.end())
            fail(ErrorKind::config, "mesh order \"", order, "\" names a dimension twice (allowed: ", kAllowedOrders, ")");
        dims.push_back(*known);
        if (dash == std::string_view::npos) break;
    }
    if (dims.size() != kOrderedDims.size()) fail(ErrorKind::config, "mesh order \"", order, "\" (allowed: ", kAllowedOrders, ")");
    return dims;
}

Mesh::Mesh(int world_size, int tp, int dp, int pp, const std::string& order, int cp, int ep) : world_size_(world_size), ep_(ep) {
    const std::vector<std::string_view> ordered = parse_mesh_order(order);
    if (tp < 1 || dp < 1 || pp < 1 || cp < 1 || static_cast<long long>(tp) * cp * dp * pp != world_size)
        fail(ErrorKind::config, "world size ", world_size, " is not tp * ", cp > 1 ? "cp * " : "", "dp * pp = ", tp, " * ", cp > 1 ? cat(cp, " * ") : "", dp,
             " * ", pp, " = ", static_cast<long long>(tp) * cp * dp * pp);
    const std::array<MeshDim, 4> given = {{{mesh_dim::tp, tp}, {mesh_dim::cp, cp}, {mesh_dim::dp, dp}, {mesh_dim::pp, pp}}};
    const auto size_of = [&](std::string_view name) { return std::find_if(given.begin(), given.end(), [&](const MeshDim& d) { return d.name == name; })->size; };
    for (std::string_view name : ordered) {
        if (name == mesh_dim::dp) dims_.push_back({mesh_dim::cp, cp});
        dims_.push_back({name, size_of(name)});
    }
    int stride = 1;
    for (size_t i = 0; i < dims_.size(); ++i) {
        strides_.push_back(stride);
        stride *= dims_[i].size;
        if (dims_[i].name != mesh_dim::pp) stage_positions_.push_back(i);
    }
    if (ep < 1 || stage_size() % ep != 0)
        fail(ErrorKind::config, "ep = ", ep, " does not divide the ", stage_size(), " ranks of a pipeline stage (tp * cp * dp = ", tp, " * ", cp, " * ", dp, ")");
}

size_t Mesh::position(std::string_view dim) const {
    for (size_t i = 0; i < dims_.size(); ++i)
        if (dims_[i].name == dim) return i;
    fail(ErrorKind::runtime, "the mesh has no dimension \"", dim, "\"");
}

MeshCoord Mesh::coord(int world_rank) const {
    if (world_rank < 0 || world_rank >= world_size_) fail(ErrorKind::runtime, "rank ", world_rank, " outside the world of ", world_size_);
    MeshCoord c;
    for (size_t i = 0; i < dims_.size(); ++i) c[dims_[i].name] = world_rank / strides_[i] % dims_[i].size;
    return c;
}

int Mesh::world_rank(const MeshCoord& coord) const {
    int rank = 0;
    for (size_t i = 0; i < dims_.size(); ++i) {
        const int at = coord[dims_[i].name];
        if (at < 0 || at >= dims_[i].size) fail(ErrorKind::runtime, "mesh coordinate ", dims_[i].name, " ", at, " outside 0 .. ", dims_[i].size - 1);
        rank += at * strides_[i];
    }
    return rank;
}

std::vector<int> Mesh::ranks_varying(const std::vector<size_t>& positions, int world_rank) const {
    if (world_rank < 0 || world_rank >= world_size_) fail(ErrorKind::runtime, "rank ", world_rank, " outside the world of ", world_size_);
    int base = world_rank, count = 1;
    for (size_t p : positions) {
        base -= world_rank / strides_[p] % dims_[p].size * strides_[p];
        count *= dims_[p].size;
    }
    std::vector<int> ranks;
    ranks.reserve(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
        int rest = i, rank = base;
        for (size_t p : positions) {
            rank += rest % dims_[p].size * strides_[p];
            rest /= dims_[p].size;
        }
        ranks.push_back(rank);
    }
    return ranks;
}

std::vector<int> Mesh::group(std::string_view dim, int rank) const { return ranks_varying({position(dim)}, rank); }

std::vector<int> Mesh::data_group(int rank) const { return ranks_varying({position(mesh_dim::cp), position(mesh_dim::dp)}, rank); }

namespace {
void check_shard_size(int dp, int shard_size) {
    if (shard_size < 1 || dp % shard_size != 0) fail(ErrorKind::config, "shard size ", shard_size, " does not divide dp = ", dp);
}

// `group` cut into blocks of `block` consecutive members: the block holding the member at
// `at`, and the members at at's place in every block.
std::vector<int> block_of(const std::vector<int>& group, int at, int block) {
    const auto first = group.begin() + at / block * block;
    return {first, first + block};
}

std::vector<int> across_blocks(const std::vector<int>& group, int at, int block) {
    std::vector<int> ranks;
    for (size_t i = static_cast<size_t>(at % block); i < group.size(); i += static_cast<size_t>(block)) ranks.push_back(group[i]);
    return ranks;
}
}  // namespace

// A block is shard_size dp ranks with their cp ranks: shard_size * cp consecutive entries
// of the data group.
std::vector<int> Mesh::shard_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    return block_of(data_group(rank), data_index(coord(rank)), shard_size * cp());
}

std::vector<int> Mesh::replica_group(int rank, int shard_size) const {
    check_shard_size(dp(), shard_size);
    return across_blocks(data_group(rank), data_index(coord(rank)), shard_size * cp());
}

// s is the mixed-radix number of world_rank's coordinates on the stage's dimensions, in the
// mesh's order: ranks of one stage differ only there, so s grows with the world rank.
int Mesh::stage_index(int rank) const {
    const MeshCoord c = coord(rank);
    int s = 0;
    for (auto p = stage_positions_.rbegin(); p != stage_positions_.rend(); ++p) s = s * dims_[*p].size + c[dims_[*p].name];
    return s;
}

std::vector<int> Mesh::expert_group(int rank) const { return block_of(ranks_varying(stage_positions_, rank), stage_index(rank), ep_); }

std::vector<int> Mesh::expert_data_group(int rank) const { return across_blocks(ranks_varying(stage_positions_, rank), stage_index(rank), ep_); }

// The dense layout's dp / shard_size replica blocks, over the expert-data group.
int Mesh::expert_shard_block(int shard_size) const {
    check_shard_size(dp(), shard_size);
    const int blocks = dp() / shard_size;
    if (edp() % blocks != 0)
        fail(ErrorKind::config, "shard size ", shard_size, " makes dp / shard_size = ", blocks, " replica blocks, which do not divide the ", edp(),
             " ranks of an expert-data group (edp = tp * cp * dp / ep)");
    return edp() / blocks;
}

std::vector<int> Mesh::expert_shard_group(int rank, int shard_size) const {
    return block_of(expert_data_group(rank), edp_rank(rank), expert_shard_block(shard_size));
}

std::vector<int> Mesh::expert_replica_group(int rank, int shard_size) const {
    return across_blocks(expert_data_group(rank), edp_rank(rank), expert_shard_block(shard_size));
}

std::string Mesh::describe(int rank) const {
    const MeshCoord c = coord(rank);
    return cat("tp ", c[mesh_dim::tp], ", dp ", c[mesh_dim::dp], ", pp ", c[mesh_dim::pp], cp() > 1 ? cat(", cp ", c[mesh_dim::cp]) : "",
               ep_ > 1 ? cat(", ep ", ep_rank(rank), ", edp ", edp_rank(rank)) : "");
}

std::string Mesh::describe_sizes() const {
    return cat("tp ", tp(), cp() > 1 ? cat(" x cp ", cp()) : "", " x dp ", dp(), " x pp ", pp(), ep_ > 1 ? cat(" (experts: ep ", ep_, " x edp ", edp(), ")") : "");
}

}  // namespace llmtrain

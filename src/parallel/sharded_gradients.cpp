#include "parallel/sharded_gradients.h"

#include <algorithm>

namespace llmtrain {

namespace {

int64_t piece_of(int64_t numel, int parts) { return (numel + parts - 1) / parts; }

FlatRange flat_range_of(const std::vector<FlatRange>& ranges, const GradGroup& g) {
    if (g.first >= g.end || g.end > ranges.size()) fail(ErrorKind::runtime, "gradient group of parameters [", g.first, ", ", g.end, ") of ", ranges.size());
    return {ranges[g.first].begin, ranges[g.end - 1].end};
}

// Element counts: the shard, the pool buffers (group-sized) and receive pieces, the resident groups.
struct Sizes {
    int64_t shard = 0, pool_buffer = 0, received = 0, resident = 0;
    int64_t total() const { return shard + ShardedGradients::kPoolBuffers * (pool_buffer + received) + resident; }
};

Sizes sizes_of(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts) {
    Sizes s;
    for (const GradGroup& g : groups) {
        const int64_t piece = piece_of(flat_range_of(ranges, g).size(), parts);
        s.shard += piece;
        s.received = std::max(s.received, piece);
        if (g.resident) s.resident += piece * parts;
        else s.pool_buffer = std::max(s.pool_buffer, piece * parts);
    }
    // The parameters' all-gather stages through a pool buffer: one exists even when every group is resident.
    s.pool_buffer = std::max<int64_t>(s.pool_buffer, 1);
    return s;
}

Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t numel) { return flat.slice_rows(begin, numel); }

// Rank `rank`'s piece of a group of numel elements cut in pieces of `piece`: [from, to) within it.
FlatRange piece_within(int64_t numel, int64_t piece, int rank) {
    const int64_t from = std::min(numel, rank * piece);
    return {from, std::min(numel, from + piece)};
}

}  // namespace

std::vector<ShardedGroupLayout> sharded_group_layout(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts, int rank) {
    std::vector<ShardedGroupLayout> layout;
    int64_t shard_at = 0;
    for (const GradGroup& g : groups) {
        ShardedGroupLayout l{flat_range_of(ranges, g), 0, shard_at, {}, g.resident};
        l.piece = piece_of(l.flat.size(), parts);
        l.mine = piece_within(l.flat.size(), l.piece, rank);
        shard_at += l.piece;
        layout.push_back(l);
    }
    return layout;
}

int64_t sharded_owned_numel(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts, int rank) {
    int64_t owned = 0;
    for (const ShardedGroupLayout& l : sharded_group_layout(ranges, groups, parts, rank)) owned += l.mine.size();
    return owned;
}

int64_t sharded_gradient_numel(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int parts) {
    return sizes_of(ranges, groups, parts).total();
}

ShardedGradients::ShardedGradients(FlatParameters params, std::vector<GradGroup> groups, Comm& shard, Comm* replicas, FlatOps ops)
    : params_(std::move(params)), group_(shard), replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), ops_(std::move(ops)) {
    const DType dtype = params_.values.dtype();
    const int parts = group_.size();
    const Sizes sizes = sizes_of(params_.ranges, groups, parts);
    group_of_param_.assign(params_.ranges.size(), groups.size());
    shard_ = params_.allocate(dtype, {sizes.shard});
    const std::vector<ShardedGroupLayout> layout = sharded_group_layout(params_.ranges, groups, parts, group_.rank());
    for (size_t k = 0; k < groups.size(); ++k) {
        const GradGroup& g = groups[k];
        const ShardedGroupLayout& l = layout[k];
        Group group{g, l.flat, l.piece, l.shard_at, 0, -1, Tensor()};
        for (size_t i = g.first; i < g.end; ++i) {
            if (group_of_param_[i] != groups.size()) fail(ErrorKind::runtime, "gradient groups overlap at parameter ", i);
            group_of_param_[i] = groups_.size();
        }
        if (g.resident) {
            resident_buffers_.push_back(params_.allocate(dtype, {group.piece * parts}));
            group.resident_buffer = resident_buffers_.back().view();
        }
        // This rank's piece, clipped to the group's real elements.
        if (l.mine.size() > 0)
            owned_.push_back({l.flat.begin + l.mine.begin, l.flat.begin + l.mine.end, flat_slice(shard_.view(), l.shard_at, l.mine.size()), {}, {}});
        groups_.push_back(group);
    }
    for (size_t i = 0; i < group_of_param_.size(); ++i)
        if (group_of_param_[i] == groups_.size()) fail(ErrorKind::runtime, "parameter ", i, " is in no gradient group");
    for (int s = 0; s < kPoolBuffers; ++s)
        slots_.push_back(Slot{params_.allocate(dtype, {sizes.pool_buffer}), params_.allocate(dtype, {sizes.received}), -1, CommHandle()});
    bytes_ = static_cast<size_t>(sizes.total()) * dtype_size(dtype);
}

std::string ShardedGradients::describe() const {
    if (!replicas_) return cat("ZeRO-2 (gradients sharded) | ", groups_.size(), " gradient groups");
    return cat("ZeRO-2 (gradients sharded over ", group_.size(), " dp ranks, replicated ", replicas_->size(), "x) | ", groups_.size(), " gradient groups");
}

std::vector<GradStorageBinding> ShardedGradients::run_storage() const {
    std::vector<GradStorageBinding> bindings;
    for (const Group& g : groups_)
        if (g.params.resident) bindings.push_back({g.params.first, g.params.end, g.resident_buffer, g.flat.begin});
    return bindings;
}

Tensor ShardedGradients::padded_buffer(const Group& g) const {
    const Tensor buffer = g.params.resident ? g.resident_buffer : slots_[static_cast<size_t>(g.slot)].buffer.view();
    return flat_slice(buffer, 0, g.piece * group_.size());
}

void ShardedGradients::begin_step(bool reduce) {
    if (!reduce) fail(ErrorKind::runtime, "ZeRO-2 reduces every step's gradients: an optimizer that keeps them local (1-bit Adam) needs parallel.zero_stage = 0");
    for (Slot& slot : slots_) settle(slot);
    ops_.zero(shard_.view());
    for (const OwnedTensor& buffer : resident_buffers_) ops_.zero(buffer.view());
}

// Pool buffers are taken in turn: while backward writes one group, the previous group's
// reduction proceeds from the other buffer.
std::optional<GradStorageBinding> ShardedGradients::open(size_t first, size_t end) {
    Group& g = groups_[group_of(first)];
    if (g.params.first != first || g.params.end != end)
        fail(ErrorKind::runtime, "gradients of parameters [", first, ", ", end, ") opened, but their group is [", g.params.first, ", ", g.params.end, ")");
    g.waiting = static_cast<int>(end - first);
    if (g.params.resident) return std::nullopt;
    Slot& slot = slots_[static_cast<size_t>(next_slot_)];
    settle(slot);
    g.slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % kPoolBuffers;
    const Tensor buffer = padded_buffer(g);
    ops_.zero(buffer);
    return GradStorageBinding{first, end, buffer, g.flat.begin};
}

bool ShardedGradients::consumes(size_t param, bool last_micro_batch) const {
    return last_micro_batch || !groups_[group_of(param)].params.resident;
}

void ShardedGradients::ready(size_t first, size_t end, bool /*last_micro_batch*/) {
    for (size_t i = first; i < end; ++i) {
        const size_t index = group_of(i);
        Group& g = groups_[index];
        if (g.params.resident || --g.waiting > 0) continue;
        Slot& slot = slots_[static_cast<size_t>(g.slot)];
        reduce(index, slot, padded_buffer(g));
    }
}

void ShardedGradients::reduce(size_t group, Slot& slot, const Tensor& buffer) {
    const Group& g = groups_[group];
    slot.group = static_cast<int>(group);
    const int64_t p = group_.size();
    bytes_sent_ += static_cast<int64_t>(buffer.bytes()) * (p - 1) / p;
    slot.handle = group_.reduce_scatter_async(flat_slice(slot.received.view(), 0, g.piece), buffer);
}

void ShardedGradients::settle(Slot& slot) {
    if (slot.group < 0) return;
    slot.handle.wait();
    const Group& g = groups_[static_cast<size_t>(slot.group)];
    const Tensor mine = flat_slice(shard_.view(), g.shard_at, g.piece);
    ops_.add(mine, mine, flat_slice(slot.received.view(), 0, g.piece));
    slot.group = -1;
}

void ShardedGradients::finish() {
    for (Slot& slot : slots_) settle(slot);
    // The resident groups, whole after the step's last micro-batch (and any sum across stages).
    for (size_t i = 0; i < groups_.size(); ++i) {
        if (!groups_[i].params.resident) continue;
        reduce(i, slots_.front(), padded_buffer(groups_[i]));
        settle(slots_.front());
    }
    // Hybrid sharding: each block summed its own ranks' gradients; the sum over the blocks.
    if (!replicas_) return;
    const int64_t r = replicas_->size();
    bytes_sent_ += 2 * static_cast<int64_t>(shard_.view().bytes()) * (r - 1) / r;
    replicas_->all_reduce(shard_.view(), ReduceOp::sum);
}

// Group by group: this rank's piece into its place in a group-sized buffer, the all-gather
// there, and the group's real elements back into the flat buffer.
void ShardedGradients::gather(const Tensor& flat) {
    const int parts = group_.size();
    for (Group& g : groups_) {
        const Tensor staging_memory = g.params.resident ? g.resident_buffer : slots_.front().buffer.view();
        const Tensor staging(staging_memory.raw(), flat.dtype(), Shape{g.piece * parts}, flat.device());
        const FlatRange mine = piece_within(g.flat.size(), g.piece, group_.rank());
        if (mine.size() > 0) ops_.copy(flat_slice(staging, mine.begin, mine.size()), flat_slice(flat, g.flat.begin + mine.begin, mine.size()));
        group_.all_gather(staging);
        ops_.copy(flat_slice(flat, g.flat.begin, g.flat.size()), flat_slice(staging, 0, g.flat.size()));
    }
}

void ShardedGradients::gather_parameters() { gather(params_.compute_values.empty() ? params_.values : params_.compute_values); }

void ShardedGradients::gather_master_values() {
    if (!params_.compute_values.empty()) gather(params_.values);
}

}  // namespace llmtrain

#include "parallel/sharded_gradients.h"

#include <algorithm>

namespace llmtrain {

namespace {

// Element counts: the shard, the pool buffers (group-sized) and receive pieces, the resident groups.
struct Sizes {
    int64_t shard = 0, pool_buffer = 0, received = 0, resident = 0;
    int64_t total() const { return shard + ShardedGradients::kPoolBuffers * (pool_buffer + received) + resident; }
};

Sizes sizes_of(const std::vector<FlatCut>& groups, int parts) {
    Sizes s;
    for (const FlatCut& g : groups) {
        s.shard += g.piece;
        s.received = std::max(s.received, g.piece);
        if (g.group.resident) s.resident += g.padded(parts);
        else s.pool_buffer = std::max(s.pool_buffer, g.padded(parts));
    }
    // The parameter store's all-gathers stage through a pool buffer: one exists even when every group is resident.
    s.pool_buffer = std::max<int64_t>(s.pool_buffer, 1);
    return s;
}

Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t numel) { return flat.slice_rows(begin, numel); }

}  // namespace

int64_t sharded_gradient_numel(const Placement& placement) { return sizes_of(placement.cuts(), placement.shard_size()).total(); }

ShardedGradients::ShardedGradients(FlatParameters params, std::vector<FlatCut> groups, Comm& shard, Comm* replicas, FlatOps ops)
    : params_(std::move(params)), group_(shard), replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), ops_(std::move(ops)) {
    const DType master = params_.master;
    const int parts = group_.size();
    const Sizes sizes = sizes_of(groups, parts);
    group_of_param_.assign(params_.ranges.size(), groups.size());
    shard_ = params_.allocate(master, {sizes.shard});
    for (const FlatCut& cut : groups) {
        Group group{cut, 0, -1, Tensor()};
        for (size_t i = cut.group.first; i < cut.group.end; ++i) {
            if (group_of_param_[i] != groups.size()) fail(ErrorKind::runtime, "gradient groups overlap at parameter ", i);
            group_of_param_[i] = groups_.size();
        }
        if (cut.group.resident) {
            resident_buffers_.push_back(params_.allocate(master, {cut.padded(parts)}));
            group.resident_buffer = resident_buffers_.back().view();
        }
        // This rank's piece, clipped to the group's real elements.
        const FlatRange mine = cut.piece_of(group_.rank());
        if (mine.size() > 0) owned_.push_back({mine.begin, mine.end, flat_slice(shard_.view(), cut.shard_at, mine.size()), {}, {}});
        groups_.push_back(group);
    }
    for (size_t i = 0; i < group_of_param_.size(); ++i)
        if (group_of_param_[i] == groups_.size()) fail(ErrorKind::runtime, "parameter ", i, " is in no gradient group");
    for (int s = 0; s < kPoolBuffers; ++s)
        slots_.push_back(Slot{params_.allocate(master, {sizes.pool_buffer}), params_.allocate(master, {sizes.received}), -1, CommHandle()});
    bytes_ = static_cast<size_t>(sizes.total()) * dtype_size(master);
}

std::string ShardedGradients::describe() const {
    if (!replicas_) return cat("ZeRO-2 (gradients sharded) | ", groups_.size(), " gradient groups");
    return cat("ZeRO-2 (gradients sharded over ", group_.size(), " dp ranks, replicated ", replicas_->size(), "x) | ", groups_.size(), " gradient groups");
}

std::vector<GradStorageBinding> ShardedGradients::run_storage() const {
    std::vector<GradStorageBinding> bindings;
    for (const Group& g : groups_)
        if (g.cut.group.resident) bindings.push_back({g.cut.group.first, g.cut.group.end, g.resident_buffer, g.cut.flat.begin});
    return bindings;
}

Tensor ShardedGradients::idle_buffer(size_t cut) const {
    const Group& g = groups_.at(cut);
    const Tensor buffer = g.cut.group.resident ? g.resident_buffer : slots_.front().buffer.view();
    return flat_slice(buffer, 0, g.cut.padded(group_.size()));
}

Tensor ShardedGradients::padded_buffer(const Group& g) const {
    const Tensor buffer = g.cut.group.resident ? g.resident_buffer : slots_[static_cast<size_t>(g.slot)].buffer.view();
    return flat_slice(buffer, 0, g.cut.padded(group_.size()));
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
    if (g.cut.group.first != first || g.cut.group.end != end)
        fail(ErrorKind::runtime, "gradients of parameters [", first, ", ", end, ") opened, but their group is [", g.cut.group.first, ", ", g.cut.group.end, ")");
    g.waiting = static_cast<int>(end - first);
    if (g.cut.group.resident) return std::nullopt;
    Slot& slot = slots_[static_cast<size_t>(next_slot_)];
    settle(slot);
    g.slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % kPoolBuffers;
    const Tensor buffer = padded_buffer(g);
    ops_.zero(buffer);
    return GradStorageBinding{first, end, buffer, g.cut.flat.begin};
}

bool ShardedGradients::consumes(size_t param, bool last_micro_batch) const {
    return last_micro_batch || !groups_[group_of(param)].cut.group.resident;
}

void ShardedGradients::ready(size_t first, size_t end, bool /*last_micro_batch*/) {
    for (size_t i = first; i < end; ++i) {
        const size_t index = group_of(i);
        Group& g = groups_[index];
        if (g.cut.group.resident || --g.waiting > 0) continue;
        Slot& slot = slots_[static_cast<size_t>(g.slot)];
        reduce(index, slot, padded_buffer(g));
    }
}

void ShardedGradients::reduce(size_t group, Slot& slot, const Tensor& buffer) {
    const Group& g = groups_[group];
    slot.group = static_cast<int>(group);
    const int64_t p = group_.size();
    bytes_sent_ += static_cast<int64_t>(buffer.bytes()) * (p - 1) / p;
    slot.handle = group_.reduce_scatter_async(flat_slice(slot.received.view(), 0, g.cut.piece), buffer);
}

void ShardedGradients::settle(Slot& slot) {
    if (slot.group < 0) return;
    slot.handle.wait();
    const Group& g = groups_[static_cast<size_t>(slot.group)];
    const Tensor mine = flat_slice(shard_.view(), g.cut.shard_at, g.cut.piece);
    ops_.add(mine, mine, flat_slice(slot.received.view(), 0, g.cut.piece));
    slot.group = -1;
}

void ShardedGradients::finish() {
    for (Slot& slot : slots_) settle(slot);
    // The resident groups, whole after the step's last micro-batch (and any sum across stages).
    for (size_t i = 0; i < groups_.size(); ++i) {
        if (!groups_[i].cut.group.resident) continue;
        reduce(i, slots_.front(), padded_buffer(groups_[i]));
        settle(slots_.front());
    }
    // Hybrid sharding: each block summed its own ranks' gradients; the sum over the blocks.
    if (!replicas_) return;
    const int64_t r = replicas_->size();
    bytes_sent_ += 2 * static_cast<int64_t>(shard_.view().bytes()) * (r - 1) / r;
    replicas_->all_reduce(shard_.view(), ReduceOp::sum);
}

}  // namespace llmtrain

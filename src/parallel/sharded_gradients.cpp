#include "parallel/sharded_gradients.h"

#include <algorithm>

namespace llmtrain {

namespace {

// Element counts: the shard, the pool buffers (group-sized) and receive pieces, the resident
// groups; under a narrower reduction dtype, each slot's copy (the largest group, resident ones
// included) and piece, and the shard's copy where replicas sum it.
struct Sizes {
    int64_t shard = 0, pool_buffer = 0, received = 0, resident = 0, largest = 1;
    int64_t total() const { return shard + ShardedGradients::kPoolBuffers * (pool_buffer + received) + resident; }
    int64_t staged(bool groups, bool replicas) const { return (groups ? ShardedGradients::kPoolBuffers * (largest + received) : 0) + (replicas ? shard : 0); }
};

Sizes sizes_of(const std::vector<FlatCut>& groups, int parts) {
    Sizes s;
    for (const FlatCut& g : groups) {
        s.shard += g.piece;
        s.received = std::max(s.received, g.piece);
        s.largest = std::max(s.largest, g.padded(parts));
        if (g.group.resident) s.resident += g.padded(parts);
        else s.pool_buffer = std::max(s.pool_buffer, g.padded(parts));
    }
    // The parameter store's all-gathers stage through a pool buffer: one exists even when every group is resident.
    s.pool_buffer = std::max<int64_t>(s.pool_buffer, 1);
    return s;
}

Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t numel) { return flat.slice_rows(begin, numel); }

}  // namespace

size_t sharded_gradient_bytes(const Placement& placement, DType master, DType reduce_dtype) {
    const Sizes sizes = sizes_of(placement.cuts(), placement.shard_size());
    const size_t bytes = static_cast<size_t>(sizes.total()) * dtype_size(master);
    if (reduce_dtype == master) return bytes;
    return bytes + static_cast<size_t>(sizes.staged(placement.shard_size() > 1, placement.replicas() > 1)) * dtype_size(reduce_dtype);
}

ShardedGradients::ShardedGradients(FlatParameters params, std::vector<FlatCut> groups, Comm& shard, Comm* replicas, FlatOps ops, DType reduce_dtype)
    : params_(std::move(params)), group_(shard), replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), ops_(std::move(ops)),
      reduce_dtype_(reduce_dtype), staged_groups_(reduce_dtype != params_.master && shard.size() > 1),
      staged_replicas_(reduce_dtype != params_.master && replicas_ != nullptr) {
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
    for (int s = 0; s < kPoolBuffers; ++s) {
        Slot slot{params_.allocate(master, {sizes.pool_buffer}), params_.allocate(master, {sizes.received}), {}, {}, -1, CommHandle()};
        if (staged_groups_) {
            slot.staged_buffer = params_.allocate(reduce_dtype_, {sizes.largest});
            slot.staged_received = params_.allocate(reduce_dtype_, {sizes.received});
        }
        slots_.push_back(std::move(slot));
    }
    if (staged_replicas_) staged_shard_ = params_.allocate(reduce_dtype_, {sizes.shard});
    bytes_ = static_cast<size_t>(sizes.total()) * dtype_size(master) + static_cast<size_t>(sizes.staged(staged_groups_, staged_replicas_)) * dtype_size(reduce_dtype_);
}

std::string ShardedGradients::describe() const {
    const std::string reduced = staged_groups_ || staged_replicas_ ? cat(", reduced in ", dtype_name(reduce_dtype_)) : "";
    if (!replicas_) return cat("ZeRO-2 (gradients sharded) | ", groups_.size(), " gradient groups", reduced);
    return cat("ZeRO-2 (gradients sharded over ", group_.size(), " dp ranks, replicated ", replicas_->size(), "x) | ", groups_.size(), " gradient groups", reduced);
}

std::vector<GradStorageBinding> ShardedGradients::run_storage() const {
    std::vector<GradStorageBinding> bindings;
    for (const Group& g : groups_)
        if (g.cut.group.resident) bindings.push_back({g.cut.group.first, g.cut.group.end, g.resident_buffer, g.cut.flat.begin});
    return bindings;
}

Tensor ShardedGradients::idle_buffer(size_t cut, int slot) const {
    const Group& g = groups_.at(cut);
    const Tensor buffer = g.cut.group.resident ? g.resident_buffer : slots_.at(static_cast<size_t>(slot)).buffer.view();
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
    if (!staged_groups_) {
        bytes_sent_ += static_cast<int64_t>(buffer.bytes()) * (p - 1) / p;
        slot.handle = group_.reduce_scatter_async(flat_slice(slot.received.view(), 0, g.cut.piece), buffer);
        return;
    }
    const Tensor copy = flat_slice(slot.staged_buffer.view(), 0, buffer.numel());
    ops_.copy(copy, buffer);  // rounds to nearest even
    bytes_sent_ += static_cast<int64_t>(copy.bytes()) * (p - 1) / p;
    slot.handle = group_.reduce_scatter_async(flat_slice(slot.staged_received.view(), 0, g.cut.piece), copy, ReduceOp::sum_in_dtype);
}

void ShardedGradients::settle(Slot& slot) {
    if (slot.group < 0) return;
    slot.handle.wait();
    const Group& g = groups_[static_cast<size_t>(slot.group)];
    const Tensor mine = flat_slice(shard_.view(), g.cut.shard_at, g.cut.piece), received = flat_slice(slot.received.view(), 0, g.cut.piece);
    if (staged_groups_) ops_.copy(received, flat_slice(slot.staged_received.view(), 0, g.cut.piece));
    ops_.add(mine, mine, received);
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
    if (replicas_) reduce_over_replicas();
}

// Hybrid sharding: each block summed its own ranks' gradients; the sum over the blocks.
void ShardedGradients::reduce_over_replicas() {
    const int64_t r = replicas_->size();
    if (!staged_replicas_) {
        bytes_sent_ += 2 * static_cast<int64_t>(shard_.view().bytes()) * (r - 1) / r;
        replicas_->all_reduce(shard_.view(), ReduceOp::sum);
        return;
    }
    const Tensor copy = staged_shard_.view();
    ops_.copy(copy, shard_.view());
    bytes_sent_ += 2 * static_cast<int64_t>(copy.bytes()) * (r - 1) / r;
    replicas_->all_reduce(copy, ReduceOp::sum_in_dtype);
    ops_.copy(shard_.view(), copy);
}

}  // namespace llmtrain

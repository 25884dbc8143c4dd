#include "parallel/fully_sharded.h"

#include <algorithm>

namespace llmtrain {

namespace {

// Element counts of the value side: shard (per dtype), one ring buffer, the resident groups.
struct ValueSizes {
    int64_t shard = 0, ring_buffer = 1, resident = 0;
};

ValueSizes value_sizes(const std::vector<ShardedGroupLayout>& layout, int parts) {
    ValueSizes s;
    for (const ShardedGroupLayout& g : layout) {
        s.shard += g.piece;
        if (g.resident) s.resident += g.piece * parts;
        else s.ring_buffer = std::max(s.ring_buffer, g.piece * parts);
    }
    return s;
}

size_t bytes_of(int64_t numel, DType dtype) { return static_cast<size_t>(numel) * dtype_size(dtype); }

size_t value_bytes_of(const ValueSizes& s, int prefetch, DType master, DType compute) {
    const size_t compute_shard = compute != master ? bytes_of(s.shard, compute) : 0;
    return bytes_of(s.shard, master) + compute_shard + static_cast<size_t>(prefetch + 1) * bytes_of(s.ring_buffer, compute) + bytes_of(s.resident, compute);
}

}  // namespace

size_t fully_sharded_value_bytes(const std::vector<FlatRange>& ranges, const std::vector<GradGroup>& groups, int shard_size, int prefetch,
                                 DType master, DType compute) {
    return value_bytes_of(value_sizes(sharded_group_layout(ranges, groups, shard_size, 0), shard_size), prefetch, master, compute);
}

FullyShardedGradients::FullyShardedGradients(FlatParameters params, std::vector<GradGroup> groups, Comm& shard, Comm* replicas, FlatOps ops,
                                             DType compute, int prefetch, ShardedValueHooks hooks)
    : ShardedGradients(params, groups, shard, replicas, ops), groups_(groups), compute_(compute), prefetch_(prefetch), hooks_(std::move(hooks)),
      value_ops_(std::move(ops)), allocate_(params.allocate), replicas_(replicas ? replicas->size() : 1) {
    if (prefetch_ < 0) fail(ErrorKind::config, "parallel.prefetch_layers = ", prefetch_, " (expected 0 or more)");
    const int parts = shard.size();
    layout_ = sharded_group_layout(params.ranges, groups_, parts, shard.rank());
    const ValueSizes sizes = value_sizes(layout_, parts);
    const DType master = params.values.dtype();
    master_shard_ = params.allocate(master, {sizes.shard});
    if (compute_ != master) compute_shard_ = params.allocate(compute_, {sizes.shard});
    ring_elements_ = sizes.ring_buffer;
    for (int i = 0; i <= prefetch_; ++i) ring_.push_back(Ring{params.allocate(compute_, {ring_elements_}), -1, CommHandle()});
    for (const ShardedGroupLayout& g : layout_) resident_.push_back(g.resident ? params.allocate(compute_, {g.piece * parts}) : OwnedTensor());
    value_bytes_ = value_bytes_of(sizes, prefetch_, master, compute_);
    // The optimizer updates this rank's pieces where they now live.
    for (OwnedPiece& piece : owned_)
        for (const ShardedGroupLayout& l : layout_) {
            if (l.mine.size() == 0 || piece.begin != l.flat.begin + l.mine.begin) continue;
            piece.values = master_shard_.view().slice_rows(l.shard_at, l.mine.size());
            if (!compute_shard_.view().empty()) piece.compute_values = compute_shard_.view().slice_rows(l.shard_at, l.mine.size());
        }
    take_shards(params.values);
    hooks_.release_master();
    gather_parameters();
}

size_t FullyShardedGradients::group_starting_at(size_t param) const {
    for (size_t g = 0; g < groups_.size(); ++g)
        if (groups_[g].first == param) return g;
    fail(ErrorKind::runtime, "ZeRO-3: no parameter group starts at parameter ", param);
}

std::string FullyShardedGradients::describe() const {
    const std::string hybrid = replicas_ > 1 ? cat(" over ", shard_group().size(), " dp ranks, replicated ", replicas_, "x") : "";
    return cat("ZeRO-3 (parameters and gradients sharded", hybrid, "; gathers started ", prefetch_, prefetch_ == 1 ? " group" : " groups", " ahead) | ", groups_.size(), " parameter groups");
}

// This rank's piece of every group, from the whole master weights into the shards.
void FullyShardedGradients::take_shards(const Tensor& whole) {
    for (const ShardedGroupLayout& g : layout_) {
        if (g.mine.size() == 0) continue;
        const Tensor master = master_shard_.view().slice_rows(g.shard_at, g.mine.size());
        value_ops_.copy(master, whole.slice_rows(g.flat.begin + g.mine.begin, g.mine.size()));
        if (!compute_shard_.view().empty()) value_ops_.copy(compute_shard_.view().slice_rows(g.shard_at, g.mine.size()), master);
    }
}

CommHandle FullyShardedGradients::start_gather(size_t group, const Tensor& buffer) {
    const ShardedGroupLayout& g = layout_[group];
    Comm& comm = shard_group();
    const Tensor padded = buffer.slice_rows(0, g.piece * comm.size());
    if (g.mine.size() > 0) value_ops_.copy(padded.slice_rows(g.mine.begin, g.mine.size()), gather_source().slice_rows(g.shard_at, g.mine.size()));
    return comm.all_gather_async(padded);
}

void FullyShardedGradients::bind(size_t group, const Tensor& buffer) const {
    hooks_.bind_values(groups_[group].first, groups_[group].end, buffer, layout_[group].flat.begin);
}

void FullyShardedGradients::begin_step(bool reduce) {
    ShardedGradients::begin_step(reduce);
    // A checkpoint read the whole master weights at the last step boundary: done with them.
    if (holds_whole_master_) hooks_.release_master();
    holds_whole_master_ = false;
}

// The updated (or loaded) values make every gathered group stale.
void FullyShardedGradients::empty_ring() {
    for (Ring& ring : ring_) {
        ring.handle.wait();  // a gather issued but never used (a pass cut short): done before reuse
        ring.group = -1;
    }
}

void FullyShardedGradients::gather_parameters() {
    empty_ring();
    for (size_t g = 0; g < groups_.size(); ++g) {
        if (!groups_[g].resident) continue;
        start_gather(g, resident_[g].view()).wait();
        bind(g, resident_[g].view());
    }
}

FullyShardedGradients::Ring* FullyShardedGradients::ring_holding(size_t group) {
    for (Ring& ring : ring_)
        if (ring.group == static_cast<int>(group)) return &ring;
    return nullptr;
}

FullyShardedGradients::Ring& FullyShardedGradients::free_ring(const std::vector<size_t>& window) {
    for (size_t k = 0; k < ring_.size(); ++k) {
        const size_t slot = (next_ring_ + k) % ring_.size();
        const int held = ring_[slot].group;
        if (held >= 0 && std::find(window.begin(), window.end(), static_cast<size_t>(held)) != window.end()) continue;
        next_ring_ = (slot + 1) % ring_.size();
        return ring_[slot];
    }
    fail(ErrorKind::runtime, "ZeRO-3: every gather buffer holds a group of the window (", window.size(), " groups, ", ring_.size(), " buffers)");
}

// Group `position` of the pass is about to compute: the gathers of it and of the next
// prefetch_ non-resident groups are started where the ring does not hold them yet, then its
// own is waited for.
void FullyShardedGradients::before_group(const std::vector<size_t>& pass, size_t position) {
    const size_t last = std::min(pass.size(), position + static_cast<size_t>(prefetch_) + 1);
    std::vector<size_t> window;
    for (size_t i = position; i < last; ++i) window.push_back(group_starting_at(pass[i]));
    for (size_t g : window) {
        if (groups_[g].resident || ring_holding(g)) continue;
        Ring& ring = free_ring(window);
        ring.handle.wait();  // a gather issued but never used (a pass cut short): done before reuse
        ring.group = static_cast<int>(g);
        ring.handle = start_gather(g, ring.buffer.view());
    }
    const size_t g = window.front();
    if (groups_[g].resident) return;
    Ring& ring = *ring_holding(g);
    ring.handle.wait();
    bind(g, ring.buffer.view());
}

// Group by group through a staging buffer in the master dtype: every rank's pieces of the
// master weights into the whole buffer.
void FullyShardedGradients::gather_master_values() {
    const Tensor whole = hooks_.acquire_master();
    holds_whole_master_ = true;
    Comm& comm = shard_group();
    int64_t largest = 1;
    for (const ShardedGroupLayout& g : layout_) largest = std::max(largest, g.piece * comm.size());
    const OwnedTensor staging = allocate_(whole.dtype(), Shape{largest});
    for (const ShardedGroupLayout& g : layout_) {
        const Tensor padded = staging.view().slice_rows(0, g.piece * comm.size());
        if (g.mine.size() > 0) value_ops_.copy(padded.slice_rows(g.mine.begin, g.mine.size()), master_shard_.view().slice_rows(g.shard_at, g.mine.size()));
        comm.all_gather(padded);
        value_ops_.copy(whole.slice_rows(g.flat.begin, g.flat.size()), padded.slice_rows(0, g.flat.size()));
    }
}

void FullyShardedGradients::scatter_master_values() {
    take_shards(hooks_.acquire_master());
    hooks_.release_master();
    holds_whole_master_ = false;
    gather_parameters();
}

}  // namespace llmtrain

#include "parallel/fully_sharded.h"

#include <algorithm>

namespace llmtrain {

namespace {

// Element counts of the value side: shard (per dtype), one ring buffer, the resident groups.
struct ValueSizes {
    int64_t shard = 0, ring_buffer = 1, resident = 0;
};

ValueSizes value_sizes(const std::vector<FlatCut>& cuts, int parts) {
    ValueSizes s;
    for (const FlatCut& c : cuts) {
        s.shard += c.piece;
        if (c.group.resident) s.resident += c.padded(parts);
        else s.ring_buffer = std::max(s.ring_buffer, c.padded(parts));
    }
    return s;
}

size_t bytes_of(int64_t numel, DType dtype) { return static_cast<size_t>(numel) * dtype_size(dtype); }

size_t value_bytes_of(const ValueSizes& s, int prefetch, DType master, DType compute) {
    const size_t compute_shard = compute != master ? bytes_of(s.shard, compute) : 0;
    return bytes_of(s.shard, master) + compute_shard + static_cast<size_t>(prefetch + 1) * bytes_of(s.ring_buffer, compute) + bytes_of(s.resident, compute);
}

}  // namespace

size_t fully_sharded_value_bytes(const Placement& placement, int prefetch, DType master, DType compute) {
    return value_bytes_of(value_sizes(placement.cuts(), placement.shard_size()), prefetch, master, compute);
}

FullyShardedParameters::FullyShardedParameters(FlatParameters params, const Placement& placement, Comm& shard, FlatOps ops, DType compute,
                                               int prefetch, BindValues bind)
    : cuts_(placement.cuts()), shard_(shard), replicas_(placement.replicas()), compute_(compute), prefetch_(prefetch), bind_(std::move(bind)),
      ops_(std::move(ops)) {
    if (prefetch_ < 0) fail(ErrorKind::config, "parallel.prefetch_layers = ", prefetch_, " (expected 0 or more)");
    const int parts = shard.size();
    const ValueSizes sizes = value_sizes(cuts_, parts);
    master_shard_ = params.allocate(params.master, {sizes.shard});
    if (compute_ != params.master) compute_shard_ = params.allocate(compute_, {sizes.shard});
    for (int i = 0; i <= prefetch_; ++i) ring_.push_back(Ring{params.allocate(compute_, {sizes.ring_buffer}), -1, 0, CommHandle()});
    for (const FlatCut& c : cuts_) resident_.push_back(c.group.resident ? params.allocate(compute_, {c.padded(parts)}) : OwnedTensor());
    value_bytes_ = value_bytes_of(sizes, prefetch_, params.master, compute_);
}

std::string FullyShardedParameters::describe() const {
    const std::string hybrid = replicas_ > 1 ? cat(" over ", shard_.size(), " dp ranks, replicated ", replicas_, "x") : "";
    return cat("ZeRO-3 (parameters and gradients sharded", hybrid, "; gathers started ", prefetch_, prefetch_ == 1 ? " group" : " groups", " ahead) | ", cuts_.size(),
               " parameter groups");
}

size_t FullyShardedParameters::group_starting_at(size_t param) const {
    for (size_t g = 0; g < cuts_.size(); ++g)
        if (cuts_[g].group.first == param) return g;
    fail(ErrorKind::runtime, "ZeRO-3: no parameter group starts at parameter ", param);
}

int64_t FullyShardedParameters::shard_offset(FlatRange range) const {
    for (const FlatCut& c : cuts_) {
        const FlatRange mine = c.piece_of(shard_.rank());
        if (range.begin >= mine.begin && range.end <= mine.end) return c.shard_at + range.begin - mine.begin;
    }
    fail(ErrorKind::runtime, "ZeRO-3: flat elements [", range.begin, ", ", range.end, ") are not inside one of this rank's pieces");
}

Tensor FullyShardedParameters::master(FlatRange range) const { return master_shard_.view().slice_rows(shard_offset(range), range.size()); }

void FullyShardedParameters::place(std::vector<OwnedPiece>& pieces) const {
    for (OwnedPiece& piece : pieces) {
        const FlatRange range{piece.begin, piece.end};
        piece.values = master(range);
        if (!compute_shard_.view().empty()) piece.compute_values = compute_shard_.view().slice_rows(shard_offset(range), range.size());
    }
}

// Each piece of this rank's straight from the initialization: no whole weights on the way.
void FullyShardedParameters::initialize(const ValueInit& init) {
    for (const FlatCut& c : cuts_)
        if (const FlatRange mine = c.piece_of(shard_.rank()); mine.size() > 0) init(mine, master(mine));
    after_load();
}

void FullyShardedParameters::refresh_compute_shard() {
    if (!compute_shard_.view().empty()) ops_.copy(compute_shard_.view(), master_shard_.view());
}

CommHandle FullyShardedParameters::start_gather(size_t group, const Tensor& buffer) {
    const FlatCut& c = cuts_[group];
    const Tensor padded = buffer.slice_rows(0, c.padded(shard_.size()));
    const FlatRange mine = c.piece_of(shard_.rank());
    if (mine.size() > 0) ops_.copy(padded.slice_rows(mine.begin - c.flat.begin, mine.size()), gather_source().slice_rows(c.shard_at, mine.size()));
    return shard_.all_gather_async(padded);
}

void FullyShardedParameters::bind(size_t group, const Tensor& buffer) const {
    bind_(cuts_[group].group.first, cuts_[group].group.end, buffer, cuts_[group].flat.begin);
}

// The updated (or loaded) values make every gathered group stale.
void FullyShardedParameters::empty_ring() {
    for (Ring& ring : ring_) {
        if (ring.holders > 0) fail(ErrorKind::runtime, "ZeRO-3: the weights of a group are still held while the parameters change");
        ring.handle.wait();  // a gather issued but never used (a pass cut short): done before reuse
        ring.group = -1;
    }
}

void FullyShardedParameters::after_update() {
    empty_ring();
    for (size_t g = 0; g < cuts_.size(); ++g) {
        if (!cuts_[g].group.resident) continue;
        start_gather(g, resident_[g].view()).wait();
        bind(g, resident_[g].view());
    }
}

void FullyShardedParameters::after_load() {
    refresh_compute_shard();
    after_update();
}

FullyShardedParameters::Ring* FullyShardedParameters::ring_holding(size_t group) {
    for (Ring& ring : ring_)
        if (ring.group == static_cast<int>(group)) return &ring;
    return nullptr;
}

FullyShardedParameters::Ring& FullyShardedParameters::free_ring(const std::vector<size_t>& window) {
    for (size_t k = 0; k < ring_.size(); ++k) {
        const size_t slot = (next_ring_ + k) % ring_.size();
        const int held = ring_[slot].group;
        if (ring_[slot].holders > 0) continue;
        if (held >= 0 && std::find(window.begin(), window.end(), static_cast<size_t>(held)) != window.end()) continue;
        next_ring_ = (slot + 1) % ring_.size();
        return ring_[slot];
    }
    fail(ErrorKind::runtime, "ZeRO-3: every gather buffer holds a group of the window or one still in use (", window.size(), " groups, ", ring_.size(),
         " buffers)");
}

// Group `position` of the pass is about to compute: the gathers of it and of the next
// prefetch_ non-resident groups are started where the ring does not hold them yet, then its
// own is waited for and bound; the handle keeps its buffer from reuse until released.
GroupWeights FullyShardedParameters::weights(const std::vector<size_t>& pass, size_t position) {
    const size_t last = std::min(pass.size(), position + static_cast<size_t>(prefetch_) + 1);
    std::vector<size_t> window;
    for (size_t i = position; i < last; ++i) window.push_back(group_starting_at(pass[i]));
    for (size_t g : window) {
        if (cuts_[g].group.resident || ring_holding(g)) continue;
        Ring& ring = free_ring(window);
        ring.handle.wait();  // a gather issued but never used (a pass cut short): done before reuse
        ring.group = static_cast<int>(g);
        ring.handle = start_gather(g, ring.buffer.view());
    }
    const size_t g = window.front();
    if (cuts_[g].group.resident) return GroupWeights();
    Ring& ring = *ring_holding(g);
    ring.handle.wait();
    bind(g, ring.buffer.view());
    ++ring.holders;
    return GroupWeights([&ring] { --ring.holders; });
}

}  // namespace llmtrain

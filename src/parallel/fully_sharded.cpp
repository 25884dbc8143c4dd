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

using PackedGroup = FullyShardedParameters::PackedGroup;

// Every group packed, its FP8 slot placed in the FP8 shard after the previous group's; none
// without FP8 weights.
std::vector<PackedGroup> packed_groups(const std::vector<FlatCut>& cuts, int parts, const std::vector<FlatRange>& fp8_weights) {
    std::vector<PackedGroup> out;
    if (fp8_weights.empty()) return out;
    int64_t shard_at = 0;
    for (const FlatCut& c : cuts) {
        PackedGroup g = FullyShardedParameters::packed_group(c, parts, fp8_weights);
        if (g.fp8_slot > 0 && c.group.resident)
            fail(ErrorKind::runtime, "ZeRO-3: the resident group of parameters [", c.group.first, ", ", c.group.end, ") holds an FP8 weight (only the blocks' linears are FP8)");
        g.fp8_shard_at = shard_at;
        shard_at += g.fp8_slot;
        out.push_back(std::move(g));
    }
    return out;
}

// Element counts of the FP8 gather: this rank's FP8 shard (bytes) and one ring buffer's
// staging (bytes and compute elements), over the groups that hold FP8 weights.
struct Fp8Sizes {
    int64_t shard = 0, fp8_staging = 0, compute_staging = 0;
};

Fp8Sizes fp8_sizes(const std::vector<PackedGroup>& packed, int parts) {
    Fp8Sizes s;
    for (const PackedGroup& g : packed) {
        if (g.fp8_slot == 0) continue;
        s.shard += g.fp8_slot;
        s.fp8_staging = std::max(s.fp8_staging, parts * g.fp8_slot);
        s.compute_staging = std::max(s.compute_staging, parts * g.compute_slot);
    }
    return s;
}

size_t fp8_bytes_of(const Fp8Sizes& s, int prefetch, DType compute) {
    return bytes_of(s.shard, DType::e4m3) + static_cast<size_t>(prefetch + 1) * (bytes_of(s.fp8_staging, DType::e4m3) + bytes_of(s.compute_staging, compute));
}

// A ring-all-gather of `buffer` sends (parts - 1) / parts of it from each rank.
int64_t gather_bytes_sent(const Tensor& buffer, int parts) { return static_cast<int64_t>(buffer.bytes()) * (parts - 1) / parts; }

}  // namespace

size_t fully_sharded_value_bytes(const Placement& placement, int prefetch, DType master, DType compute, const std::vector<FlatRange>& fp8_weights) {
    const int parts = placement.shard_size();
    return value_bytes_of(value_sizes(placement.cuts(), parts), prefetch, master, compute) +
           fp8_bytes_of(fp8_sizes(packed_groups(placement.cuts(), parts, fp8_weights), parts), prefetch, compute);
}

// Rank r's piece of the group, walked in flat order: the parts inside FP8 weights are FP8
// runs, the parts between them compute runs, each placed after the previous run of its kind.
PackedGroup FullyShardedParameters::packed_group(const FlatCut& cut, int parts, const std::vector<FlatRange>& fp8_weights) {
    PackedGroup g;
    g.fp8.resize(static_cast<size_t>(parts));
    g.compute.resize(static_cast<size_t>(parts));
    for (int r = 0; r < parts; ++r) {
        const FlatRange piece = cut.piece_of(r);
        std::vector<Run>&fp8 = g.fp8[static_cast<size_t>(r)], &compute = g.compute[static_cast<size_t>(r)];
        int64_t fp8_at = 0, compute_at = 0, from = piece.begin;
        const auto compute_run = [&](int64_t end) {
            if (end <= from) return;
            compute.push_back({{from, end}, compute_at, 0});
            compute_at += end - from;
        };
        for (size_t w = 0; w < fp8_weights.size(); ++w) {
            const FlatRange run = fp8_weights[w].intersect(piece);
            if (run.size() == 0) continue;
            compute_run(run.begin);
            fp8.push_back({run, fp8_at, w});
            fp8_at += run.size();
            from = run.end;
        }
        compute_run(piece.end);
        g.fp8_slot = std::max(g.fp8_slot, fp8_at);
        g.compute_slot = std::max(g.compute_slot, compute_at);
    }
    return g;
}

FullyShardedParameters::FullyShardedParameters(FlatParameters params, const Placement& placement, Comm& shard, FlatOps ops, DType compute,
                                               int prefetch, BindValues bind, Fp8ParamGather fp8)
    : cuts_(placement.cuts()), shard_(shard), replicas_(placement.replicas()), compute_(compute), prefetch_(prefetch), bind_(std::move(bind)),
      ops_(std::move(ops)), fp8_(std::move(fp8)) {
    if (prefetch_ < 0) fail(ErrorKind::config, "parallel.prefetch_layers = ", prefetch_, " (expected 0 or more)");
    if (fp8_.bytes.size() != fp8_.weights.size())
        fail(ErrorKind::runtime, "ZeRO-3's FP8 gather: ", fp8_.weights.size(), " FP8 weights with ", fp8_.bytes.size(), " destinations");
    for (size_t w = 1; w < fp8_.weights.size(); ++w)
        if (fp8_.weights[w].begin < fp8_.weights[w - 1].end) fail(ErrorKind::runtime, "ZeRO-3's FP8 gather: FP8 weight ", w, " is not after weight ", w - 1, " in the flat buffer");
    const int parts = shard.size();
    const ValueSizes sizes = value_sizes(cuts_, parts);
    packed_ = packed_groups(cuts_, parts, fp8_.weights);
    const Fp8Sizes fp8_sizing = fp8_sizes(packed_, parts);
    master_shard_ = params.allocate(params.master, {sizes.shard});
    if (compute_ != params.master) compute_shard_ = params.allocate(compute_, {sizes.shard});
    for (int i = 0; i <= prefetch_; ++i) {
        Ring ring;
        ring.buffer = params.allocate(compute_, {sizes.ring_buffer});
        if (fp8_sizing.fp8_staging > 0) ring.fp8_staging = params.allocate(DType::e4m3, {fp8_sizing.fp8_staging});
        if (fp8_sizing.compute_staging > 0) ring.compute_staging = params.allocate(compute_, {fp8_sizing.compute_staging});
        ring_.push_back(std::move(ring));
    }
    if (fp8_sizing.shard > 0) fp8_shard_ = params.allocate(DType::e4m3, {fp8_sizing.shard});
    fp8_gathered_.assign(cuts_.size(), false);
    for (const FlatCut& c : cuts_) resident_.push_back(c.group.resident ? params.allocate(compute_, {c.padded(parts)}) : OwnedTensor());
    value_bytes_ = value_bytes_of(sizes, prefetch_, params.master, compute_) + fp8_bytes_of(fp8_sizing, prefetch_, compute_);
}

std::string FullyShardedParameters::describe() const {
    const std::string hybrid = replicas_ > 1 ? cat(" over ", shard_.size(), " dp ranks, replicated ", replicas_, "x") : "";
    const std::string fp8 = packed_.empty() ? "" : cat("; ", fp8_.weights.size(), " FP8 weights gathered in FP8");
    return cat("ZeRO-3 (parameters and gradients sharded", hybrid, "; gathers started ", prefetch_, prefetch_ == 1 ? " group" : " groups", " ahead", fp8, ") | ",
               cuts_.size(), " parameter groups");
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
    bytes_sent_ += gather_bytes_sent(padded, shard_.size());
    return shard_.all_gather_async(padded);
}

// The compute runs of this rank's piece into its slot of the compute staging and, unless
// the group's FP8 weights are in place since the update, its FP8 runs (one stretch of the
// FP8 shard) into its slot of the FP8 staging; both all-gathers started.
void FullyShardedParameters::start_ring_gather(size_t group, Ring& ring) {
    ring.group = static_cast<int>(group);
    if (packed_.empty() || packed_[group].fp8_slot == 0) {
        ring.handle = start_gather(group, ring.buffer.view());
        return;
    }
    if (!fp8_shard_current_) cast_fp8_shard();
    const PackedGroup& g = packed_[group];
    const FlatCut& c = cuts_[group];
    const int parts = shard_.size(), me = shard_.rank();
    const int64_t mine_begin = c.piece_of(me).begin;
    ring.unpack = true;
    if (g.compute_slot > 0) {
        const Tensor staging = ring.compute_staging.view().slice_rows(0, parts * g.compute_slot);
        for (const Run& run : g.compute[static_cast<size_t>(me)])
            ops_.copy(staging.slice_rows(me * g.compute_slot + run.at, run.flat.size()), gather_source().slice_rows(c.shard_at + run.flat.begin - mine_begin, run.flat.size()));
        bytes_sent_ += gather_bytes_sent(staging, parts);
        ring.handle = shard_.all_gather_async(staging);
    }
    ring.with_fp8 = !fp8_gathered_[group];
    if (!ring.with_fp8) return;
    const Tensor staging = ring.fp8_staging.view().slice_rows(0, parts * g.fp8_slot);
    const std::vector<Run>& fp8 = g.fp8[static_cast<size_t>(me)];
    const int64_t used = fp8.empty() ? 0 : fp8.back().at + fp8.back().flat.size();
    if (used > 0) ops_.copy(staging.slice_rows(me * g.fp8_slot, used), fp8_shard_.view().slice_rows(g.fp8_shard_at, used));
    bytes_sent_ += gather_bytes_sent(staging, parts);
    ring.fp8_handle = shard_.all_gather_async(staging);
}

// Every rank's runs from the staging into place: compute runs into the ring buffer (at their
// flat position in the group), FP8 runs into their weights' FP8 copies.
void FullyShardedParameters::finish_ring_gather(Ring& ring) {
    ring.handle.wait();
    ring.fp8_handle.wait();
    if (!ring.unpack) return;
    ring.unpack = false;
    const auto group = static_cast<size_t>(ring.group);
    const PackedGroup& g = packed_[group];
    const FlatCut& c = cuts_[group];
    const Tensor buffer = ring.buffer.view();
    for (size_t r = 0; r < g.compute.size(); ++r)
        for (const Run& run : g.compute[r])
            ops_.copy(buffer.slice_rows(run.flat.begin - c.flat.begin, run.flat.size()),
                      ring.compute_staging.view().slice_rows(static_cast<int64_t>(r) * g.compute_slot + run.at, run.flat.size()));
    if (!ring.with_fp8) return;
    for (size_t r = 0; r < g.fp8.size(); ++r)
        for (const Run& run : g.fp8[r]) {
            const FlatRange weight = fp8_.weights[run.weight];
            ops_.copy(fp8_.bytes[run.weight].slice_rows(run.flat.begin - weight.begin, run.flat.size()),
                      ring.fp8_staging.view().slice_rows(static_cast<int64_t>(r) * g.fp8_slot + run.at, run.flat.size()));
        }
    fp8_gathered_[group] = true;
}

// Each FP8 run of this rank's pieces: its values in the shard, its bytes' place in the FP8 shard.
void FullyShardedParameters::cast_fp8_shard() {
    std::vector<Fp8ShardPiece> pieces;
    const int me = shard_.rank();
    for (size_t group = 0; group < packed_.size(); ++group) {
        const PackedGroup& g = packed_[group];
        const FlatCut& c = cuts_[group];
        const int64_t mine_begin = c.piece_of(me).begin;
        for (const Run& run : g.fp8[static_cast<size_t>(me)])
            pieces.push_back({run.weight, gather_source().slice_rows(c.shard_at + run.flat.begin - mine_begin, run.flat.size()),
                              fp8_shard_.view().slice_rows(g.fp8_shard_at + run.at, run.flat.size())});
    }
    fp8_.cast(pieces);
    fp8_shard_current_ = true;
}

void FullyShardedParameters::bind(size_t group, const Tensor& buffer) const {
    bind_(cuts_[group].group.first, cuts_[group].group.end, buffer, cuts_[group].flat.begin);
}

// The updated (or loaded) values make every gathered group stale.
void FullyShardedParameters::empty_ring() {
    for (Ring& ring : ring_) {
        if (ring.holders > 0) fail(ErrorKind::runtime, "ZeRO-3: the weights of a group are still held while the parameters change");
        finish_ring_gather(ring);  // a gather issued but never used (a pass cut short): done before reuse
        ring.group = -1;
    }
    // The values change: the FP8 shard is cast again, and each group's FP8 weights gathered again.
    fp8_shard_current_ = false;
    fp8_gathered_.assign(cuts_.size(), false);
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
        finish_ring_gather(ring);  // a gather issued but never used (a pass cut short): done before reuse
        start_ring_gather(g, ring);
    }
    const size_t g = window.front();
    if (cuts_[g].group.resident) return GroupWeights();
    Ring& ring = *ring_holding(g);
    finish_ring_gather(ring);
    bind(g, ring.buffer.view());
    ++ring.holders;
    return GroupWeights([&ring] { --ring.holders; });
}

}  // namespace llmtrain

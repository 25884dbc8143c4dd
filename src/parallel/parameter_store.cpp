#include "parallel/parameter_store.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace llmtrain {

GroupWeights& GroupWeights::operator=(GroupWeights&& other) noexcept {
    if (this != &other) {
        if (release_) release_();
        release_ = std::exchange(other.release_, nullptr);
    }
    return *this;
}

GroupWeights::~GroupWeights() {
    if (release_) release_();
}

namespace {
Tensor flat_slice(const Tensor& flat, FlatRange range) { return flat.slice_rows(range.begin, range.size()); }

// The first `numel` elements of `memory` seen as `dtype` (a staging buffer of another dtype).
Tensor as_staging(const Tensor& memory, DType dtype, int64_t numel) {
    if (memory.bytes() < static_cast<size_t>(numel) * dtype_size(dtype))
        fail(ErrorKind::runtime, "staging buffer of ", memory.bytes(), " bytes for ", numel, " ", dtype_name(dtype), " elements");
    return Tensor(memory.raw(), dtype, Shape{numel}, memory.device());
}
}  // namespace

void gather_over_cuts(Comm& group, const Tensor& flat, const std::vector<FlatCut>& cuts, const std::function<Tensor(size_t cut)>& staging,
                      const FlatOps& ops) {
    if (group.size() == 1) return;
    const int parts = group.size();
    std::vector<CommHandle> aligned;
    // Cuts that lie in the buffer as they are gathered (buckets): every gather in flight at once.
    for (const FlatCut& cut : cuts)
        if (cut.flat.size() == cut.padded(parts)) aligned.push_back(group.all_gather_async(flat_slice(flat, cut.flat)));
    // The others (layer groups, padded) one at a time through their staging memory: this
    // rank's piece into its place there, the all-gather, the group's real elements back.
    for (size_t c = 0; c < cuts.size(); ++c) {
        const FlatCut& cut = cuts[c];
        if (cut.flat.size() == cut.padded(parts)) continue;
        const Tensor padded = as_staging(staging(c), flat.dtype(), cut.padded(parts));
        const FlatRange mine = cut.piece_of(group.rank());
        if (mine.size() > 0) ops.copy(padded.slice_rows(mine.begin - cut.flat.begin, mine.size()), flat_slice(flat, mine));
        group.all_gather(padded);
        ops.copy(flat_slice(flat, cut.flat), padded.slice_rows(0, cut.flat.size()));
    }
    for (CommHandle& h : aligned) h.wait();
}

ReplicatedParameters::ReplicatedParameters(FlatParameters params, const Placement& placement, Comm& shard, GatherStaging staging, FlatOps ops, bool overlap)
    : params_(std::move(params)), cuts_(placement.cuts()), sharded_(placement.shards_optimizer() && shard.size() > 1), overlap_(overlap && sharded_),
      shard_(shard), staging_(std::move(staging)), ops_(std::move(ops)) {}

// Gathers still in flight complete (their handles would wait anyway, into buffers about to
// be freed): the peers started them too.
ReplicatedParameters::~ReplicatedParameters() {
    try {
        settle();
    } catch (...) {
    }
}

void ReplicatedParameters::initialize(const ValueInit& init) {
    init({0, params_.values.numel()}, params_.values);
    if (!params_.compute_values.empty()) ops_.copy(params_.compute_values, params_.values);
}

void ReplicatedParameters::gather(const Tensor& flat) {
    settle();
    gather_over_cuts(shard_, flat, cuts_, [this](size_t cut) { return staging_(cut, 0); }, ops_);
}

// The compute copy of what this rank updated is written with the update; the other ranks'
// pieces arrive by its all-gather (half the bytes of the f32 master weights).
void ReplicatedParameters::after_update() {
    if (!sharded_) return;
    if (!overlap_) {
        gather(gathered());
        return;
    }
    settle();
    // A resident group's cut (a tied embedding's) is staged in the group's own gradient
    // buffer, which the next step zeroes before its forward: it is gathered now.
    for (size_t c = 0; c < cuts_.size(); ++c) {
        if (aligned(cuts_[c]) || !cuts_[c].group.resident) continue;
        InFlight f{c, false, -1, false, CommHandle()};
        start(f);
        finish(f);
    }
    // Forward reads the flat buffer from its start; the cuts are listed from its end.
    std::vector<size_t> order;
    for (size_t c = 0; c < cuts_.size(); ++c)
        if (aligned(cuts_[c]) || !cuts_[c].group.resident) order.push_back(c);
    std::sort(order.begin(), order.end(), [this](size_t a, size_t b) { return cuts_[a].flat.begin < cuts_[b].flat.begin; });
    for (size_t c : order) in_flight_.push_back({c, !aligned(cuts_[c]), -1, false, CommHandle()});
    free_slots_ = {1, 0};
    start_waiting();
}

// Starts, in order, every gather not yet started that has its memory: the aligned ones at
// once, the others as staging slots come free.
void ReplicatedParameters::start_waiting() {
    for (InFlight& f : in_flight_) {
        if (f.started) continue;
        if (f.pooled) {
            if (free_slots_.empty()) return;  // later ones wait their turn: the order is every rank's
            f.slot = free_slots_.back();
            free_slots_.pop_back();
        }
        start(f);
    }
}

Tensor ReplicatedParameters::staging_of(const InFlight& f) const {
    const FlatCut& cut = cuts_[f.cut];
    const Tensor memory = staging_(f.cut, std::max(f.slot, 0));
    return as_staging(memory, gathered().dtype(), cut.padded(shard_.size()));
}

// This rank's piece into its place (the staging buffer for a cut that is not aligned), then
// the all-gather, in flight.
void ReplicatedParameters::start(InFlight& f) {
    const FlatCut& cut = cuts_[f.cut];
    const Tensor& flat = gathered();
    f.started = true;
    if (aligned(cut)) {
        f.handle = shard_.all_gather_async(flat_slice(flat, cut.flat));
        return;
    }
    const Tensor padded = staging_of(f);
    const FlatRange mine = cut.piece_of(shard_.rank());
    if (mine.size() > 0) ops_.copy(padded.slice_rows(mine.begin - cut.flat.begin, mine.size()), flat_slice(flat, mine));
    f.handle = shard_.all_gather_async(padded);
}

// A started gather: waited for, and its values into the flat buffer.
void ReplicatedParameters::finish(InFlight& f) {
    f.handle.wait();
    const FlatCut& cut = cuts_[f.cut];
    if (!aligned(cut)) ops_.copy(flat_slice(gathered(), cut.flat), staging_of(f).slice_rows(0, cut.flat.size()));
}

// The first gather in flight finished, its slot free for the next.
void ReplicatedParameters::complete_front() {
    InFlight f = std::move(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
    if (!f.started) fail(ErrorKind::runtime, "parameter all-gather of cut ", f.cut, " was never started (no staging slot came free)");
    finish(f);
    if (f.pooled) free_slots_.push_back(f.slot);
    start_waiting();
}

// Where group `position` of the pass ends in the flat buffer: at the start of the pass's
// next group in flat order, or the buffer's end when none follows it.
int64_t ReplicatedParameters::end_of_group(const std::vector<size_t>& pass, size_t position) const {
    const size_t first = pass[position];
    size_t next = params_.ranges.size();
    for (size_t p : pass)
        if (p > first && p < next) next = p;
    return next < params_.ranges.size() ? params_.ranges[next].begin : std::numeric_limits<int64_t>::max();
}

GroupWeights ReplicatedParameters::weights(const std::vector<size_t>& pass, size_t position) {
    if (in_flight_.empty()) return GroupWeights();
    const int64_t end = end_of_group(pass, position);
    while (!in_flight_.empty() && cuts_[in_flight_.front().cut].flat.begin < end) complete_front();
    for (InFlight& f : in_flight_)
        if (f.started) f.handle.progress();
    return GroupWeights();
}

void ReplicatedParameters::settle() {
    while (!in_flight_.empty()) complete_front();
}

void ReplicatedParameters::gather_master() { gather(params_.values); }

void ReplicatedParameters::after_load() {
    gather_master();
    if (!params_.compute_values.empty()) ops_.copy(params_.compute_values, params_.values);
}

std::string ReplicatedParameters::describe() const { return overlap_ ? "parameter all-gathers behind the next forward" : ""; }

size_t ReplicatedParameters::value_bytes() const { return params_.values.bytes() + (params_.compute_values.empty() ? 0 : params_.compute_values.bytes()); }

}  // namespace llmtrain

#include "parallel/parameter_store.h"

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

ReplicatedParameters::ReplicatedParameters(FlatParameters params, const Placement& placement, Comm& shard, std::function<Tensor(size_t)> staging,
                                           FlatOps ops)
    : params_(std::move(params)), cuts_(placement.cuts()), sharded_(placement.shards_optimizer() && shard.size() > 1), shard_(shard),
      staging_(std::move(staging)), ops_(std::move(ops)) {}

void ReplicatedParameters::initialize(const ValueInit& init) {
    init({0, params_.values.numel()}, params_.values);
    if (!params_.compute_values.empty()) ops_.copy(params_.compute_values, params_.values);
}

void ReplicatedParameters::gather(const Tensor& flat) { gather_over_cuts(shard_, flat, cuts_, staging_, ops_); }

// The compute copy of what this rank updated is written with the update; the other ranks'
// pieces arrive by its all-gather (half the bytes of the f32 master weights).
void ReplicatedParameters::after_update() {
    if (sharded_) gather(params_.compute_values.empty() ? params_.values : params_.compute_values);
}

void ReplicatedParameters::gather_master() { gather(params_.values); }

void ReplicatedParameters::after_load() {
    gather_master();
    if (!params_.compute_values.empty()) ops_.copy(params_.compute_values, params_.values);
}

size_t ReplicatedParameters::value_bytes() const { return params_.values.bytes() + (params_.compute_values.empty() ? 0 : params_.compute_values.bytes()); }

}  // namespace llmtrain

#include "parallel/grad_buckets.h"

#include <algorithm>

namespace llmtrain {

namespace {
Tensor flat_slice(const Tensor& flat, FlatRange range) { return flat.slice_rows(range.begin, range.size()); }
}  // namespace

GradBuckets::GradBuckets(FlatParameters params, std::vector<FlatCut> buckets, bool shards, Comm& dp)
    : params_(std::move(params)), dp_(dp), zero1_(shards && dp.size() > 1) {
    const Tensor grads = params_.grads;
    int64_t shard_numel = 0;
    for (const FlatCut& cut : buckets) {
        if (cut.flat.size() != cut.padded(dp.size()))
            fail(ErrorKind::runtime, "gradient bucket [", cut.flat.begin, ", ", cut.flat.end, ") is not a multiple of dp = ", dp.size(), " long");
        buckets_.push_back(Bucket{cut, 0, 0, false, CommHandle()});
        shard_numel += cut.piece;
    }
    buckets_of_param_.resize(params_.ranges.size());
    for (size_t b = 0; b < buckets_.size(); ++b)
        for (size_t i = 0; i < params_.ranges.size(); ++i) {
            if (params_.ranges[i].overlaps(buckets_[b].cut.flat)) {
                buckets_of_param_[i].push_back(b);
                ++buckets_[b].params;
            }
        }
    if (zero1_) {
        shard_grads_ = params_.allocate(grads.dtype(), {shard_numel});
        for (const Bucket& b : buckets_) {
            const FlatRange piece = b.cut.piece_of(dp.rank());
            owned_.push_back({piece.begin, piece.end, shard_grads_.view().slice_rows(b.cut.shard_at, piece.size()), {}, {}});
        }
    } else {
        owned_.push_back({0, grads.numel(), grads, {}, {}});
    }
    begin_step(true);
}

std::string GradBuckets::describe() const { return cat(zero1_ ? "ZeRO-1" : "ZeRO off", " | ", buckets_.size(), " gradient buckets"); }

void GradBuckets::begin_step(bool reduce) {
    reduce_ = reduce;
    param_ready_.assign(params_.ranges.size(), false);
    for (Bucket& b : buckets_) {
        b.handle.wait();
        b.waiting = b.params;
        b.started = false;
    }
}

void GradBuckets::start(size_t index) {
    Bucket& bucket = buckets_[index];
    bucket.started = true;
    if (dp_.size() == 1 || !reduce_) return;
    const Tensor grads = flat_slice(params_.grads, bucket.cut.flat);
    const int64_t p = dp_.size(), share = static_cast<int64_t>(grads.bytes()) * (p - 1) / p;
    bytes_sent_ += zero1_ ? share : 2 * share;
    if (!zero1_) {
        bucket.handle = dp_.all_reduce_async(grads, ReduceOp::sum);
        return;
    }
    bucket.handle = dp_.reduce_scatter_async(owned_[index].grads, grads);
}

void GradBuckets::mark_ready(size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
        if (param_ready_[i]) continue;
        param_ready_[i] = true;
        for (size_t b : buckets_of_param_[i]) --buckets_[b].waiting;
    }
    // Buckets start in buffer order from the end, the same on every rank.
    for (size_t b = 0; b < buckets_.size(); ++b) {
        if (buckets_[b].started) continue;
        if (buckets_[b].waiting > 0) break;
        start(b);
    }
}

void GradBuckets::finish() {
    for (size_t b = 0; b < buckets_.size(); ++b)
        if (!buckets_[b].started) start(b);
    for (Bucket& b : buckets_) b.handle.wait();
}

}  // namespace llmtrain

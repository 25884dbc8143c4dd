#include "parallel/grad_buckets.h"

#include <algorithm>

namespace llmtrain {

namespace {
Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t end) { return flat.slice_rows(begin, end - begin); }
}  // namespace

std::vector<BucketRange> bucket_ranges(int64_t total_numel, size_t elem_bytes, int dp, int64_t bucket_bytes) {
    if (total_numel % dp != 0) fail(ErrorKind::runtime, "gradient buffer of ", total_numel, " elements is not padded to a multiple of dp = ", dp);
    const int64_t step = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(elem_bytes) / dp) * dp;
    std::vector<BucketRange> ranges;
    for (int64_t end = total_numel; end > 0; end -= step) ranges.push_back({std::max<int64_t>(0, end - step), end});
    return ranges;
}

int64_t owned_numel(int64_t total_numel, size_t elem_bytes, int dp, bool zero1, int64_t bucket_bytes) {
    if (!zero1_shards(zero1, dp)) return total_numel;
    int64_t owned = 0;
    for (const BucketRange& b : bucket_ranges(total_numel, elem_bytes, dp, bucket_bytes)) owned += (b.end - b.begin) / dp;
    return owned;
}

GradBuckets::GradBuckets(FlatParameters params, Comm& dp, bool zero1, int64_t bucket_bytes)
    : params_(std::move(params)), dp_(dp), zero1_(zero1_shards(zero1, dp.size())) {
    const Tensor grads = params_.grads;
    const int64_t total = grads.numel(), parts = dp.size();
    for (const BucketRange& r : bucket_ranges(total, dtype_size(grads.dtype()), dp.size(), bucket_bytes))
        buckets_.push_back(Bucket{r.begin, r.end, 0, 0, false, CommHandle()});

    buckets_of_param_.resize(params_.ranges.size());
    for (size_t b = 0; b < buckets_.size(); ++b)
        for (size_t i = 0; i < params_.ranges.size(); ++i) {
            if (params_.ranges[i].overlaps({buckets_[b].begin, buckets_[b].end})) {
                buckets_of_param_[i].push_back(b);
                ++buckets_[b].params;
            }
        }

    if (zero1_) shard_grads_ = params_.allocate(grads.dtype(), {owned_numel(total, dtype_size(grads.dtype()), dp.size(), zero1, bucket_bytes)});
    int64_t shard_offset = 0;
    for (const Bucket& b : buckets_) {
        if (!zero1_) break;
        const int64_t piece = (b.end - b.begin) / parts, begin = b.begin + dp.rank() * piece;
        owned_.push_back({begin, begin + piece, flat_slice(shard_grads_.view(), shard_offset, shard_offset + piece), {}, {}});
        shard_offset += piece;
    }
    if (!zero1_) owned_.push_back({0, total, grads, {}, {}});
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
    const Tensor grads = flat_slice(params_.grads, bucket.begin, bucket.end);
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

void GradBuckets::gather(const Tensor& flat) {
    for (Bucket& b : buckets_) b.handle = dp_.all_gather_async(flat_slice(flat, b.begin, b.end));
    for (Bucket& b : buckets_) b.handle.wait();
}

void GradBuckets::gather_parameters() {
    if (zero1_) gather(params_.compute_values.empty() ? params_.values : params_.compute_values);
}

void GradBuckets::gather_master_values() {
    if (zero1_ && !params_.compute_values.empty()) gather(params_.values);
}

}  // namespace llmtrain

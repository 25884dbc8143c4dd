#include "parallel/grad_buckets.h"

#include <algorithm>

namespace llmtrain {

namespace {
Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t end) { return flat.slice_rows(begin, end - begin); }
}  // namespace

GradBuckets::GradBuckets(Parameters& params, Comm& dp, bool zero1, int64_t bucket_bytes)
    : params_(params), dp_(dp), zero1_(zero1 && dp.size() > 1) {
    const Tensor grads = params.all_grads();
    const int64_t total = grads.numel(), parts = dp.size();
    if (total % parts != 0) fail(ErrorKind::runtime, "gradient buffer of ", total, " elements is not padded to a multiple of dp = ", parts);
    const int64_t elems = static_cast<int64_t>(dtype_size(grads.dtype()));
    const int64_t step = std::max<int64_t>(1, bucket_bytes / elems / parts) * parts;
    for (int64_t end = total; end > 0; end -= step) buckets_.push_back(Bucket{std::max<int64_t>(0, end - step), end, 0, 0, false, CommHandle()});

    buckets_of_param_.resize(params.count());
    for (size_t b = 0; b < buckets_.size(); ++b)
        for (size_t i = 0; i < params.count(); ++i) {
            const ParamInfo& p = params.info(i);
            if (p.offset < buckets_[b].end && p.offset + p.shape.numel() > buckets_[b].begin) {
                buckets_of_param_[i].push_back(b);
                ++buckets_[b].params;
            }
        }

    int64_t shard_total = 0;
    for (const Bucket& b : buckets_) shard_total += (b.end - b.begin) / parts;
    if (zero1_) shard_grads_ = params.new_tensor(grads.dtype(), {shard_total});
    int64_t shard_offset = 0;
    for (const Bucket& b : buckets_) {
        if (!zero1_) break;
        const int64_t piece = (b.end - b.begin) / parts, begin = b.begin + dp.rank() * piece;
        owned_.push_back({begin, begin + piece, flat_slice(shard_grads_.view(), shard_offset, shard_offset + piece)});
        shard_offset += piece;
    }
    if (!zero1_) owned_.push_back({0, total, grads});
    begin_step();
}

void GradBuckets::begin_step() {
    param_ready_.assign(params_.count(), false);
    for (Bucket& b : buckets_) {
        b.handle.wait();
        b.waiting = b.params;
        b.started = false;
    }
}

void GradBuckets::start(size_t index) {
    Bucket& bucket = buckets_[index];
    bucket.started = true;
    if (dp_.size() == 1) return;
    const Tensor grads = flat_slice(params_.all_grads(), bucket.begin, bucket.end);
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

void GradBuckets::gather_parameters() {
    if (!zero1_) return;
    const Tensor values = params_.all_values();
    for (Bucket& b : buckets_) b.handle = dp_.all_gather_async(flat_slice(values, b.begin, b.end));
    for (Bucket& b : buckets_) b.handle.wait();
}

}  // namespace llmtrain

#include "parallel/grad_buckets.h"

#include <algorithm>

namespace llmtrain {

namespace {
Tensor flat_slice(const Tensor& flat, FlatRange range) { return flat.slice_rows(range.begin, range.size()); }
}  // namespace

size_t GradBuckets::staging_bytes(int64_t padded_numel, int64_t shard_numel, bool shards, int dp, DType master, DType reduce_dtype) {
    if (reduce_dtype == master || dp == 1) return 0;
    return static_cast<size_t>(padded_numel + (shards ? shard_numel : 0)) * dtype_size(reduce_dtype);
}

GradBuckets::GradBuckets(FlatParameters params, std::vector<FlatCut> buckets, bool shards, Comm& dp, DType reduce_dtype, FlatOps ops)
    : params_(std::move(params)), dp_(dp), ops_(std::move(ops)), zero1_(shards && dp.size() > 1) {
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
    staged_bytes_ = staging_bytes(grads.numel(), shard_numel, zero1_, dp.size(), grads.dtype(), reduce_dtype);
    if (staged()) {
        if (!ops_.copy) fail(ErrorKind::runtime, "gradient reduction in ", dtype_name(reduce_dtype), " needs a dtype-converting copy");
        staged_grads_ = params_.allocate(reduce_dtype, {grads.numel()});
        if (zero1_) staged_pieces_ = params_.allocate(reduce_dtype, {shard_numel});
    }
    begin_step(true);
}

std::string GradBuckets::describe() const {
    return cat(zero1_ ? "ZeRO-1" : "ZeRO off", " | ", buckets_.size(), " gradient buckets", staged() ? cat(", reduced in ", dtype_name(staged_grads_.view().dtype())) : "");
}

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
    Tensor grads = flat_slice(params_.grads, bucket.cut.flat), piece = zero1_ ? owned_[index].grads : Tensor();
    ReduceOp sum = ReduceOp::sum;
    if (staged()) {
        const Tensor copy = flat_slice(staged_grads_.view(), bucket.cut.flat);
        ops_.copy(copy, grads);  // rounds to nearest even
        grads = copy;
        if (zero1_) piece = staged_pieces_.view().slice_rows(bucket.cut.shard_at, piece.numel());
        sum = ReduceOp::sum_in_dtype;
    }
    const int64_t p = dp_.size(), share = static_cast<int64_t>(grads.bytes()) * (p - 1) / p;
    bytes_sent_ += zero1_ ? share : 2 * share;
    bucket.handle = zero1_ ? dp_.reduce_scatter_async(piece, grads, sum) : dp_.all_reduce_async(grads, sum);
}

void GradBuckets::widen(size_t index) {
    const Bucket& bucket = buckets_[index];
    if (!zero1_) {
        ops_.copy(flat_slice(params_.grads, bucket.cut.flat), flat_slice(staged_grads_.view(), bucket.cut.flat));
        return;
    }
    const Tensor piece = owned_[index].grads;
    ops_.copy(piece, staged_pieces_.view().slice_rows(bucket.cut.shard_at, piece.numel()));
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
    if (!staged() || !reduce_) return;
    for (size_t b = 0; b < buckets_.size(); ++b) widen(b);
}

}  // namespace llmtrain

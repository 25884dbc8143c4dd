#include "parallel/grad_buckets.h"

#include <algorithm>

namespace llmtrain {

namespace {
Tensor flat_slice(const Tensor& flat, FlatRange range) { return flat.slice_rows(range.begin, range.size()); }
}  // namespace

namespace {
struct StagingSize {
    int64_t bucket = 0, piece = 0;
};
StagingSize staging_size(const std::vector<FlatCut>& buckets, bool shards) {
    StagingSize s;
    for (const FlatCut& cut : buckets) {
        s.bucket = std::max(s.bucket, cut.flat.size());
        if (shards) s.piece = std::max(s.piece, cut.piece);
    }
    return s;
}
}  // namespace

size_t GradBuckets::staging_bytes(const std::vector<FlatCut>& buckets, bool shards, int dp, DType master, DType reduce_dtype) {
    if (reduce_dtype == master || dp == 1 || buckets.empty()) return 0;
    const StagingSize s = staging_size(buckets, shards);
    return static_cast<size_t>(staging_buffers(buckets.size()) * (s.bucket + s.piece)) * dtype_size(reduce_dtype);
}

GradBuckets::GradBuckets(FlatParameters params, std::vector<FlatCut> buckets, bool shards, Comm& dp, DType reduce_dtype, FlatOps ops)
    : params_(std::move(params)), dp_(dp), ops_(std::move(ops)), zero1_(shards && dp.size() > 1), reduce_dtype_(reduce_dtype) {
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
    staged_bytes_ = staging_bytes(buckets, zero1_, dp.size(), grads.dtype(), reduce_dtype);
    if (staged()) {
        if (!ops_.copy) fail(ErrorKind::runtime, "gradient reduction in ", dtype_name(reduce_dtype), " needs a dtype-converting copy");
        const StagingSize size = staging_size(buckets, zero1_);
        for (int64_t s = 0; s < staging_buffers(buckets_.size()); ++s)
            staging_.push_back({params_.allocate(reduce_dtype, {size.bucket}), zero1_ ? params_.allocate(reduce_dtype, {size.piece}) : OwnedTensor(), -1});
    }
    begin_step(true);
}

std::string GradBuckets::describe() const {
    return cat(zero1_ ? "ZeRO-1" : "ZeRO off", " | ", buckets_.size(), " gradient buckets", staged() ? cat(", reduced in ", dtype_name(reduce_dtype_)) : "");
}

void GradBuckets::begin_step(bool reduce) {
    reduce_ = reduce;
    param_ready_.assign(params_.ranges.size(), false);
    for (Staging& staging : staging_) staging.in_flight = -1;  // a step cut short leaves nothing to widen
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
        const size_t slot = next_staging_;
        next_staging_ = (next_staging_ + 1) % staging_.size();
        settle(slot);
        Staging& staging = staging_[slot];
        staging.in_flight = static_cast<int>(index);
        const Tensor copy = staging.bucket.view().slice_rows(0, grads.numel());
        ops_.copy(copy, grads);  // rounds to nearest even
        grads = copy;
        if (zero1_) piece = staging.piece.view().slice_rows(0, piece.numel());
        sum = ReduceOp::sum_in_dtype;
    }
    const int64_t p = dp_.size(), share = static_cast<int64_t>(grads.bytes()) * (p - 1) / p;
    bytes_sent_ += zero1_ ? share : 2 * share;
    bucket.handle = zero1_ ? dp_.reduce_scatter_async(piece, grads, sum) : dp_.all_reduce_async(grads, sum);
}

void GradBuckets::settle(size_t slot) {
    Staging& staging = staging_[slot];
    if (staging.in_flight < 0) return;
    const size_t index = static_cast<size_t>(staging.in_flight);
    staging.in_flight = -1;
    Bucket& bucket = buckets_[index];
    bucket.handle.wait();
    if (!zero1_) {
        const Tensor grads = flat_slice(params_.grads, bucket.cut.flat);
        ops_.copy(grads, staging.bucket.view().slice_rows(0, grads.numel()));
        return;
    }
    const Tensor piece = owned_[index].grads;
    ops_.copy(piece, staging.piece.view().slice_rows(0, piece.numel()));
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
    for (size_t slot = 0; slot < staging_.size(); ++slot) settle(slot);
    for (Bucket& b : buckets_) b.handle.wait();
}

}  // namespace llmtrain

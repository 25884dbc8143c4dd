// Data-parallel gradient reduction in buckets, overlapped with backward, and the ZeRO-1
// ownership of the flat parameter buffer (Rajbhandari et al., "ZeRO", SC'20).
//
// The flat gradient buffer (padded to a multiple of dp) is cut into buckets of about
// bucket_bytes, from its end backwards, since backward produces the last parameters'
// gradients first. Every bucket's length is a multiple of dp. As backward reports
// parameters ready, each bucket whose parameters are all ready starts its reduction at once
// (asynchronously) while backward goes on:
//   plain dp: all-reduce (sum) of the bucket, in place; every rank updates everything.
//   ZeRO-1:   reduce-scatter of the bucket; rank r receives the sum of piece r (length/dp) and
//             owns it: it keeps AdamW moments for its pieces only and updates them, then the
//             updated parameters are all-gathered per bucket: the 16-bit compute copy where
//             there is one (what forward reads; half the bytes of the f32 master weights),
//             the master weights otherwise. The master weights of other ranks' pieces are
//             then stale here; gather_master_values() brings them in for a checkpoint.
//
// The reductions' handles are waited for in finish() and gather_parameters(): under an
// event-ordered Comm (NCCL) that orders the device's compute stream after them and the
// host goes on; under MPI it blocks.
// Every rank of the dp group starts the same reductions in the same order (the model's
// backward reports readiness identically on each), as collectives require.
#pragma once

#include <cstdint>
#include <vector>

#include <functional>

#include "core/flat_range.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/gradient_reduction.h"

namespace llmtrain {

// The buckets of a flat gradient buffer of total_numel elements (a multiple of dp) of
// elem_bytes each: [begin, end) ranges of about bucket_bytes, each a multiple of dp long,
// from the end of the buffer to its start.
struct BucketRange {
    int64_t begin = 0, end = 0;
};
std::vector<BucketRange> bucket_ranges(int64_t total_numel, size_t elem_bytes, int dp, int64_t bucket_bytes);
// Whether ZeRO-1 shards anything: asked for, and more than one dp rank to shard over.
inline bool zero1_shards(bool zero1, int dp) { return zero1 && dp > 1; }
// Elements of the flat buffer one dp rank updates (and keeps AdamW moments for): its piece
// of every bucket when ZeRO-1 shards, the whole buffer otherwise.
int64_t owned_numel(int64_t total_numel, size_t elem_bytes, int dp, bool zero1, int64_t bucket_bytes);

// A range [begin, end) of the flat parameter buffer this rank updates, and where its
// reduced gradients are (a view of end - begin elements).
struct OwnedPiece {
    int64_t begin = 0, end = 0;
    Tensor grads;
    // ZeRO-3: the piece's master weights (and compute copy; empty without one), kept in this
    // rank's shards, not in flat buffers. Empty values: the flat buffers hold them.
    Tensor values, compute_values;
};

// The flat buffers the buckets work on: the parameters (master weights) and their gradients
// in one layout, each parameter's range in it, and how to allocate more of that memory.
struct FlatParameters {
    Tensor values, grads;
    Tensor compute_values;          // the 16-bit compute copy in the same layout; empty: none
    std::vector<FlatRange> ranges;  // in registration order: the order mark_ready counts in
    std::function<OwnedTensor(DType, Shape)> allocate;
};

class GradBuckets : public GradientReduction {
public:
    GradBuckets(FlatParameters params, Comm& dp, bool zero1, int64_t bucket_bytes);

    // GradientReduction: the flat gradient buffer holds every micro-batch's gradients; the
    // last micro-batch's readiness starts the buckets.
    std::vector<GradStorageBinding> run_storage() const override { return {}; }
    std::optional<GradStorageBinding> open(size_t, size_t) override { return std::nullopt; }
    bool consumes(size_t, bool last_micro_batch) const override { return last_micro_batch; }
    void ready(size_t first, size_t end, bool last_micro_batch) override {
        if (last_micro_batch) mark_ready(first, end);
    }
    bool sharded() const override { return zero1_; }
    bool holds_first_copy() const override { return zero1_ || dp_.rank() == 0; }
    size_t gradient_bytes() const override { return params_.grads.bytes() + sharded_grad_bytes(); }
    std::string describe() const override;

    // Forget readiness: call before the backward whose gradients are to be reduced (or,
    // reduce = false, kept local: see GradientReduction::begin_step).
    void begin_step(bool reduce) override;
    // Parameters [begin, end) have their final gradients; starts every bucket that is ready.
    void mark_ready(size_t begin, size_t end);
    // Starts what is left and waits for every reduction. Afterwards owned() holds the summed
    // gradients over the dp group.
    void finish() override;
    // ZeRO-1: all-gathers the updated parameters of every bucket: the compute copy if there
    // is one, else the master weights (no-op without ZeRO-1).
    void gather_parameters() override;
    // ZeRO-1 with a compute copy: all-gathers the master weights too (before a checkpoint
    // reads them whole). A collective over the dp group: every rank calls it at once.
    void gather_master_values() override;

    const std::vector<OwnedPiece>& owned() const override { return owned_; }
    bool zero1() const { return zero1_; }
    size_t bucket_count() const { return buckets_.size(); }
    // Gradient bytes this rank has sent so far: a ring all-reduce of B bytes over p ranks
    // sends 2 (p - 1) B / p of them, a reduce-scatter (p - 1) B / p.
    int64_t bytes_sent() const override { return bytes_sent_; }
    // An unallocated tensor still counts one element: no shards, no bytes.
    size_t sharded_grad_bytes() const { return zero1_ ? shard_grads_.view().bytes() : 0; }

private:
    struct Bucket {
        int64_t begin, end;          // flat range, length a multiple of dp (a BucketRange)
        int waiting = 0;             // parameters not yet ready
        int params = 0;              // parameters overlapping it
        bool started = false;
        CommHandle handle;
    };
    void start(size_t index);
    void gather(const Tensor& flat);  // every bucket's range of it, over the dp group

    FlatParameters params_;
    Comm& dp_;
    bool zero1_;
    bool reduce_ = true;
    int64_t bytes_sent_ = 0;
    std::vector<Bucket> buckets_;             // from the end of the buffer to its start
    std::vector<std::vector<size_t>> buckets_of_param_;
    std::vector<bool> param_ready_;
    OwnedTensor shard_grads_;                 // ZeRO-1: this rank's reduced pieces, bucket by bucket
    std::vector<OwnedPiece> owned_;
};

}  // namespace llmtrain

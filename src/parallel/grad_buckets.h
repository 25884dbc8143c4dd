// Data-parallel gradient reduction in buckets, overlapped with backward, for ZeRO stages 0
// and 1 (Rajbhandari et al., "ZeRO", SC'20).
//
// The flat gradient buffer (padded to a multiple of dp) is cut into buckets by the rank's
// placement (bucket_cuts: about parallel.bucket_mb each, a multiple of dp long, from the end
// of the buffer backwards, since backward produces the last parameters' gradients first). As
// backward reports parameters ready, each bucket whose parameters are all ready starts its
// reduction at once (asynchronously) while backward goes on:
//   stage 0: all-reduce (sum) of the bucket, in place; every rank updates everything.
//   stage 1: reduce-scatter of the bucket; rank r receives the sum of piece r (length/dp) and
//            owns it: it keeps AdamW moments for its pieces only and updates them; the
//            parameter store then all-gathers the updated pieces (parallel/parameter_store.h).
//
// parallel.grad_reduce_dtype = "bf16" (reduce_dtype narrower than the master dtype): the
// gradients stay f32 and accumulate over micro-batches there; each bucket is rounded into a
// bf16 staging buffer (ops.copy converts) as it starts, the collective sums the copies in
// bf16 (ReduceOp::sum_in_dtype: 2 bytes per element on the wire), and the reduced bucket
// (stage 1: this rank's bf16 piece) is widened back into the f32 gradients. The staging
// buffers are a pool of kStagingBuffers (fewer with fewer buckets), each as long as the
// largest bucket (and its piece):
// a bucket that finds its buffer still in use first settles the bucket before it there
// (waits for it and widens it), so at most that many bf16 reductions are in flight and the
// cost is a few buckets' worth of memory, not a copy of the whole buffer. Only ranks that
// reduce (dp > 1) hold them.
//
// The reductions' handles are waited for in finish(): under an event-ordered Comm (NCCL)
// that orders the device's compute stream after them and the host goes on; under MPI it
// blocks. Every rank of the dp group starts the same reductions in the same order (the
// model's backward reports readiness identically on each), as collectives require.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/gradient_sync.h"
#include "parallel/placement.h"

namespace llmtrain {

class GradBuckets : public GradientSync {
public:
    // buckets: bucket_cuts of the flat buffer over the dp group; shards: ZeRO-1 (each rank
    // keeps the sum of its pieces) rather than plain all-reduces; reduce_dtype: the dtype the
    // collectives carry (the master dtype, or bf16 staged through copies by ops.copy).
    GradBuckets(FlatParameters params, std::vector<FlatCut> buckets, bool shards, Comm& dp, DType reduce_dtype, FlatOps ops);
    // The bytes beyond the flat gradient buffer that the staging buffers take (none without).
    static size_t staging_bytes(const std::vector<FlatCut>& buckets, bool shards, int dp, DType master, DType reduce_dtype);
    static constexpr int64_t kStagingBuffers = 4;
    // No more buffers than buckets (a small model is one bucket).
    static int64_t staging_buffers(size_t buckets) { return std::min<int64_t>(kStagingBuffers, static_cast<int64_t>(buckets)); }

    // The flat gradient buffer holds every micro-batch's gradients; the last micro-batch's
    // readiness starts the buckets.
    bool consumes(size_t, bool last_micro_batch) const override { return last_micro_batch; }
    void ready(size_t first, size_t end, bool last_micro_batch) override {
        if (last_micro_batch) mark_ready(first, end);
    }
    bool holds_first_copy() const override { return zero1_ || dp_.rank() == 0; }
    size_t gradient_bytes() const override { return params_.grads.bytes() + sharded_grad_bytes() + staged_bytes_; }
    std::string describe() const override;

    // Forget readiness: call before the backward whose gradients are to be reduced (or,
    // reduce = false, kept local: see GradientSync::begin_step).
    void begin_step(bool reduce) override;
    // Parameters [begin, end) have their final gradients; starts every bucket that is ready.
    void mark_ready(size_t begin, size_t end);
    // Starts what is left and waits for every reduction. Afterwards owned() holds the summed
    // gradients over the dp group.
    void finish() override;

    const std::vector<OwnedPiece>& owned() const override { return owned_; }
    bool zero1() const { return zero1_; }
    size_t bucket_count() const { return buckets_.size(); }
    int64_t bytes_sent() const override { return bytes_sent_; }
    // An unallocated tensor still counts one element: no shards, no bytes.
    size_t sharded_grad_bytes() const { return zero1_ ? shard_grads_.view().bytes() : 0; }

private:
    struct Bucket {
        FlatCut cut;                 // a multiple of dp long
        int waiting = 0;             // parameters not yet ready
        int params = 0;              // parameters overlapping it
        bool started = false;
        CommHandle handle;
    };
    void start(size_t index);
    bool staged() const { return staged_bytes_ > 0; }
    // Waits for the reduction in staging buffer `slot` and widens it into the f32 gradients.
    void settle(size_t slot);

    FlatParameters params_;
    Comm& dp_;
    FlatOps ops_;
    bool zero1_;
    bool reduce_ = true;
    int64_t bytes_sent_ = 0;
    std::vector<Bucket> buckets_;             // from the end of the buffer to its start
    std::vector<std::vector<size_t>> buckets_of_param_;
    std::vector<bool> param_ready_;
    OwnedTensor shard_grads_;                 // ZeRO-1: this rank's reduced pieces, bucket by bucket
    struct Staging {
        OwnedTensor bucket, piece;  // the bucket's bf16 copy; ZeRO-1: this rank's reduced bf16 piece
        int in_flight = -1;         // the bucket whose reduction uses it; -1: none
    };
    std::vector<Staging> staging_;  // bf16 reduction: the pool, taken in turn
    size_t next_staging_ = 0;
    DType reduce_dtype_;
    size_t staged_bytes_ = 0;
    std::vector<OwnedPiece> owned_;
};

}  // namespace llmtrain

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
// The reductions' handles are waited for in finish(): under an event-ordered Comm (NCCL)
// that orders the device's compute stream after them and the host goes on; under MPI it
// blocks. Every rank of the dp group starts the same reductions in the same order (the
// model's backward reports readiness identically on each), as collectives require.
#pragma once

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
    // keeps the sum of its pieces) rather than plain all-reduces.
    GradBuckets(FlatParameters params, std::vector<FlatCut> buckets, bool shards, Comm& dp);

    // The flat gradient buffer holds every micro-batch's gradients; the last micro-batch's
    // readiness starts the buckets.
    bool consumes(size_t, bool last_micro_batch) const override { return last_micro_batch; }
    void ready(size_t first, size_t end, bool last_micro_batch) override {
        if (last_micro_batch) mark_ready(first, end);
    }
    bool holds_first_copy() const override { return zero1_ || dp_.rank() == 0; }
    size_t gradient_bytes() const override { return params_.grads.bytes() + sharded_grad_bytes(); }
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

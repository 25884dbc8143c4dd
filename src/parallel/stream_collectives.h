// StreamCollectives: the collectives of one group of ranks, enqueued on a device stream.
// Each call returns as soon as the operation is enqueued: it runs when the stream reaches it,
// after everything enqueued on that stream before (NCCL on a CUDA stream). What orders the
// stream against the compute stream is the caller's business (EventOrderedComm).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "parallel/comm.h"
#include "parallel/stream_order.h"

namespace llmtrain {

class StreamCollectives {
public:
    virtual ~StreamCollectives() = default;
    // The same meaning as Comm's operations of the same names, on device memory.
    virtual void all_reduce(const Tensor& data, ReduceOp op, StreamId stream) = 0;
    virtual void reduce_scatter(const Tensor& out, const Tensor& in, StreamId stream) = 0;
    virtual void all_gather(const Tensor& data, StreamId stream) = 0;
    // Comm::all_to_all_async's bytes, on a stream.
    virtual void all_to_all(const Tensor& out, const Tensor& in, StreamId stream) = 0;
    // Comm::all_to_all_v_async's chunks (checked by the caller), on a stream.
    virtual void all_to_all_v(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts, StreamId stream) = 0;
    virtual void send(const Tensor& data, int peer, StreamId stream) = 0;
    virtual void recv(const Tensor& data, int peer, StreamId stream) = 0;
    virtual void broadcast(const Tensor& data, int root, StreamId stream) = 0;
    // An error the transport met in the background (NCCL's asynchronous error), or "".
    // Callable from the watchdog's thread.
    virtual std::string async_error() = 0;
    // Ends every pending operation, so that streams waiting on them go on (ncclCommAbort);
    // the communicator is unusable afterwards. Callable from the watchdog's thread.
    virtual void abort() = 0;
};

// NCCL over the ranks of `bootstrap` (an MPI Comm of the same ranks: rank 0's unique id is
// broadcast over it), on GPU local_rank % device count, enqueuing on `order`'s streams.
// In a build without NCCL this refuses.
std::unique_ptr<StreamCollectives> make_nccl_collectives(Comm& bootstrap, int local_rank, double timeout_seconds, StreamOrder& order);

}  // namespace llmtrain

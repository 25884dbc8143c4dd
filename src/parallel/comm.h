// Comm: collectives and point-to-point transfers within one group of ranks (the world, or
// the tp, pp or dp group of a Mesh). Implementations: SelfComm (a group of one: every
// collective is the identity), MpiComm (host memory, over MPI). Ranks are numbered within
// the group; world_rank() maps them back for messages.
//
// Every operation is bounded in time: a collective or transfer that does not complete
// within the group's timeout throws an Error naming this rank, the operation and the peers,
// so a dead or hung rank ends the job with a message instead of a silent hang.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmtrain {

// sum: for 16-bit floats (bf16, f16) the transport keeps the sum as exact as it can: MPI
// carries them as f32 and rounds the total once (twice their bytes on the wire); NCCL sums
// them in their own dtype. sum_in_dtype: the sum in the tensor's own dtype on every
// transport, each partial sum rounded to it (nearest even), so 16-bit floats travel as 2
// bytes per element; the result then depends on the order the transport adds in (fixed for
// a fixed group size). The data-parallel gradient reduction in bf16
// (parallel.grad_reduce_dtype) asks for it: its point is the halved bytes. For f32 and wider
// the two are the same.
enum class ReduceOp { sum, max, sum_in_dtype };

// The operations of a Comm, as timings and progress records name them.
enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, all_to_all, send, recv, broadcast, barrier };
const char* comm_op_name(CommOp op);

// A pending asynchronous operation. wait() blocks until it completes (or times out); a
// handle that is destroyed unwaited waits in its destructor, so buffers outlive transfers.
class CommRequest {
public:
    virtual ~CommRequest() = default;
    virtual void wait() = 0;
    // Lets the operation advance without waiting for it: MPI moves a nonblocking collective
    // only inside MPI calls, so a rank computing between them polls it (NCCL's run by themselves).
    virtual void progress() {}
    // Whether the operation has completed, without waiting where the transport can tell (MPI:
    // one MPI_Test); the default waits for it. A transfer that runs across many steps (a
    // local snapshot's replica) is polled with it at each step boundary.
    virtual bool done() {
        wait();
        return true;
    }
};

class CommHandle {
public:
    CommHandle() = default;
    explicit CommHandle(std::unique_ptr<CommRequest> request) : request_(std::move(request)) {}
    CommHandle(CommHandle&&) = default;
    CommHandle& operator=(CommHandle&& other) noexcept;
    ~CommHandle();
    void wait();
    void progress() {
        if (request_) request_->progress();
    }
    // True once the operation has completed (then as after wait()); never blocks on MPI.
    bool done();

private:
    std::unique_ptr<CommRequest> request_;
};

class Comm {
public:
    virtual ~Comm() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // The world rank of group rank `rank`.
    virtual int world_rank(int rank) const = 0;
    // "dp", "tp", "pp", "world", ...: names the group in messages.
    virtual const std::string& name() const = 0;

    // In place: every rank ends with the elementwise reduction of every rank's tensor.
    virtual CommHandle all_reduce_async(const Tensor& data, ReduceOp op) = 0;
    // out (n elements) = the sum over ranks of in[rank * n, (rank + 1) * n); op: sum or
    // sum_in_dtype.
    virtual CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
    // In place: data holds size() chunks; this rank's chunk is at position rank() and every
    // rank ends with every chunk.
    virtual CommHandle all_gather_async(const Tensor& data) = 0;
    // in and out hold size() chunks of equal bytes: chunk r of in goes to rank r, chunk r of
    // out arrives from rank r. Bytes move as they are (no arithmetic), whatever the dtype:
    // what compressed collectives (1-bit Adam's sign bits) send.
    virtual CommHandle all_to_all_async(const Tensor& out, const Tensor& in) = 0;
    // Chunks of their own sizes (the routing of tokens to experts): in holds send_counts[r]
    // elements for rank r, out receives recv_counts[r] from rank r, each side's chunks back to
    // back in rank order; counts are in elements of the tensors' (shared) dtype and must agree
    // (recv_counts[r] here = send_counts[this rank] on rank r: an all_to_all of the counts
    // first tells them). Bytes move as they are. The default posts a send and a receive per
    // peer with a nonzero count (host memory); MPI and the device paths use their own.
    virtual CommHandle all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts);
    virtual CommHandle send_async(const Tensor& data, int peer) = 0;
    virtual void recv(const Tensor& data, int peer) = 0;
    // A receive whose completion the handle waits for (the ring of context parallelism posts
    // the next block's receive before it computes with the current one). The default
    // receives at once: a Comm that can defer overrides it.
    virtual CommHandle recv_async(const Tensor& data, int peer) {
        recv(data, peer);
        return {};
    }
    virtual void broadcast(const Tensor& data, int root) = 0;
    virtual void barrier() = 0;

    void all_reduce(const Tensor& data, ReduceOp op) { all_reduce_async(data, op).wait(); }
    void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) { reduce_scatter_async(out, in, op).wait(); }
    void all_gather(const Tensor& data) { all_gather_async(data).wait(); }
    void all_to_all(const Tensor& out, const Tensor& in) { all_to_all_async(out, in).wait(); }
    void all_to_all_v(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) {
        all_to_all_v_async(out, recv_counts, in, send_counts).wait();
    }
    void send(const Tensor& data, int peer) { send_async(data, peer).wait(); }
    // Sum (or max) of one number over the group.
    double all_reduce_scalar(double value, ReduceOp op);
    // "dp group (world ranks 2, 3)"; built on first use (from another thread too).
    const std::string& describe() const;

private:
    mutable std::once_flag described_;
    mutable std::string description_;
};

// "0, 1, 2", "0-127", "0, 8, ..., 120 (stride 8)": world ranks in ascending runs.
std::string describe_world_ranks(const std::vector<int>& ranks);

// The element offsets of chunks of `counts` elements laid back to back (size() + 1 of them,
// the last the total), after checking all_to_all_v's arguments: one count per rank of
// `group`, none negative, summing to the tensor's elements; in and out of one dtype. Throws
// Error(shape) naming the group and the side.
std::vector<int64_t> all_to_all_v_offsets(const Comm& group, const Tensor& t, std::span<const int64_t> counts, const char* side);
struct AllToAllVOffsets {
    std::vector<int64_t> sent_at, received_at;  // each side's chunk offsets, in elements
};
AllToAllVOffsets check_all_to_all_v(const Comm& group, const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                                    std::span<const int64_t> send_counts);
// Elements [offset, offset + count) of t, flattened.
Tensor flat_part(const Tensor& t, int64_t offset, int64_t count);

// A group of one rank: reductions and gathers leave the data as it is.
std::unique_ptr<Comm> make_self_comm(const std::string& name);

}  // namespace llmtrain

// EventOrderedComm: the Comm of a group whose device collectives (NCCL) run on their own
// stream, ordered against the compute stream by events and never by the host waiting:
//
//   compute:  ... producer ──record(e_in)                      wait(e_done)── consumer ...
//                                 │                                  ▲
//   comm:              wait(e_in)─┴─ collective ──record(e_done) ────┘
//
// Every operation first makes the group's stream wait for an event recorded on the compute
// stream when the operation is issued, so it sees everything the compute stream wrote
// before (backward's gradients for a bucket, a layer's partial output for a tensor-parallel
// all-reduce). Its handle's wait() makes the compute stream wait for the operation's
// completion event: what the compute stream runs afterwards (the optimizer, the next layer)
// reads the result; the host goes on at once. The blocking calls (recv, broadcast) return
// once the operation is so ordered. Host tensors (a loss, a norm: f64 scalars) and barrier
// go through the group's host Comm (MPI), which does block.
//
// Point-to-point transfers toward lower ranks get a stream and communicator of their own:
// 1F1B sends activations up while it waits for gradients coming down, and on one stream a
// send queued behind the opposite direction's receive would wait forever.
//
// Bounded waits stay, without a host synchronisation per operation: every operation's
// completion event goes to a CommWatchdog, whose thread polls the events; one not passed
// within parallel.timeout_seconds (or a transport error) aborts its communicator, so that
// nothing waits on it forever, and the next operation or the step's end throws an error
// naming the rank, the operation and the group.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm.h"
#include "parallel/stream_collectives.h"
#include "parallel/stream_order.h"

namespace llmtrain {

class CommWatchdog {
public:
    // rank: this process's world rank, named in failures.
    CommWatchdog(StreamOrder& order, double timeout_seconds, int rank);
    ~CommWatchdog();
    CommWatchdog(const CommWatchdog&) = delete;
    CommWatchdog& operator=(const CommWatchdog&) = delete;

    // Watches an operation's completion event: what (e.g. "all_reduce in the tp group
    // (world ranks 0, 1)") is named if it fails; collectives is aborted then.
    void watch(const StreamEvent& done, std::string what, StreamCollectives& collectives);
    // One pass over the watched events: forgets those passed; the first one past its
    // deadline, or a transport error, becomes the failure (its collectives aborted).
    void poll();
    // Throws the failure, if there is one.
    void check() const;
    // Polls every `interval` on a thread of its own until destroyed.
    void start(std::chrono::milliseconds interval);
    size_t watched() const;

private:
    struct Watched {
        StreamEvent done;
        std::string what;
        StreamCollectives* collectives;
        std::chrono::steady_clock::time_point since;
    };
    void fail_with(std::string message, StreamCollectives& collectives);

    StreamOrder& order_;
    double timeout_seconds_;
    int rank_;
    mutable std::mutex mutex_;
    std::deque<Watched> watched_;
    std::string failure_;
    std::atomic<bool> failed_{false};
    std::condition_variable stop_signal_;
    bool stopping_ = false;
    std::thread thread_;
};

class EventOrderedComm final : public Comm {
public:
    // host: the MPI Comm of the same ranks (outlives this); reverse_p2p: the collectives for
    // transfers toward lower ranks (null: the group has no point-to-point traffic).
    EventOrderedComm(Comm& host, std::unique_ptr<StreamCollectives> collectives, std::unique_ptr<StreamCollectives> reverse_p2p, StreamOrder& order,
                     CommWatchdog& watchdog);

    int rank() const override { return host_.rank(); }
    int size() const override { return host_.size(); }
    int world_rank(int rank) const override { return host_.world_rank(rank); }
    const std::string& name() const override { return host_.name(); }

    CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override;
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override;
    CommHandle all_gather_async(const Tensor& data) override;
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override;
    CommHandle send_async(const Tensor& data, int peer) override;
    void recv(const Tensor& data, int peer) override;
    CommHandle recv_async(const Tensor& data, int peer) override;
    void broadcast(const Tensor& data, int root) override;
    void barrier() override { host_.barrier(); }

private:
    struct Lane {
        std::unique_ptr<StreamCollectives> collectives;
        StreamId stream = -1;
    };
    // Orders `run` (which enqueues on the lane's stream) after the compute stream's work so
    // far; the handle orders the compute stream after it.
    template <class Run>
    CommHandle ordered(const std::string& op, Lane& lane, Run run);
    Lane& p2p_lane(int peer, bool sending);

    Comm& host_;
    StreamOrder& order_;
    CommWatchdog& watchdog_;
    Lane main_, reverse_;
};

}  // namespace llmtrain

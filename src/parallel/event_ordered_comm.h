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
// naming the rank, the operation and the group, and the ranks that never arrived (from the
// progress board, read by the thread that throws). An operation's clock starts when it could
// start on the device: once the compute stream has passed the event it waits for and every
// earlier operation of its stream has completed, not when the host enqueued it (which can be
// a step earlier). The watchdog publishes it on the progress board then, as this rank's
// arrival at it: what the device reached, not what the host queued.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "parallel/comm.h"
#include "parallel/progress_board.h"
#include "parallel/stream_collectives.h"
#include "parallel/stream_order.h"

namespace llmtrain {

// One lane of a group as the watchdog sees it: the group (named in failures), its collectives
// (aborted by one) and its channel on the progress board.
struct WatchedLane {
    const Comm* group = nullptr;
    CommLane lane = CommLane::device;
    StreamCollectives* collectives = nullptr;
    ProgressChannel progress;
};

// An operation enqueued on a lane: a collective with its sequence number in the lane, or a
// transfer with its peer's world rank.
struct LaneOperation {
    CommOp op = CommOp::barrier;
    uint64_t seq_or_peer = 0;
};

class CommWatchdog {
public:
    // rank: this process's world rank, named in failures. board: where arrivals are published
    // and hangs diagnosed (null: neither).
    CommWatchdog(StreamOrder& order, double timeout_seconds, int rank, ProgressBoard* board = nullptr);
    ~CommWatchdog();
    CommWatchdog(const CommWatchdog&) = delete;
    CommWatchdog& operator=(const CommWatchdog&) = delete;

    ProgressBoard* board() const { return board_; }
    // Watches an operation enqueued on lane.collectives' stream after `ready` (an event of the
    // compute stream) and before `done`; the lane is aborted if it fails.
    void watch(const StreamEvent& ready, const StreamEvent& done, WatchedLane& lane, LaneOperation op);
    // One pass over the watched events: forgets those passed, starts the clock of those that
    // could start; the first one past its deadline, or a transport error, becomes the failure
    // (its collectives aborted).
    void poll();
    // Throws the failure, if there is one, with the ranks that held it up (the first call
    // after a timeout reads the progress board, asking other nodes for up to 10 s: call it
    // from the thread that calls MPI).
    void check() const;
    // Polls every `interval` on a thread of its own until destroyed.
    void start(std::chrono::milliseconds interval);
    size_t watched() const;

private:
    struct Watched {
        StreamEvent ready, done;
        WatchedLane* lane;
        LaneOperation op;
        bool started = false;  // could start: its clock runs since `since`
        std::chrono::steady_clock::time_point since;
    };
    // to_diagnose: a timeout, whose ranks check() names.
    void fail_with(std::string message, const Watched& hung, std::optional<HungOperation> to_diagnose);
    // Publishes the device's wait on the oldest started operation (or none).
    void publish_wait(const Watched* oldest_started);

    StreamOrder& order_;
    double timeout_seconds_;
    int rank_;
    ProgressBoard* board_;
    mutable std::mutex mutex_;
    std::deque<Watched> watched_;
    uint64_t published_wait_ = 0;  // the done event id of the operation published as waited on
    const WatchedLane* waited_lane_ = nullptr;
    mutable std::string failure_;
    mutable std::optional<HungOperation> undiagnosed_;  // a timeout whose ranks are still to be named
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
    CommHandle all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) override;
    CommHandle send_async(const Tensor& data, int peer) override;
    void recv(const Tensor& data, int peer) override;
    CommHandle recv_async(const Tensor& data, int peer) override;
    void broadcast(const Tensor& data, int root) override;
    void barrier() override { host_.barrier(); }

private:
    struct Lane {
        std::unique_ptr<StreamCollectives> collectives;
        StreamId stream = -1;
        WatchedLane watched;
    };
    // Orders `run` (which enqueues on the lane's stream) after the compute stream's work so
    // far; the handle orders the compute stream after it. peer: a transfer's group rank.
    template <class Run>
    CommHandle ordered(CommOp op, Lane& lane, Run run, int peer = -1);
    Lane& p2p_lane(int peer, bool sending);

    Comm& host_;
    StreamOrder& order_;
    CommWatchdog& watchdog_;
    Lane main_, reverse_;
};

}  // namespace llmtrain

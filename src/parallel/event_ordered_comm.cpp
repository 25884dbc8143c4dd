#include "parallel/event_ordered_comm.h"

#include <algorithm>

namespace llmtrain {

namespace {

// The handle of an event-ordered operation: waiting orders the compute stream after it.
class OrderedRequest final : public CommRequest {
public:
    OrderedRequest(StreamOrder& order, StreamEvent done) : order_(order), done_(std::move(done)) {}
    void wait() override { order_.wait(order_.compute_stream(), done_); }

private:
    StreamOrder& order_;
    StreamEvent done_;
};

}  // namespace

CommWatchdog::CommWatchdog(StreamOrder& order, double timeout_seconds, int rank, ProgressBoard* board)
    : order_(order), timeout_seconds_(timeout_seconds), rank_(rank), board_(board) {}

CommWatchdog::~CommWatchdog() {
    {
        const std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    stop_signal_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void CommWatchdog::watch(const StreamEvent& ready, const StreamEvent& done, WatchedLane& lane, LaneOperation op) {
    const std::lock_guard lock(mutex_);
    watched_.push_back({ready, done, &lane, op, false, {}});
}

void CommWatchdog::fail_with(std::string message, const Watched& hung, std::optional<HungOperation> to_diagnose) {
    {
        const std::lock_guard lock(mutex_);
        if (failed_) return;
        failure_ = std::move(message);
        undiagnosed_ = std::move(to_diagnose);
        watched_.clear();
        failed_ = true;
    }
    // Aborting ends the hung operation, so that a stream (and a host call waiting on one)
    // waiting for it goes on to the point where the failure is thrown.
    hung.lane->collectives->abort();
}

namespace {

bool is_transfer(CommOp op) { return op == CommOp::send || op == CommOp::recv; }

// "all_reduce #12 in the dp group (world ranks 0, 1)", "send to world rank 3 in the pp group (...)"
std::string operation_text(const WatchedLane& lane, LaneOperation op) {
    const std::string group = lane.group->describe();
    if (op.op == CommOp::send) return cat("send to world rank ", op.seq_or_peer, " in the ", group);
    if (op.op == CommOp::recv) return cat("recv from world rank ", op.seq_or_peer, " in the ", group);
    return cat(comm_op_name(op.op), " #", op.seq_or_peer, " in the ", group);
}

void publish_arrival(const WatchedLane& lane, LaneOperation op) {
    if (is_transfer(op.op)) lane.progress.point_to_point(op.op, static_cast<int>(op.seq_or_peer));
    else lane.progress.arrived(op.op, op.seq_or_peer);
}

HungOperation hung_operation(const WatchedLane& lane, LaneOperation op, int self) {
    HungOperation hung{lane.group->name(), lane.lane, op.op, op.seq_or_peer, -1, {}, self};
    for (int r = 0; r < lane.group->size(); ++r) hung.members.push_back(lane.group->world_rank(r));
    if (is_transfer(op.op)) hung.seq = 0, hung.peer = static_cast<int>(op.seq_or_peer);
    return hung;
}

}  // namespace

void CommWatchdog::publish_wait(const Watched* oldest_started) {
    const uint64_t id = oldest_started ? oldest_started->done.id() : 0;
    if (id == published_wait_) return;
    published_wait_ = id;
    if (waited_lane_) waited_lane_->progress.done_waiting(Waiter::device);
    waited_lane_ = oldest_started ? oldest_started->lane : nullptr;
    if (oldest_started) oldest_started->lane->progress.waiting(Waiter::device, oldest_started->op.op, oldest_started->op.seq_or_peer);
}

void CommWatchdog::poll() {
    std::unique_lock lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    // Operations complete in the order they were enqueued on each stream: on each, the
    // oldest pending one is the one that may hang, and the ones behind it cannot start.
    std::vector<StreamId> blocked;
    const Watched* oldest_started = nullptr;
    for (auto it = watched_.begin(); it != watched_.end() && !failed_;) {
        Watched& w = *it;
        const StreamId stream = w.done.stream();
        if (std::find(blocked.begin(), blocked.end(), stream) != blocked.end()) {
            ++it;
            continue;
        }
        bool passed = false;
        std::string error;
        try {
            passed = order_.done(w.done);
            if (!passed) error = w.lane->collectives->async_error();
            if (!passed && !w.started && order_.done(w.ready)) {
                w.started = true;
                w.since = now;
                publish_arrival(*w.lane, w.op);
            }
        } catch (const Error& e) {
            error = e.what();
        }
        if (passed) {
            if (!w.started) publish_arrival(*w.lane, w.op);  // it ran between two polls
            it = watched_.erase(it);
            continue;
        }
        blocked.push_back(stream);
        if (w.started && !oldest_started) oldest_started = &w;
        const double waited = w.started ? std::chrono::duration<double>(now - w.since).count() : 0;
        if (error.empty() && waited <= timeout_seconds_) {
            ++it;
            continue;
        }
        const Watched hung = w;
        lock.unlock();
        const std::string what = operation_text(*hung.lane, hung.op);
        if (!error.empty()) {
            fail_with(cat(what, " failed on world rank ", rank_, ": ", error), hung, std::nullopt);
            return;
        }
        // The ranks that held it up are named by check(), on the thread that may call MPI.
        std::optional<HungOperation> to_diagnose;
        if (board_) to_diagnose = hung_operation(*hung.lane, hung.op, rank_);
        fail_with(cat(what, " did not complete within ", timeout_seconds_, " s (parallel.timeout_seconds) on world rank ", rank_, ": ",
                      board_ ? "" : "a rank of this group has died or hangs"),
                  hung, std::move(to_diagnose));
        return;
    }
    publish_wait(oldest_started);
}

void CommWatchdog::check() const {
    if (!failed_) return;
    std::unique_lock lock(mutex_);
    if (undiagnosed_) {
        const HungOperation hung = *undiagnosed_;
        undiagnosed_.reset();
        lock.unlock();
        const std::string why = board_->diagnose_hang(hung, std::min(timeout_seconds_, 10.0));
        lock.lock();
        failure_ += why;
    }
    fail(ErrorKind::runtime, failure_);
}

void CommWatchdog::start(std::chrono::milliseconds interval) {
    thread_ = std::thread([this, interval] {
        std::unique_lock lock(mutex_);
        while (!stop_signal_.wait_for(lock, interval, [this] { return stopping_; })) {
            lock.unlock();
            poll();
            lock.lock();
        }
    });
}

size_t CommWatchdog::watched() const {
    const std::lock_guard lock(mutex_);
    return watched_.size();
}

EventOrderedComm::EventOrderedComm(Comm& host, std::unique_ptr<StreamCollectives> collectives, std::unique_ptr<StreamCollectives> reverse_p2p,
                                   StreamOrder& order, CommWatchdog& watchdog)
    : host_(host), order_(order), watchdog_(watchdog) {
    const auto lane = [&](std::unique_ptr<StreamCollectives> c, const std::string& stream_name, CommLane kind) {
        StreamCollectives* raw = c.get();
        ProgressBoard* board = watchdog.board();
        return Lane{std::move(c), order.new_stream(stream_name), {this, kind, raw, board ? board->channel(host.name(), kind) : ProgressChannel()}};
    };
    main_ = lane(std::move(collectives), host.name(), CommLane::device);
    if (reverse_p2p) reverse_ = lane(std::move(reverse_p2p), host.name() + " toward lower ranks", CommLane::device_reverse);
}

template <class Run>
CommHandle EventOrderedComm::ordered(CommOp op, Lane& lane, Run run, int peer) {
    watchdog_.check();
    // The producer's writes (everything enqueued on the compute stream so far) come first.
    const StreamEvent ready = order_.record(order_.compute_stream());
    order_.wait(lane.stream, ready);
    run(*lane.collectives, lane.stream);
    StreamEvent done = order_.record(lane.stream);
    const uint64_t seq_or_peer = peer >= 0 ? static_cast<uint64_t>(world_rank(peer)) : lane.watched.progress.next_collective();
    watchdog_.watch(ready, done, lane.watched, {op, seq_or_peer});
    return CommHandle(std::make_unique<OrderedRequest>(order_, std::move(done)));
}

// Data moving up the ranks takes the main lane at both ends, data moving down the reverse one.
EventOrderedComm::Lane& EventOrderedComm::p2p_lane(int peer, bool sending) {
    const bool upward = sending ? peer > rank() : peer < rank();
    return upward || !reverse_.collectives ? main_ : reverse_;
}

CommHandle EventOrderedComm::all_reduce_async(const Tensor& data, ReduceOp op) {
    if (data.device() == Device::cpu) return host_.all_reduce_async(data, op);
    if (size() == 1) return {};
    return ordered(CommOp::all_reduce, main_, [&](StreamCollectives& c, StreamId s) { c.all_reduce(data, op, s); });
}

CommHandle EventOrderedComm::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
    if (in.device() == Device::cpu) return host_.reduce_scatter_async(out, in, op);
    // NCCL's reduce-scatter sums 16-bit floats in their dtype: both sums are the same there.
    if (op == ReduceOp::max) fail(ErrorKind::unsupported, "reduce_scatter with max in the ", describe(), ": it sums");
    return ordered(CommOp::reduce_scatter, main_, [&](StreamCollectives& c, StreamId s) { c.reduce_scatter(out, in, s); });
}

CommHandle EventOrderedComm::all_gather_async(const Tensor& data) {
    if (data.device() == Device::cpu) return host_.all_gather_async(data);
    if (size() == 1) return {};
    return ordered(CommOp::all_gather, main_, [&](StreamCollectives& c, StreamId s) { c.all_gather(data, s); });
}

CommHandle EventOrderedComm::all_to_all_async(const Tensor& out, const Tensor& in) {
    if (in.device() == Device::cpu) return host_.all_to_all_async(out, in);
    return ordered(CommOp::all_to_all, main_, [&](StreamCollectives& c, StreamId s) { c.all_to_all(out, in, s); });
}

CommHandle EventOrderedComm::all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) {
    if (in.device() == Device::cpu) return host_.all_to_all_v_async(out, recv_counts, in, send_counts);
    check_all_to_all_v(*this, out, recv_counts, in, send_counts);
    return ordered(CommOp::all_to_all, main_, [&](StreamCollectives& c, StreamId s) { c.all_to_all_v(out, recv_counts, in, send_counts, s); });
}

CommHandle EventOrderedComm::send_async(const Tensor& data, int peer) {
    if (data.device() == Device::cpu) return host_.send_async(data, peer);
    return ordered(CommOp::send, p2p_lane(peer, true), [&](StreamCollectives& c, StreamId s) { c.send(data, peer, s); }, peer);
}

void EventOrderedComm::recv(const Tensor& data, int peer) { recv_async(data, peer).wait(); }

CommHandle EventOrderedComm::recv_async(const Tensor& data, int peer) {
    if (data.device() == Device::cpu) return host_.recv_async(data, peer);
    return ordered(CommOp::recv, p2p_lane(peer, false), [&](StreamCollectives& c, StreamId s) { c.recv(data, peer, s); }, peer);
}

void EventOrderedComm::broadcast(const Tensor& data, int root) {
    if (data.device() == Device::cpu) return host_.broadcast(data, root);
    ordered(CommOp::broadcast, main_, [&](StreamCollectives& c, StreamId s) { c.broadcast(data, root, s); }).wait();
}

}  // namespace llmtrain

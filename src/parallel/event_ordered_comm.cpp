#include "parallel/event_ordered_comm.h"

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

CommWatchdog::CommWatchdog(StreamOrder& order, double timeout_seconds, int rank) : order_(order), timeout_seconds_(timeout_seconds), rank_(rank) {}

CommWatchdog::~CommWatchdog() {
    {
        const std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    stop_signal_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void CommWatchdog::watch(const StreamEvent& done, std::string what, StreamCollectives& collectives) {
    const std::lock_guard lock(mutex_);
    watched_.push_back({done, std::move(what), &collectives, std::chrono::steady_clock::now()});
}

void CommWatchdog::fail_with(std::string message, StreamCollectives& collectives) {
    {
        const std::lock_guard lock(mutex_);
        if (failed_) return;
        failure_ = std::move(message);
        watched_.clear();
        failed_ = true;
    }
    // Aborting ends the hung operation, so that a stream (and a host call waiting on one)
    // waiting for it goes on to the point where the failure is thrown.
    collectives.abort();
}

void CommWatchdog::poll() {
    std::unique_lock lock(mutex_);
    // Operations complete in the order they were enqueued on each stream; the oldest
    // pending one is the one that hangs.
    while (!watched_.empty() && !failed_) {
        Watched& oldest = watched_.front();
        bool passed = false;
        std::string error;
        try {
            passed = order_.done(oldest.done);
            if (!passed) error = oldest.collectives->async_error();
        } catch (const Error& e) {
            error = e.what();
        }
        if (passed) {
            watched_.pop_front();
            continue;
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest.since).count();
        if (error.empty() && waited <= timeout_seconds_) return;
        const std::string what = oldest.what;
        StreamCollectives& collectives = *oldest.collectives;
        lock.unlock();
        if (!error.empty()) fail_with(cat(what, " failed on world rank ", rank_, ": ", error), collectives);
        else fail_with(cat(what, " did not complete within ", timeout_seconds_, " s (parallel.timeout_seconds) on world rank ", rank_,
                           ": a rank of this group has died or hangs"), collectives);
        return;
    }
}

void CommWatchdog::check() const {
    if (!failed_) return;
    const std::lock_guard lock(mutex_);
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
    main_ = {std::move(collectives), order.new_stream(host.name())};
    if (reverse_p2p) reverse_ = {std::move(reverse_p2p), order.new_stream(host.name() + " toward lower ranks")};
}

template <class Run>
CommHandle EventOrderedComm::ordered(const std::string& op, Lane& lane, Run run) {
    watchdog_.check();
    // The producer's writes (everything enqueued on the compute stream so far) come first.
    order_.wait(lane.stream, order_.record(order_.compute_stream()));
    run(*lane.collectives, lane.stream);
    StreamEvent done = order_.record(lane.stream);
    watchdog_.watch(done, cat(op, " in the ", describe()), *lane.collectives);
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
    return ordered("all_reduce", main_, [&](StreamCollectives& c, StreamId s) { c.all_reduce(data, op, s); });
}

CommHandle EventOrderedComm::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
    if (in.device() == Device::cpu) return host_.reduce_scatter_async(out, in, op);
    // NCCL's reduce-scatter sums 16-bit floats in their dtype: both sums are the same there.
    if (op == ReduceOp::max) fail(ErrorKind::unsupported, "reduce_scatter with max in the ", describe(), ": it sums");
    return ordered("reduce_scatter", main_, [&](StreamCollectives& c, StreamId s) { c.reduce_scatter(out, in, s); });
}

CommHandle EventOrderedComm::all_gather_async(const Tensor& data) {
    if (data.device() == Device::cpu) return host_.all_gather_async(data);
    if (size() == 1) return {};
    return ordered("all_gather", main_, [&](StreamCollectives& c, StreamId s) { c.all_gather(data, s); });
}

CommHandle EventOrderedComm::all_to_all_async(const Tensor& out, const Tensor& in) {
    if (in.device() == Device::cpu) return host_.all_to_all_async(out, in);
    return ordered("all_to_all", main_, [&](StreamCollectives& c, StreamId s) { c.all_to_all(out, in, s); });
}

CommHandle EventOrderedComm::send_async(const Tensor& data, int peer) {
    if (data.device() == Device::cpu) return host_.send_async(data, peer);
    return ordered(cat("send to world rank ", world_rank(peer)), p2p_lane(peer, true),
                   [&](StreamCollectives& c, StreamId s) { c.send(data, peer, s); });
}

void EventOrderedComm::recv(const Tensor& data, int peer) { recv_async(data, peer).wait(); }

CommHandle EventOrderedComm::recv_async(const Tensor& data, int peer) {
    if (data.device() == Device::cpu) return host_.recv_async(data, peer);
    return ordered(cat("recv from world rank ", world_rank(peer)), p2p_lane(peer, false), [&](StreamCollectives& c, StreamId s) { c.recv(data, peer, s); });
}

void EventOrderedComm::broadcast(const Tensor& data, int root) {
    if (data.device() == Device::cpu) return host_.broadcast(data, root);
    ordered("broadcast", main_, [&](StreamCollectives& c, StreamId s) { c.broadcast(data, root, s); }).wait();
}

}  // namespace llmtrain

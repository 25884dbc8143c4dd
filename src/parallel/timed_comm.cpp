#include "parallel/timed_comm.h"

#include <chrono>

namespace llmtrain {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The wait of an asynchronous operation, added to its op's time when it ends.
class TimedRequest : public CommRequest {
public:
    TimedRequest(CommHandle inner, CommTimes& times, size_t group, CommOp op) : inner_(std::move(inner)), times_(times), group_(group), op_(op) {}
    void wait() override {
        const Clock::time_point start = Clock::now();
        inner_.wait();
        times_.add(group_, op_, seconds_since(start));
    }
    void progress() override { inner_.progress(); }
    bool done() override { return inner_.done(); }

private:
    CommHandle inner_;
    CommTimes& times_;
    size_t group_;
    CommOp op_;
};

class TimedComm : public Comm {
public:
    TimedComm(std::unique_ptr<Comm> inner, CommTimes& times) : inner_(std::move(inner)), times_(times), group_(times.add_group(inner_->name())) {}
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    int world_rank(int rank) const override { return inner_->world_rank(rank); }
    const std::string& name() const override { return inner_->name(); }

    CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override {
        return timed_async(CommOp::all_reduce, [&] { return inner_->all_reduce_async(data, op); });
    }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
        return timed_async(CommOp::reduce_scatter, [&] { return inner_->reduce_scatter_async(out, in, op); });
    }
    CommHandle all_gather_async(const Tensor& data) override {
        return timed_async(CommOp::all_gather, [&] { return inner_->all_gather_async(data); });
    }
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override {
        return timed_async(CommOp::all_to_all, [&] { return inner_->all_to_all_async(out, in); });
    }
    CommHandle all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) override {
        return timed_async(CommOp::all_to_all, [&] { return inner_->all_to_all_v_async(out, recv_counts, in, send_counts); });
    }
    CommHandle send_async(const Tensor& data, int peer) override {
        return timed_async(CommOp::send, [&] { return inner_->send_async(data, peer); });
    }
    void recv(const Tensor& data, int peer) override { timed(CommOp::recv, [&] { inner_->recv(data, peer); }); }
    CommHandle recv_async(const Tensor& data, int peer) override {
        return timed_async(CommOp::recv, [&] { return inner_->recv_async(data, peer); });
    }
    void broadcast(const Tensor& data, int root) override { timed(CommOp::broadcast, [&] { inner_->broadcast(data, root); }); }
    void barrier() override { timed(CommOp::barrier, [&] { inner_->barrier(); }); }

private:
    template <class Call>
    void timed(CommOp op, Call&& call) {
        const Clock::time_point start = Clock::now();
        call();
        times_.add(group_, op, seconds_since(start));
    }
    template <class Start>
    CommHandle timed_async(CommOp op, Start&& start_op) {
        const Clock::time_point start = Clock::now();
        CommHandle inner = start_op();
        times_.add(group_, op, seconds_since(start));
        return CommHandle(std::make_unique<TimedRequest>(std::move(inner), times_, group_, op));
    }

    std::unique_ptr<Comm> inner_;
    CommTimes& times_;
    size_t group_;
};

}  // namespace

size_t CommTimes::add_group(const std::string& name) {
    groups_.push_back({name, {}});
    return groups_.size() - 1;
}

double CommTimes::total_seconds() const {
    double total = 0;
    for (const Group& g : groups_)
        for (double s : g.seconds) total += s;
    return total;
}

std::unique_ptr<Comm> make_timed_comm(std::unique_ptr<Comm> inner, CommTimes& times) { return std::make_unique<TimedComm>(std::move(inner), times); }

void time_communication(ParallelContext& ctx, CommTimes& times) {
    for (std::unique_ptr<Comm>* group : {&ctx.world, &ctx.tp, &ctx.dp, &ctx.pp, &ctx.cp, &ctx.embedding})
        if (*group) *group = make_timed_comm(std::move(*group), times);
}

}  // namespace llmtrain

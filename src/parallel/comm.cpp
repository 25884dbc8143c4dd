// The parts of Comm that do not depend on the transport, and the group of one rank.
#include "parallel/comm.h"

#include <cstring>

namespace llmtrain {

CommHandle& CommHandle::operator=(CommHandle&& other) noexcept {
    if (this != &other) {
        if (request_) request_->wait();
        request_ = std::move(other.request_);
    }
    return *this;
}

CommHandle::~CommHandle() {
    // A destructor must not throw; a timed-out request already aborts the job from wait().
    if (request_) {
        try {
            request_->wait();
        } catch (...) {
        }
    }
}

void CommHandle::wait() {
    if (!request_) return;
    std::unique_ptr<CommRequest> request = std::move(request_);
    request->wait();
}

bool CommHandle::done() {
    if (!request_) return true;
    if (!request_->done()) return false;
    wait();
    return true;
}

double Comm::all_reduce_scalar(double value, ReduceOp op) {
    double buffer = value;
    all_reduce(Tensor(&buffer, DType::f64, {1}), op);
    return buffer;
}

std::string Comm::describe() const {
    std::string ranks;
    for (int r = 0; r < size(); ++r) ranks += cat(r ? ", " : "", world_rank(r));
    return cat(name(), " group (world ranks ", ranks, ")");
}

namespace {

class SelfComm final : public Comm {
public:
    explicit SelfComm(std::string name) : name_(std::move(name)) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    int world_rank(int) const override { return 0; }
    const std::string& name() const override { return name_; }

    CommHandle all_reduce_async(const Tensor&, ReduceOp) override { return {}; }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp) override {
        if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), out.bytes());
        return {};
    }
    CommHandle all_gather_async(const Tensor&) override { return {}; }
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override {
        if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), out.bytes());
        return {};
    }
    CommHandle send_async(const Tensor&, int) override { no_peer("send"); }
    void recv(const Tensor&, int) override { no_peer("recv"); }
    void broadcast(const Tensor&, int) override {}
    void barrier() override {}

private:
    [[noreturn]] void no_peer(const char* op) const { fail(ErrorKind::runtime, op, " within the ", name_, " group of one rank has no peer"); }
    std::string name_;
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(const std::string& name) { return std::make_unique<SelfComm>(name); }

}  // namespace llmtrain

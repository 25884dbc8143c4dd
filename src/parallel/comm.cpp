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

const char* comm_op_name(CommOp op) {
    static constexpr const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send", "recv", "broadcast", "barrier"};
    return names[static_cast<size_t>(op)];
}

double Comm::all_reduce_scalar(double value, ReduceOp op) {
    double buffer = value;
    all_reduce(Tensor(&buffer, DType::f64, {1}), op);
    return buffer;
}

// Runs of 4 or more ranks at one stride are written as their ends, so a group of 128 reads
// "world ranks 0-127" and a dp group across nodes "world ranks 0, 8, ..., 120 (stride 8)".
std::string describe_world_ranks(const std::vector<int>& ranks) {
    constexpr size_t kShortestRun = 4;
    std::string text;
    for (size_t begin = 0; begin < ranks.size();) {
        size_t end = begin + 1;
        const int stride = end < ranks.size() ? ranks[end] - ranks[begin] : 0;
        while (stride > 0 && end < ranks.size() && ranks[end] - ranks[end - 1] == stride) ++end;
        if (text.size()) text += ", ";
        if (end - begin < kShortestRun) {
            text += std::to_string(ranks[begin]);
            ++begin;
            continue;
        }
        text += stride == 1 ? cat(ranks[begin], "-", ranks[end - 1]) : cat(ranks[begin], ", ", ranks[begin + 1], ", ..., ", ranks[end - 1], " (stride ", stride, ")");
        begin = end;
    }
    return text;
}

const std::string& Comm::describe() const {
    // Built once: an operation's message names its group, and a group of 128 is long to write.
    std::call_once(described_, [this] {
        std::vector<int> ranks(static_cast<size_t>(size()));
        for (int r = 0; r < size(); ++r) ranks[static_cast<size_t>(r)] = world_rank(r);
        description_ = cat(name(), " group (world ranks ", describe_world_ranks(ranks), ")");
    });
    return description_;
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

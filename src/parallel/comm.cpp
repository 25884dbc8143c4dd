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

std::vector<int64_t> all_to_all_v_offsets(const Comm& group, const Tensor& t, std::span<const int64_t> counts, const char* side) {
    if (static_cast<int>(counts.size()) != group.size())
        fail(ErrorKind::shape, "all_to_all_v in the ", group.describe(), ": ", counts.size(), " ", side, " counts for ", group.size(), " ranks");
    std::vector<int64_t> offsets(counts.size() + 1, 0);
    for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] < 0) fail(ErrorKind::shape, "all_to_all_v in the ", group.describe(), ": ", side, " count ", counts[r], " for rank ", r, " is negative");
        offsets[r + 1] = offsets[r] + counts[r];
    }
    if (offsets.back() != t.numel())
        fail(ErrorKind::shape, "all_to_all_v in the ", group.describe(), ": the ", side, " counts sum to ", offsets.back(), " elements, the ", side,
             " tensor holds ", t.numel());
    return offsets;
}

AllToAllVOffsets check_all_to_all_v(const Comm& group, const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                                    std::span<const int64_t> send_counts) {
    if (out.dtype() != in.dtype())
        fail(ErrorKind::shape, "all_to_all_v in the ", group.describe(), ": sends ", dtype_name(in.dtype()), ", receives into ", dtype_name(out.dtype()));
    AllToAllVOffsets offsets;
    offsets.received_at = all_to_all_v_offsets(group, out, recv_counts, "receive");
    offsets.sent_at = all_to_all_v_offsets(group, in, send_counts, "send");
    const auto self = static_cast<size_t>(group.rank());
    if (recv_counts[self] != send_counts[self])
        fail(ErrorKind::shape, "all_to_all_v in the ", group.describe(), ": this rank sends itself ", send_counts[self], " elements and receives ",
             recv_counts[self], " from itself");
    return offsets;
}

Tensor flat_part(const Tensor& t, int64_t offset, int64_t count) {
    return Tensor(static_cast<char*>(t.raw()) + static_cast<size_t>(offset) * dtype_size(t.dtype()), t.dtype(), {count}, t.device());
}

namespace {

// The handles of an operation made of several: waiting waits for each.
class AllOf final : public CommRequest {
public:
    explicit AllOf(std::vector<CommHandle> parts) : parts_(std::move(parts)) {}
    void wait() override {
        for (CommHandle& part : parts_) part.wait();
    }
    void progress() override {
        for (CommHandle& part : parts_) part.progress();
    }
    bool done() override {
        bool all = true;
        for (CommHandle& part : parts_) all = part.done() && all;
        return all;
    }

private:
    std::vector<CommHandle> parts_;
};

}  // namespace

// Sends first (a receive may be posted only when called, Comm::recv_async's default), then
// the receives; this rank's own chunk is copied.
CommHandle Comm::all_to_all_v_async(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts) {
    const auto [sent_at, received_at] = check_all_to_all_v(*this, out, recv_counts, in, send_counts);
    if (in.device() != Device::cpu || out.device() != Device::cpu)
        fail(ErrorKind::unsupported, "all_to_all_v in the ", describe(), " over point-to-point transfers takes host memory; ", device_name(in.device()),
             " memory goes through the device's collectives");
    std::vector<CommHandle> parts;
    for (int r = 0; r < size(); ++r) {
        const auto i = static_cast<size_t>(r);
        if (r != rank() && send_counts[i] > 0) parts.push_back(send_async(flat_part(in, sent_at[i], send_counts[i]), r));
    }
    for (int r = 0; r < size(); ++r) {
        const auto i = static_cast<size_t>(r);
        if (r != rank() && recv_counts[i] > 0) parts.push_back(recv_async(flat_part(out, received_at[i], recv_counts[i]), r));
    }
    const auto self = static_cast<size_t>(rank());
    if (send_counts[self] > 0) {
        const Tensor own = flat_part(in, sent_at[self], send_counts[self]);
        std::memmove(flat_part(out, received_at[self], send_counts[self]).raw(), own.raw(), own.bytes());
    }
    return CommHandle(std::make_unique<AllOf>(std::move(parts)));
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

#include "support/stream_graph.h"

#include <cstring>

#include <algorithm>

namespace llmtrain::test {

namespace {

// The same memory as host memory: the stand-ins' "device" tensors live in host memory.
Tensor on_host(const Tensor& t) { return Tensor(t.raw(), t.dtype(), t.shape(), Device::cpu); }

}  // namespace

RecordingStreamOrder::RecordingStreamOrder() {
    names_.push_back("compute");
    clocks_.push_back(std::vector<uint64_t>(1, 0));
}

std::vector<uint64_t>& RecordingStreamOrder::clock_of(StreamId stream) {
    std::vector<uint64_t>& clock = clocks_.at(static_cast<size_t>(stream));
    clock.resize(names_.size(), 0);
    return clock;
}

StreamId RecordingStreamOrder::new_stream(const std::string& name) {
    const std::lock_guard lock(mutex_);
    names_.push_back(name);
    clocks_.emplace_back(names_.size(), 0);
    return static_cast<StreamId>(names_.size() - 1);
}

StreamEvent RecordingStreamOrder::record(StreamId stream) {
    const std::lock_guard lock(mutex_);
    std::vector<uint64_t>& clock = clock_of(stream);
    ++clock[static_cast<size_t>(stream)];
    events_.push_back(clock);
    const bool hangs = (communication_hangs_ && stream != compute_stream()) ||
                       (static_cast<size_t>(stream) < hanging_.size() && hanging_[static_cast<size_t>(stream)]);
    hung_.push_back(hangs);
    event_streams_.push_back(stream);
    return StreamEvent(events_.size(), stream, nullptr);
}

void RecordingStreamOrder::hang() {
    const std::lock_guard lock(mutex_);
    communication_hangs_ = true;
}

void RecordingStreamOrder::hang(StreamId stream) {
    const std::lock_guard lock(mutex_);
    if (hanging_.size() <= static_cast<size_t>(stream)) hanging_.resize(static_cast<size_t>(stream) + 1, false);
    hanging_[static_cast<size_t>(stream)] = true;
}

void RecordingStreamOrder::resume(StreamId stream, size_t count) {
    const std::lock_guard lock(mutex_);
    if (count == SIZE_MAX && static_cast<size_t>(stream) < hanging_.size()) hanging_[static_cast<size_t>(stream)] = false;
    for (size_t e = 0; e < hung_.size() && count > 0; ++e)
        if (event_streams_[e] == stream && hung_[e]) hung_[e] = false, --count;
}

void RecordingStreamOrder::wait(StreamId stream, const StreamEvent& event) {
    const std::lock_guard lock(mutex_);
    std::vector<uint64_t>& clock = clock_of(stream);
    const std::vector<uint64_t>& seen = events_.at(event.id() - 1);
    for (size_t i = 0; i < seen.size(); ++i) clock[i] = std::max(clock[i], seen[i]);
}

bool RecordingStreamOrder::done(const StreamEvent& event) {
    const std::lock_guard lock(mutex_);
    return !hung_.at(event.id() - 1);
}

void RecordingStreamOrder::work(StreamId stream, const std::string& name, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes) {
    const std::lock_guard lock(mutex_);
    std::vector<uint64_t>& clock = clock_of(stream);
    ++clock[static_cast<size_t>(stream)];
    const auto ranges = [](const std::vector<Tensor>& tensors) {
        std::vector<Range> out;
        for (const Tensor& t : tensors) {
            const auto begin = reinterpret_cast<uintptr_t>(t.raw());
            out.push_back({begin, begin + t.bytes()});
        }
        return out;
    };
    work_.push_back({stream, name, ranges(reads), ranges(writes), clock});
}

// a was issued before b. Same stream: in order. Otherwise b's stream must have waited on an
// event recorded on a's stream after a.
bool RecordingStreamOrder::happens_before(const Work& a, const Work& b) const {
    const auto s = static_cast<size_t>(a.stream);
    return s < b.clock.size() && a.clock[s] <= b.clock[s];
}

std::vector<std::string> RecordingStreamOrder::races() const {
    const std::lock_guard lock(mutex_);
    const auto overlap = [](const std::vector<Range>& x, const std::vector<Range>& y) {
        for (const Range& p : x)
            for (const Range& q : y)
                if (std::max(p.begin, q.begin) < std::min(p.end, q.end)) return true;
        return false;
    };
    std::vector<std::string> found;
    for (size_t j = 0; j < work_.size(); ++j)
        for (size_t i = 0; i < j; ++i) {
            const Work &a = work_[i], &b = work_[j];
            if (a.stream == b.stream || happens_before(a, b)) continue;
            const bool conflict = overlap(a.writes, b.reads) || overlap(a.writes, b.writes) || overlap(a.reads, b.writes);
            if (conflict)
                found.push_back(cat(a.name, " on ", names_[static_cast<size_t>(a.stream)], " and ", b.name, " on ",
                                    names_[static_cast<size_t>(b.stream)], " touch the same bytes, one writing, unordered"));
        }
    return found;
}

std::vector<std::string> RecordingStreamOrder::work_on(StreamId stream) const {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const Work& w : work_)
        if (w.stream == stream) out.push_back(w.name);
    return out;
}

std::vector<std::string> RecordingStreamOrder::stream_names() const {
    const std::lock_guard lock(mutex_);
    return names_;
}

void RecordedCollectives::all_reduce(const Tensor& data, ReduceOp op, StreamId stream) {
    order_.work(stream, named("all_reduce"), {data}, {data});
    host_.all_reduce(on_host(data), op);
}

void RecordedCollectives::reduce_scatter(const Tensor& out, const Tensor& in, StreamId stream) {
    order_.work(stream, named("reduce_scatter"), {in}, {out});
    host_.reduce_scatter(on_host(out), on_host(in));
}

void RecordedCollectives::all_gather(const Tensor& data, StreamId stream) {
    order_.work(stream, named("all_gather"), {data}, {data});
    host_.all_gather(on_host(data));
}

void RecordedCollectives::all_to_all(const Tensor& out, const Tensor& in, StreamId stream) {
    order_.work(stream, named("all_to_all"), {in}, {out});
    host_.all_to_all(on_host(out), on_host(in));
}

void RecordedCollectives::all_to_all_v(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts,
                                       StreamId stream) {
    order_.work(stream, named("all_to_all_v"), {in}, {out});
    host_.all_to_all_v(on_host(out), recv_counts, on_host(in), send_counts);
}

// The bytes leave at once, from a copy; the transfer completes when the peer receives. On a
// GPU a send and the opposite receive run on streams of their own, so two ranks may each
// send to the other before either receives (context parallelism's ring): a blocking send
// here would wait for a receive that its peer issues only after its own send.
void RecordedCollectives::send(const Tensor& data, int peer, StreamId stream) {
    order_.work(stream, named("send"), {data}, {});
    auto copy = std::make_unique<OwnedTensor>(data.dtype(), data.shape());
    if (data.numel() > 0) std::memcpy(copy->view().raw(), data.raw(), data.bytes());
    CommHandle sending = host_.send_async(copy->view(), peer);
    sends_.push_back({std::move(copy), std::move(sending)});
    // Every later send is posted already: the oldest completes as soon as its peer gets there.
    if (sends_.size() > 16) {
        sends_.front().handle.wait();
        sends_.erase(sends_.begin());
    }
}

RecordedCollectives::~RecordedCollectives() {
    for (PendingSend& s : sends_) s.handle.wait();
}

void RecordedCollectives::recv(const Tensor& data, int peer, StreamId stream) {
    order_.work(stream, named("recv"), {}, {data});
    host_.recv(on_host(data), peer);
}

void RecordedCollectives::broadcast(const Tensor& data, int root, StreamId stream) {
    order_.work(stream, named("broadcast"), {data}, {data});
    host_.broadcast(on_host(data), root);
}

namespace {

class IdleGroup final : public Comm {
public:
    IdleGroup(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int world_rank(int rank) const override { return rank; }
    const std::string& name() const override { return name_; }
    CommHandle all_reduce_async(const Tensor&, ReduceOp) override { return {}; }
    CommHandle reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return {}; }
    CommHandle all_gather_async(const Tensor&) override { return {}; }
    CommHandle all_to_all_async(const Tensor&, const Tensor&) override { return {}; }
    CommHandle send_async(const Tensor&, int) override { return {}; }
    void recv(const Tensor&, int) override {}
    void broadcast(const Tensor&, int) override {}
    void barrier() override {}

private:
    std::string name_;
    int rank_, size_;
};

}  // namespace

std::unique_ptr<Comm> make_idle_group(const std::string& name, int rank, int size) { return std::make_unique<IdleGroup>(name, rank, size); }

}  // namespace llmtrain::test

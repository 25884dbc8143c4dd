// Stand-ins for the event-ordered communication path, on machines without a GPU:
//
// RecordingStreamOrder runs nothing; it records, in the order the host issues them, every
// piece of work on its streams (with the bytes it reads and writes), every event recorded
// and every wait, and keeps a vector clock per stream: work A happens before work B when B's
// stream has, through a chain of waits on events, caught up with a point after A. races()
// lists every pair of accesses to the same bytes from different streams, one of them a
// write, that no such chain orders: a collective reading gradients backward may still be
// writing, an optimizer reading a reduction that may not have finished, a kernel
// overwriting a buffer a collective may still be reading.
//
// RecordedCollectives performs each collective at once over a host Comm (MPI in the
// parallel tests, a do-nothing group in the unit tests) and records it as work on its
// stream. The CPU stand-in of the CUDA backend also runs each op when it is issued, so
// running at enqueue time is the order the streams would run in.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/stream_collectives.h"
#include "parallel/stream_order.h"

namespace llmtrain::test {

class RecordingStreamOrder final : public StreamOrder {
public:
    RecordingStreamOrder();
    StreamId compute_stream() const override { return 0; }
    StreamId new_stream(const std::string& name) override;
    void* native_stream(StreamId) const override { return nullptr; }
    StreamEvent record(StreamId stream) override;
    void wait(StreamId stream, const StreamEvent& event) override;
    // Whether the event is passed: always, but for events recorded on a hanging stream.
    bool done(const StreamEvent& event) override;

    // Work on `stream` that reads and writes these tensors' bytes (a kernel on the compute
    // stream; a collective on a communication stream).
    void work(StreamId stream, const std::string& name, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes);
    // From now on, events recorded on the communication streams are never passed (a
    // collective that hangs); the compute stream goes on.
    void hang();
    // From now on, events recorded on `stream` are not passed until resume(stream) (a stream
    // stalled behind long work).
    void hang(StreamId stream);
    // The oldest `count` hung events of `stream` are passed; with all of them passed, it
    // hangs no more.
    void resume(StreamId stream, size_t count = SIZE_MAX);

    // "<work> on <stream> writes bytes that <work> on <stream> reads, unordered", per race.
    std::vector<std::string> races() const;
    // The names of the work on `stream`, in order.
    std::vector<std::string> work_on(StreamId stream) const;
    std::vector<std::string> stream_names() const;

private:
    struct Range {
        uintptr_t begin, end;
    };
    struct Work {
        StreamId stream;
        std::string name;
        std::vector<Range> reads, writes;
        std::vector<uint64_t> clock;  // its stream's vector clock when it was issued
    };
    std::vector<uint64_t>& clock_of(StreamId stream);
    bool happens_before(const Work& a, const Work& b) const;

    mutable std::mutex mutex_;
    std::vector<std::string> names_;
    std::vector<std::vector<uint64_t>> clocks_;   // per stream
    std::vector<std::vector<uint64_t>> events_;   // per event id - 1: the clock it carries
    std::vector<bool> hung_;                      // per event id - 1
    std::vector<StreamId> event_streams_;         // per event id - 1
    std::vector<Work> work_;
    std::vector<bool> hanging_;                   // per stream
    bool communication_hangs_ = false;
};

class RecordedCollectives final : public StreamCollectives {
public:
    RecordedCollectives(Comm& host, RecordingStreamOrder& order) : host_(host), order_(order) {}
    ~RecordedCollectives() override;
    void all_reduce(const Tensor& data, ReduceOp op, StreamId stream) override;
    void reduce_scatter(const Tensor& out, const Tensor& in, StreamId stream) override;
    void all_gather(const Tensor& data, StreamId stream) override;
    void all_to_all(const Tensor& out, const Tensor& in, StreamId stream) override;
    void all_to_all_v(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in, std::span<const int64_t> send_counts, StreamId stream) override;
    void send(const Tensor& data, int peer, StreamId stream) override;
    void recv(const Tensor& data, int peer, StreamId stream) override;
    void broadcast(const Tensor& data, int root, StreamId stream) override;
    std::string async_error() override { return ""; }
    void abort() override { aborted_ = true; }
    bool aborted() const { return aborted_; }

private:
    std::string named(const char* op) const { return cat(op, " (", host_.name(), ")"); }
    Comm& host_;
    RecordingStreamOrder& order_;
    std::atomic<bool> aborted_{false};
    struct PendingSend {
        std::unique_ptr<OwnedTensor> bytes;
        CommHandle handle;
    };
    std::vector<PendingSend> sends_;  // completed as the peers receive; waited for when destroyed
};

// A group of `size` ranks seen from rank `rank` whose operations do nothing: the unit tests
// look at the order of work, not at the values.
std::unique_ptr<Comm> make_idle_group(const std::string& name, int rank, int size);

}  // namespace llmtrain::test

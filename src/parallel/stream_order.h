// StreamOrder: how work on one device is ordered without the host waiting for it. A device
// runs queues of work (streams); an event marks the point a stream has reached when it is
// recorded; a stream can be made to wait for an event before it runs what is enqueued on it
// afterwards; the host can ask, without blocking, whether an event has been passed.
//
// Communication runs on its own stream, beside the compute stream, and is ordered against it
// by events only (EventOrderedComm): a collective waits for the event of the work that
// produced its input, and the compute stream waits for the collective's event before the
// work that reads its output. Implementations: CUDA (streams and cudaEvent_t), and in the
// tests a stand-in that records the graph of streams, events and waits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace llmtrain {

using StreamId = int;

// A recorded event. Copies share it; the native handle is freed with its last copy.
class StreamEvent {
public:
    StreamEvent() = default;
    StreamEvent(uint64_t id, StreamId stream, std::shared_ptr<void> native) : id_(id), stream_(stream), native_(std::move(native)) {}
    uint64_t id() const { return id_; }
    StreamId stream() const { return stream_; }   // the stream it was recorded on
    void* native() const { return native_.get(); }
    bool empty() const { return id_ == 0; }

private:
    uint64_t id_ = 0;  // 0: no event
    StreamId stream_ = -1;
    std::shared_ptr<void> native_;
};

class StreamOrder {
public:
    virtual ~StreamOrder() = default;
    // The stream the backend computes on.
    virtual StreamId compute_stream() const = 0;
    // A new stream for communication; name is for messages and records.
    virtual StreamId new_stream(const std::string& name) = 0;
    // The native handle (cudaStream_t) of a stream, for the library that enqueues on it.
    virtual void* native_stream(StreamId stream) const = 0;
    // An event at the current end of `stream`'s work.
    virtual StreamEvent record(StreamId stream) = 0;
    // Work enqueued on `stream` from now on runs only after `event` has been passed.
    virtual void wait(StreamId stream, const StreamEvent& event) = 0;
    // Whether the work before `event` has completed. Never blocks; callable from any thread.
    virtual bool done(const StreamEvent& event) = 0;
};

// The CUDA streams and events of the current device; compute_stream is the backend's
// cudaStream_t (Backend::device_stream). In a build without CUDA this refuses.
std::unique_ptr<StreamOrder> make_cuda_stream_order(void* compute_stream);

}  // namespace llmtrain

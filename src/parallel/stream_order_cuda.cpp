// StreamOrder over CUDA streams and events (see stream_order.h). Communication streams are
// non-blocking: they do not synchronize with the legacy default stream, so MPI staging
// copies or other libraries' default-stream work never serialize them with compute.
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "core/error.h"
#include "parallel/stream_order.h"

namespace llmtrain {

namespace {

void check_cuda(cudaError_t code, const char* what) {
    if (code != cudaSuccess) fail(ErrorKind::runtime, what, ": ", cudaGetErrorString(code));
}

// Every event-ordered collective records two events (its input ready, its completion): tens
// of thousands a minute on a large model. Creating and destroying each takes the driver's
// lock; a released event comes back here instead, and is recorded again. The pool is shared
// with the events' deleters, so an event outliving its StreamOrder still finds it.
class EventPool {
public:
    ~EventPool() {
        for (cudaEvent_t event : free_) cudaEventDestroy(event);
    }
    cudaEvent_t take() {
        {
            const std::lock_guard lock(mutex_);
            if (!free_.empty()) {
                cudaEvent_t event = free_.back();
                free_.pop_back();
                return event;
            }
        }
        cudaEvent_t event = nullptr;
        check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
        return event;
    }
    // From any thread: the watchdog drops the events of the operations it saw complete.
    void give_back(cudaEvent_t event) {
        const std::lock_guard lock(mutex_);
        free_.push_back(event);
    }

private:
    std::mutex mutex_;
    std::vector<cudaEvent_t> free_;
};

class CudaStreamOrder final : public StreamOrder {
public:
    explicit CudaStreamOrder(cudaStream_t compute) : streams_{compute} { check_cuda(cudaGetDevice(&device_), "cudaGetDevice"); }
    ~CudaStreamOrder() override {
        for (size_t i = 1; i < streams_.size(); ++i) cudaStreamDestroy(streams_[i]);
    }

    StreamId compute_stream() const override { return 0; }
    StreamId new_stream(const std::string&) override {
        cudaStream_t stream = nullptr;
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags for communication");
        streams_.push_back(stream);
        return static_cast<StreamId>(streams_.size() - 1);
    }
    void* native_stream(StreamId stream) const override { return streams_.at(static_cast<size_t>(stream)); }
    StreamEvent record(StreamId stream) override {
        cudaEvent_t event = events_->take();
        std::shared_ptr<void> owned(event, [pool = events_](void* e) { pool->give_back(static_cast<cudaEvent_t>(e)); });
        check_cuda(cudaEventRecord(event, streams_.at(static_cast<size_t>(stream))), "cudaEventRecord");
        return StreamEvent(++recorded_, stream, std::move(owned));
    }
    void wait(StreamId stream, const StreamEvent& event) override {
        check_cuda(cudaStreamWaitEvent(streams_.at(static_cast<size_t>(stream)), static_cast<cudaEvent_t>(event.native()), 0), "cudaStreamWaitEvent");
    }
    bool done(const StreamEvent& event) override {
        // The watchdog asks from a thread of its own, whose current device is 0 until set.
        check_cuda(cudaSetDevice(device_), "cudaSetDevice in the communication watchdog");
        const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event.native()));
        if (state == cudaErrorNotReady) return false;
        check_cuda(state, "cudaEventQuery of a communication event");
        return true;
    }

private:
    int device_ = 0;
    std::vector<cudaStream_t> streams_;  // [0]: the backend's compute stream (not ours to destroy)
    std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
    uint64_t recorded_ = 0;
};

}  // namespace

std::unique_ptr<StreamOrder> make_cuda_stream_order(void* compute_stream) {
    if (!compute_stream) fail(ErrorKind::unsupported, "event-ordered communication needs the CUDA backend's stream; this backend has none");
    return std::make_unique<CudaStreamOrder>(static_cast<cudaStream_t>(compute_stream));
}

}  // namespace llmtrain

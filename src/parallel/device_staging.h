// How MPI, which carries host memory, reaches GPU memory: a GPU tensor is staged through a
// host buffer (copied out before the operation, back after it). The buffers come from a
// StagingPool: page-locked (cudaMallocHost) where CUDA is built, allocated once and reused
// by every later operation, grown when a larger one is needed, instead of an allocation per
// transfer. In a build without CUDA there are no GPU tensors and the CUDA staging refuses.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace llmtrain {

class DeviceStaging {
public:
    virtual ~DeviceStaging() = default;
    virtual void to_host(void* host, const void* device, size_t bytes) = 0;
    virtual void to_device(void* device, const void* host, size_t bytes) = 0;
    // Host memory for staging (page-locked where the device needs it for fast copies).
    virtual std::shared_ptr<void> allocate_host(size_t bytes) = 0;
};

// CUDA's copies (which follow the compute stream: it is a blocking stream, and the copies
// run on the legacy default stream) and cudaMallocHost buffers.
std::shared_ptr<DeviceStaging> cuda_device_staging();

class StagingPool;

// A staging buffer held for one operation; it goes back to its pool when destroyed.
class StagingBuffer {
public:
    StagingBuffer() = default;
    StagingBuffer(StagingPool* pool, size_t slot, void* data) : pool_(pool), slot_(slot), data_(data) {}
    StagingBuffer(StagingBuffer&& other) noexcept { *this = std::move(other); }
    StagingBuffer& operator=(StagingBuffer&& other) noexcept;
    ~StagingBuffer();
    void* data() const { return data_; }

private:
    StagingPool* pool_ = nullptr;
    size_t slot_ = 0;
    void* data_ = nullptr;
};

class StagingPool {
public:
    using Allocate = std::function<std::shared_ptr<void>(size_t bytes)>;
    explicit StagingPool(Allocate allocate) : allocate_(std::move(allocate)) {}
    // A free buffer of at least `bytes`: the smallest free one that fits, else a free one
    // grown (to twice its size at least, so that growth stops soon), else a new one.
    StagingBuffer take(size_t bytes);
    size_t buffers() const { return slots_.size(); }

private:
    friend class StagingBuffer;
    void give_back(size_t slot);
    struct Slot {
        std::shared_ptr<void> memory;
        size_t bytes = 0;
        bool busy = false;
    };
    Allocate allocate_;
    std::mutex mutex_;
    std::vector<Slot> slots_;
};

}  // namespace llmtrain

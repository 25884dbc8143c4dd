// A DeviceStaging for the CPU stand-in of the CUDA backend, whose "device" memory is host
// memory: copies are memcpy, and every staging buffer allocated is counted, so that tests
// can see the pool reuse its buffers instead of allocating per transfer.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "parallel/device_staging.h"

namespace llmtrain::test {

class HostStaging final : public DeviceStaging {
public:
    void to_host(void* host, const void* device, size_t bytes) override { std::memcpy(host, device, bytes); }
    void to_device(void* device, const void* host, size_t bytes) override { std::memcpy(device, host, bytes); }
    std::shared_ptr<void> allocate_host(size_t bytes) override {
        ++allocations_;
        return std::shared_ptr<void>(std::malloc(bytes), [](void* p) { std::free(p); });
    }
    int allocations() const { return allocations_; }

private:
    std::atomic<int> allocations_{0};
};

}  // namespace llmtrain::test

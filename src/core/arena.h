// Arena: all activation memory of a step is planned up front, then allocated once.
// Plan with reserve(), call allocate() once, then fetch views with tensor(). Nothing is
// allocated in the step loop, and the total is known (and printed) before training starts.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmtrain {

class Arena {
public:
    using Slot = size_t;
    static constexpr size_t alignment_bytes = 256;  // vector loads and cuBLASLt need 16; 256 keeps slots on their own cache lines

    // Reserves a tensor; returns a handle valid after allocate().
    Slot reserve(std::string name, DType dtype, Shape shape);
    // Allocates every slot at once, in host memory or through a device's allocator.
    void allocate(Device device = Device::cpu, const MemoryAllocator& allocate = allocate_host_memory);
    bool allocated() const { return allocated_; }
    Tensor tensor(Slot slot) const;
    size_t total_bytes() const { return total_bytes_; }
    size_t slot_count() const { return slots_.size(); }

private:
    struct Entry {
        std::string name;
        DType dtype;
        Shape shape;
        size_t offset_bytes;
    };
    std::vector<Entry> slots_;
    size_t total_bytes_ = 0;
    bool allocated_ = false;
    Memory memory_;
    Device device_ = Device::cpu;
};

}  // namespace llmtrain

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
    static constexpr size_t alignment_bytes = 64;

    // Reserves a tensor; returns a handle valid after allocate().
    Slot reserve(std::string name, DType dtype, Shape shape);
    void allocate();
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
    HostBuffer buffer_;
};

}  // namespace llmtrain

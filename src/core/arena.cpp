#include "core/arena.h"

namespace llmtrain {

Arena::Slot Arena::reserve(std::string name, DType dtype, Shape shape) {
    if (allocated_) fail(ErrorKind::runtime, "arena: cannot reserve '", name, "' after allocation");
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    slots_.push_back({std::move(name), dtype, shape, total_bytes_});
    total_bytes_ += (bytes + alignment_bytes - 1) / alignment_bytes * alignment_bytes;
    return slots_.size() - 1;
}

void Arena::allocate(Device device, const MemoryAllocator& allocate) {
    if (allocated_) fail(ErrorKind::runtime, "arena: allocated twice");
    memory_ = allocate(total_bytes_);
    device_ = device;
    allocated_ = true;
}

Tensor Arena::tensor(Slot slot) const {
    if (!allocated_) fail(ErrorKind::runtime, "arena: tensor requested before allocation");
    if (slot >= slots_.size()) fail(ErrorKind::runtime, "arena: no slot ", slot);
    const Entry& e = slots_[slot];
    return Tensor(static_cast<char*>(memory_.get()) + e.offset_bytes, e.dtype, e.shape, device_);
}

}  // namespace llmtrain

#include "parallel/device_staging.h"

#include <algorithm>
#include <utility>

namespace llmtrain {

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept {
    if (this != &other) {
        if (pool_) pool_->give_back(slot_);
        pool_ = std::exchange(other.pool_, nullptr);
        slot_ = other.slot_;
        data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
}

StagingBuffer::~StagingBuffer() {
    if (pool_) pool_->give_back(slot_);
}

StagingBuffer StagingPool::take(size_t bytes) {
    const std::lock_guard lock(mutex_);
    const size_t none = slots_.size();
    size_t fitting = none, largest = none;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot& s = slots_[i];
        if (s.busy) continue;
        if (s.bytes >= bytes && (fitting == none || s.bytes < slots_[fitting].bytes)) fitting = i;
        if (largest == none || s.bytes > slots_[largest].bytes) largest = i;
    }
    const size_t best = fitting != none ? fitting : largest;
    if (best == slots_.size()) slots_.push_back({});
    Slot& slot = slots_[best];
    if (slot.bytes < bytes) {
        const size_t grown = std::max(bytes, 2 * slot.bytes);
        slot.memory.reset();
        slot.memory = allocate_(grown);
        slot.bytes = grown;
    }
    slot.busy = true;
    return StagingBuffer(this, best, slot.memory.get());
}

void StagingPool::give_back(size_t slot) {
    const std::lock_guard lock(mutex_);
    slots_[slot].busy = false;
}

}  // namespace llmtrain

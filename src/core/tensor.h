// Tensor: a non-owning, typed, shaped view of contiguous memory on one device.
// Memory is owned by a Buffer or an Arena; ops receive views and check shapes themselves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace llmtrain {

// Row-major shape of up to 4 dimensions.
struct Shape {
    static constexpr int max_rank = 4;
    std::array<int64_t, max_rank> dims{};
    int rank = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> list);

    int64_t operator[](int axis) const { return dims[static_cast<size_t>(axis)]; }
    int64_t numel() const;
    // Product of every dimension but the last: the number of rows of a [..., C] tensor.
    int64_t rows() const { return rank == 0 ? 1 : numel() / dims[static_cast<size_t>(rank - 1)]; }
    int64_t cols() const { return rank == 0 ? 1 : dims[static_cast<size_t>(rank - 1)]; }
    bool operator==(const Shape& other) const;
    bool operator!=(const Shape& other) const { return !(*this == other); }
    std::string str() const;  // "[4, 128]"
};

class Tensor {
public:
    Tensor() = default;
    Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu)
        : data_(data), dtype_(dtype), device_(device), shape_(shape) {}

    void* raw() const { return data_; }
    DType dtype() const { return dtype_; }
    Device device() const { return device_; }
    const Shape& shape() const { return shape_; }
    int rank() const { return shape_.rank; }
    int64_t dim(int axis) const { return shape_[axis]; }
    int64_t numel() const { return shape_.numel(); }
    int64_t rows() const { return shape_.rows(); }
    int64_t cols() const { return shape_.cols(); }
    size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
    bool empty() const { return data_ == nullptr; }

    // Typed pointer; throws a shape error if T is not this tensor's element type.
    template <class T>
    T* data() const {
        if (dtype_of<T>() != dtype_) fail(ErrorKind::shape, "tensor of ", dtype_name(dtype_), " accessed as ", dtype_name(dtype_of<T>()));
        return static_cast<T*>(data_);
    }

    // Same memory, another shape with the same element count.
    Tensor reshape(Shape shape) const;
    // Rows [begin, begin + count) along the first axis.
    Tensor slice_rows(int64_t begin, int64_t count) const;

private:
    void* data_ = nullptr;
    DType dtype_ = DType::f32;
    Device device_ = Device::cpu;
    Shape shape_;
};

// Owning, 64-byte aligned, zero-initialized host memory.
class HostBuffer {
public:
    HostBuffer() = default;
    explicit HostBuffer(size_t bytes);
    void* data() const { return data_.get(); }
    size_t bytes() const { return bytes_; }

private:
    struct FreeDeleter { void operator()(void* p) const; };
    std::unique_ptr<void, FreeDeleter> data_;
    size_t bytes_ = 0;
};

// Owning memory on one device, as an allocator returns it (zeroed; freed with its last owner).
using Memory = std::shared_ptr<void>;
// Allocates `bytes` on some device: host memory (allocate_host_memory) or a backend's.
using MemoryAllocator = std::function<Memory(size_t bytes)>;
// Zeroed, 256-byte aligned host memory.
Memory allocate_host_memory(size_t bytes);

// A tensor that owns its memory: on the host (parameters on the CPU, test data), or on a
// device through that device's allocator.
class OwnedTensor {
public:
    OwnedTensor() = default;
    OwnedTensor(DType dtype, Shape shape) : OwnedTensor(dtype, shape, Device::cpu, allocate_host_memory) {}
    OwnedTensor(DType dtype, Shape shape, Device device, const MemoryAllocator& allocate)
        : memory_(allocate(static_cast<size_t>(shape.numel()) * dtype_size(dtype))), view_(memory_.get(), dtype, shape, device) {}
    const Tensor& view() const { return view_; }
    operator const Tensor&() const { return view_; }
    template <class T> T* data() const { return view_.data<T>(); }
    int64_t numel() const { return view_.numel(); }

private:
    Memory memory_;
    Tensor view_;
};

// Throws a shape error naming the op and the tensor when shapes differ.
void expect_shape(const char* op, const char* tensor_name, const Tensor& tensor, const Shape& expected);
void expect_dtype(const char* op, const char* tensor_name, const Tensor& tensor, DType expected);

}  // namespace llmtrain

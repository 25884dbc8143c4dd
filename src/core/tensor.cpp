#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

namespace llmtrain {

Shape::Shape(std::initializer_list<int64_t> list) {
    if (list.size() > static_cast<size_t>(max_rank)) fail(ErrorKind::shape, "shape of rank ", list.size(), " exceeds the maximum rank ", max_rank);
    for (int64_t d : list) {
        if (d < 0) fail(ErrorKind::shape, "negative dimension ", d, " in a shape");
        dims[static_cast<size_t>(rank++)] = d;
    }
}

int64_t Shape::numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
    return n;
}

bool Shape::operator==(const Shape& other) const {
    if (rank != other.rank) return false;
    for (int i = 0; i < rank; ++i)
        if (dims[static_cast<size_t>(i)] != other.dims[static_cast<size_t>(i)]) return false;
    return true;
}

std::string Shape::str() const {
    std::ostringstream out;
    out << '[';
    for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << dims[static_cast<size_t>(i)];
    out << ']';
    return out.str();
}

Tensor Tensor::reshape(Shape shape) const {
    if (shape.numel() != numel()) fail(ErrorKind::shape, "cannot reshape ", shape_.str(), " to ", shape.str());
    return Tensor(data_, dtype_, shape, device_);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
    if (rank() == 0 || begin < 0 || count < 0 || begin + count > dim(0))
        fail(ErrorKind::shape, "rows [", begin, ", ", begin + count, ") out of range for ", shape_.str());
    Shape shape = shape_;
    shape.dims[0] = count;
    const size_t row_bytes = bytes() / static_cast<size_t>(dim(0) == 0 ? 1 : dim(0));
    return Tensor(static_cast<char*>(data_) + static_cast<size_t>(begin) * row_bytes, dtype_, shape, device_);
}

void HostBuffer::FreeDeleter::operator()(void* p) const { std::free(p); }

Memory allocate_host_memory(size_t bytes) {
    const size_t rounded = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return Memory(p, std::free);
}

HostBuffer::HostBuffer(size_t bytes) : bytes_(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    data_.reset(p);
}

void expect_shape(const char* op, const char* tensor_name, const Tensor& tensor, const Shape& expected) {
    if (tensor.shape() != expected)
        fail(ErrorKind::shape, op, ": ", tensor_name, " has shape ", tensor.shape().str(), ", expected ", expected.str());
}

void expect_dtype(const char* op, const char* tensor_name, const Tensor& tensor, DType expected) {
    if (tensor.dtype() != expected)
        fail(ErrorKind::shape, op, ": ", tensor_name, " has dtype ", dtype_name(tensor.dtype()), ", expected ", dtype_name(expected));
}

}  // namespace llmtrain

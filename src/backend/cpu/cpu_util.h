// Helpers shared by the CPU op files: the per-op wall-clock timer, the f32/f64 dispatch,
// tensor checks, and the fixed column blocks that keep reductions over rows deterministic.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "backend/backend.h"
#include "backend/op_checks.h"

namespace llmtrain::cpu {

// Adds the wall time of one op call to the profile when the scope ends.
class OpTimer {
public:
    OpTimer(OpProfile& profile, Op op) : profile_(profile), op_(op), start_(std::chrono::steady_clock::now()) {}
    ~OpTimer() {
        const auto index = static_cast<size_t>(op_);
        profile_.seconds[index] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        profile_.calls[index] += 1;
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;
    const char* name() const { return op_name(op_); }

private:
    OpProfile& profile_;
    Op op_;
    std::chrono::steady_clock::time_point start_;
};

using llmtrain::expect_rank;
using llmtrain::expect_vocab_rows;
using llmtrain::VocabRows;

inline void expect_host(const char* op, const char* tensor_name, const Tensor& t) { expect_device(op, tensor_name, t, Device::cpu); }

// Shape, dtype and host memory in one check.
inline void expect_tensor(const char* op, const char* tensor_name, const Tensor& t, const Shape& shape, DType dtype) {
    llmtrain::expect_tensor(op, tensor_name, t, shape, dtype, Device::cpu);
}

// Runs fn.template operator()<float>() or <double>() for the element type of t.
template <class Fn>
void dispatch_float(const char* op, const char* tensor_name, const Tensor& t, Fn&& fn) {
    expect_host(op, tensor_name, t);
    switch (t.dtype()) {
        case DType::f32: fn.template operator()<float>(); return;
        case DType::f64: fn.template operator()<double>(); return;
        default: fail(ErrorKind::unsupported, op, ": ", tensor_name, " has dtype ", dtype_name(t.dtype()), "; the CPU backend computes in f32 or f64");
    }
}

// The typed data of an optional tensor, or nullptr when it is absent.
template <class T>
T* data_or_null(const Tensor& t) {
    return t.empty() ? nullptr : t.data<T>();
}

// Every id (a token or a target, named by `what`) must lie in [0, vocab): a data error
// naming the op, the id and its row otherwise.
inline void expect_ids_in_vocab(const char* op, const char* what, const int32_t* ids, int64_t rows, int64_t vocab) {
    for (int64_t n = 0; n < rows; ++n)
        if (ids[n] < 0 || ids[n] >= vocab)
            fail(ErrorKind::data, op, ": ", what, " ", ids[n], " at row ", n, " is outside the vocabulary [0, ", vocab, ")");
}

// The document starts of `rows` tokens in sequences of seq_len (backend.h), or nullptr when
// absent: i32 [rows] with 0 <= doc_starts[n] <= n % seq_len (a shape error naming the op and
// the row otherwise).
inline const int32_t* document_starts(const char* op, const Tensor& doc_starts, int64_t rows, int64_t seq_len) {
    if (doc_starts.empty()) return nullptr;
    expect_tensor(op, "doc_starts", doc_starts, {rows}, DType::i32);
    const int32_t* starts = doc_starts.data<int32_t>();
    for (int64_t n = 0; n < rows; ++n)
        if (starts[n] < 0 || starts[n] > n % seq_len)
            fail(ErrorKind::shape, op, ": doc_starts ", starts[n], " at row ", n, " is outside [0, ", n % seq_len, "], its position in the sequence");
    return starts;
}

// Row n's position in its sequence (backend.h): positions[n] when explicit, else n % seq_len
// less its document's start (doc_starts, optional).
struct RowPositions {
    const int32_t* doc_starts = nullptr;
    const int32_t* positions = nullptr;
    int64_t seq_len = 1;
    int64_t operator()(int64_t n) const { return positions ? positions[n] : n % seq_len - (doc_starts ? doc_starts[n] : 0); }
};

// The positions of `rows` rows read from a table of table_rows positions: doc_starts checked
// as above, or explicit positions each in [0, table_rows) (a shape error naming the op and
// the row otherwise); both given is a shape error.
inline RowPositions row_positions(const char* op, const Tensor& doc_starts, const Tensor& positions, int64_t rows, int64_t seq_len, int64_t table_rows) {
    if (positions.empty()) return {document_starts(op, doc_starts, rows, seq_len), nullptr, seq_len};
    if (!doc_starts.empty()) fail(ErrorKind::shape, op, ": doc_starts and explicit positions given together (positions already hold the restarts)");
    expect_tensor(op, "positions", positions, {rows}, DType::i32);
    const int32_t* p = positions.data<int32_t>();
    for (int64_t n = 0; n < rows; ++n)
        if (p[n] < 0 || p[n] >= table_rows) fail(ErrorKind::shape, op, ": position ", p[n], " at row ", n, " is outside the table's [0, ", table_rows, ")");
    return {nullptr, p, seq_len};
}

// Parameter-gradient reductions over rows run over blocks of this many columns. The width
// does not depend on the thread count, so every output element is summed by one thread, in
// row order, through the same code path: the result is the same for any thread count.
constexpr int64_t column_block = 64;
inline int64_t column_block_count(int64_t cols) { return (cols + column_block - 1) / column_block; }
inline int64_t column_block_end(int64_t block, int64_t cols) { return std::min(cols, (block + 1) * column_block); }

}  // namespace llmtrain::cpu

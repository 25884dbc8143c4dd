#include "backend/op_checks.h"

namespace llmtrain {

void expect_rank(const char* op, const char* name, const Tensor& t, int rank) {
    if (t.rank() != rank) fail(ErrorKind::shape, op, ": ", name, " has shape ", t.shape().str(), ", expected rank ", rank);
}

void expect_device(const char* op, const char* name, const Tensor& t, Device device) {
    if (!t.empty() && t.device() != device)
        fail(ErrorKind::unsupported, op, ": ", name, " is in ", device_name(t.device()), " memory; this backend computes on ", device_name(device), " tensors");
}

void expect_tensor(const char* op, const char* name, const Tensor& t, const Shape& shape, DType dtype, Device device) {
    expect_shape(op, name, t, shape);
    expect_dtype(op, name, t, dtype);
    expect_device(op, name, t, device);
}

std::pair<int64_t, int64_t> expect_norm_tensors(const char* op, Device device, DType statistics, const Tensor& x, const Tensor& w, const Tensor& b,
                                                const NormTensors& others) {
    expect_rank(op, "x", x, 2);
    const int64_t N = x.dim(0), C = x.dim(1);
    expect_device(op, "x", x, device);
    expect_tensor(op, "w", w, {C}, x.dtype(), device);
    if (!b.empty()) expect_tensor(op, "b", b, {C}, x.dtype(), device);
    for (const auto& [name, tensor] : others.rows) expect_tensor(op, name, *tensor, {N, C}, x.dtype(), device);
    for (const auto& [name, tensor] : others.stats) expect_tensor(op, name, *tensor, {N}, statistics, device);
    for (const auto& [name, tensor] : others.grads)
        if (!tensor->empty()) expect_tensor(op, name, *tensor, {C}, statistics, device);
    return {N, C};
}

void expect_vocab_rows(const char* op, const VocabRows& rows) {
    if (rows.begin < 0 || rows.begin + rows.count > rows.total)
        fail(ErrorKind::shape, op, ": vocabulary shard [", rows.begin, ", ", rows.begin + rows.count, ") lies outside [0, ", rows.total, ")");
    if (rows.real < 1 || rows.real > rows.total)
        fail(ErrorKind::shape, op, ": real vocabulary ", rows.real, " must lie in [1, ", rows.total, "] (classes from it on are padding)");
}

void expect_positions(const char* op, const char* name, const Tensor& table, int64_t seq_len) {
    if (seq_len < 1) fail(ErrorKind::shape, op, ": seq_len ", seq_len, " must be positive");
    if (!table.empty() && table.dim(0) < seq_len)
        fail(ErrorKind::shape, op, ": ", name, " has ", table.dim(0), " positions, fewer than seq_len ", seq_len);
}

}  // namespace llmtrain

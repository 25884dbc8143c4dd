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

MoeDims expect_moe_experts(const char* op, const Tensor& experts, int64_t n_experts, Device device) {
    expect_rank(op, "experts", experts, 2);
    const MoeDims dims{experts.dim(0), n_experts, experts.dim(1)};
    if (dims.experts < 1) fail(ErrorKind::shape, op, ": ", dims.experts, " experts; expected at least one");
    if (dims.top_k < 1 || dims.top_k > dims.experts)
        fail(ErrorKind::shape, op, ": top_k ", dims.top_k, " (experts has shape ", experts.shape().str(), ") must lie in [1, ", dims.experts,
             "], the number of experts");
    expect_tensor(op, "experts", experts, experts.shape(), DType::i32, device);
    return dims;
}

MoeDims expect_moe_routing(const char* op, Device device, DType router, const char* router_name, const Tensor& router_tensor, const Tensor& experts) {
    expect_rank(op, router_name, router_tensor, 2);
    const MoeDims dims = expect_moe_experts(op, experts, router_tensor.dim(1), device);
    expect_shape(op, "experts", experts, {router_tensor.dim(0), dims.top_k});
    expect_tensor(op, router_name, router_tensor, router_tensor.shape(), router, device);
    return dims;
}

int64_t moe_groups(const char* op, int64_t tokens, int64_t seq_len) {
    if (seq_len < 0) fail(ErrorKind::shape, op, ": seq_len ", seq_len, " must be 0 (one group of every token) or positive");
    if (seq_len == 0) return 1;
    if (tokens % seq_len != 0) fail(ErrorKind::shape, op, ": seq_len ", seq_len, " does not divide the ", tokens, " tokens");
    return tokens / seq_len;
}

void expect_moe_counts(const char* op, const Tensor& counts, int64_t groups, int64_t experts, Device device) {
    expect_tensor(op, "counts", counts, {groups, experts}, DType::i32, device);
}

void expect_moe_aux_loss(const char* op, int64_t tokens_per_group, int64_t top_k, int64_t experts) {
    if (tokens_per_group < 1) fail(ErrorKind::shape, op, ": tokens_per_group ", tokens_per_group, " must be positive");
    if (top_k < 1 || top_k > experts) fail(ErrorKind::shape, op, ": top_k ", top_k, " must lie in [1, ", experts, "], the number of experts");
}

int64_t moe_permuted_rows(const char* op, const MoeDims& dims, int64_t capacity) {
    if (capacity < 0) fail(ErrorKind::shape, op, ": capacity ", capacity, " must be 0 (dropless) or positive");
    const int64_t rows = capacity == 0 ? dims.tokens * dims.top_k : dims.experts * capacity;
    if (rows > INT32_MAX) fail(ErrorKind::shape, op, ": a permuted buffer of ", rows, " rows; rows are i32 (at most ", INT32_MAX, ")");
    return rows;
}

MoeSlots expect_moe_slots(const char* op, Device device, const Tensor& rows, const char* buffer_name, const Tensor& buffer) {
    expect_rank(op, "rows", rows, 2);
    expect_rank(op, buffer_name, buffer, 2);
    if (rows.dim(1) < 1) fail(ErrorKind::shape, op, ": rows has shape ", rows.shape().str(), ", expected [N, k] with k >= 1");
    expect_tensor(op, "rows", rows, rows.shape(), DType::i32, device);
    expect_device(op, buffer_name, buffer, device);
    return {rows.dim(0), rows.dim(1), buffer.dim(0), buffer.dim(1)};
}

void expect_fp8_scalar(const char* op, const char* name, const Tensor& t, Device device) { expect_tensor(op, name, t, Shape{1}, DType::f32, device); }

namespace {
void expect_fp8_dtype(const char* op, const char* name, const Tensor& t) {
    if (!is_fp8(t.dtype())) fail(ErrorKind::shape, op, ": ", name, " has dtype ", dtype_name(t.dtype()), ", expected e4m3 or e5m2");
}
}  // namespace

std::pair<int64_t, int64_t> expect_fp8_cast(const char* op, const Fp8Cast& a, Device device) {
    if (a.x.rank() < 1) fail(ErrorKind::shape, op, ": x has shape ", a.x.shape().str(), ", expected at least one dimension");
    const int64_t cols = a.x.dim(a.x.rank() - 1), rows = cols == 0 ? 0 : a.x.numel() / cols;
    expect_device(op, "x", a.x, device);
    expect_fp8_dtype(op, "out", a.out);
    expect_tensor(op, "out", a.out, Shape{rows, cols}, a.out.dtype(), device);
    if (!a.out_t.empty()) expect_tensor(op, "out_t", a.out_t, Shape{cols, rows}, a.out.dtype(), device);
    if (is_fp8(a.x.dtype())) {
        // FP8 bytes relaid out, not cast: nothing to scale, measure or count.
        if (a.x.dtype() != a.out.dtype())
            fail(ErrorKind::shape, op, ": x holds ", dtype_name(a.x.dtype()), " bytes and out is ", dtype_name(a.out.dtype()), ": FP8 bytes are relaid out, not recast");
        for (const auto& [name, t] : {std::pair{"scale", &a.scale}, {"amax", &a.amax}, {"counts", &a.counts}})
            if (!t->empty()) fail(ErrorKind::shape, op, ": ", name, " given for x of FP8 bytes (expected none: they are copied as they are)");
        return {rows, cols};
    }
    expect_fp8_scalar(op, "scale", a.scale, device);
    if (!a.amax.empty()) expect_fp8_scalar(op, "amax", a.amax, device);
    if (!a.counts.empty()) expect_tensor(op, "counts", a.counts, Shape{2}, DType::f64, device);
    return {rows, cols};
}

Fp8GemmDims expect_matmul_fp8(const char* op, const MatmulFp8& a, Device device) {
    expect_rank(op, "a", a.a, 2);
    expect_rank(op, "b", a.b, 2);
    expect_fp8_dtype(op, "a", a.a);
    expect_fp8_dtype(op, "b", a.b);
    if (a.a.dtype() == DType::e5m2 && a.b.dtype() == DType::e5m2) fail(ErrorKind::shape, op, ": a and b are both e5m2; one must be e4m3");
    const Fp8GemmDims d{a.a.dim(0), a.b.dim(0), a.a.dim(1)};
    expect_tensor(op, "b", a.b, Shape{d.n, d.k}, a.b.dtype(), device);
    expect_tensor(op, "a", a.a, Shape{d.m, d.k}, a.a.dtype(), device);
    expect_shape(op, "out", a.out, Shape{d.m, d.n});
    expect_device(op, "out", a.out, device);
    expect_fp8_scalar(op, "a_scale_inv", a.a_scale_inv, device);
    expect_fp8_scalar(op, "b_scale_inv", a.b_scale_inv, device);
    if (!a.bias.empty()) expect_tensor(op, "bias", a.bias, Shape{d.n}, a.out.dtype(), device);
    return d;
}

}  // namespace llmtrain

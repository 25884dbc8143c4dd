// Argument checks shared by the backends' ops, each a shape error naming the op and the
// tensor: rank, memory (host or device), shape and dtype, the tensors of a norm, the
// vocabulary rows a shard holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/backend.h"

namespace llmtrain {

void expect_rank(const char* op, const char* name, const Tensor& t, int rank);
// t (unless empty) lives in `device` memory.
void expect_device(const char* op, const char* name, const Tensor& t, Device device);
// Shape, dtype and memory in one check.
void expect_tensor(const char* op, const char* name, const Tensor& t, const Shape& shape, DType dtype, Device device);

// The tensors of a norm op besides x [N, C], w [C] and b [C] (b optional): `rows` of x's
// shape, statistics [N] and parameter gradients [C] (each optional where empty).
using NamedTensors = std::initializer_list<std::pair<const char*, const Tensor*>>;
struct NormTensors {
    NamedTensors rows, stats, grads;
};
// x, w, b and rows in x's dtype; statistics and gradients in `statistics` dtype; every one
// in `device` memory. Returns N and C.
std::pair<int64_t, int64_t> expect_norm_tensors(const char* op, Device device, DType statistics, const Tensor& x, const Tensor& w, const Tensor& b,
                                                const NormTensors& others);

// The rows [begin, begin + count) of a vocabulary of `total` that a table or a block of
// logits holds; classes from `real` on are padding.
struct VocabRows {
    int64_t begin, count, total, real;
    VocabRows(VocabShard shard, int64_t rows)
        : begin(shard.begin), count(rows), total(shard.total ? shard.total : rows), real(shard.real ? shard.real : total) {}
    bool holds(int32_t token) const { return token >= begin && token < begin + count; }
    // Padding sits at the end of the vocabulary, so this block's real classes are its first
    // real_count() rows (none for a block of padding only).
    int64_t real_count() const { return std::clamp(real - begin, int64_t{0}, count); }
};
void expect_vocab_rows(const char* op, const VocabRows& rows);

// seq_len positive (row n takes position n % seq_len) and within the position table
// `name`, when there is one.
void expect_positions(const char* op, const char* name, const Tensor& table, int64_t seq_len);

// Mixture of Experts (backend.h): N tokens, E experts, k chosen per token.
struct MoeDims {
    int64_t tokens, experts, top_k;
};
// experts [N, k] i32 in `device` memory, with E >= 1 and 1 <= k <= E.
MoeDims expect_moe_experts(const char* op, const Tensor& experts, int64_t n_experts, Device device);
// logits or scores [N, E >= 1] in `router` dtype and experts [N, k] i32 with 1 <= k <= E, both
// in `device` memory; `router_name` names the [N, E] tensor.
MoeDims expect_moe_routing(const char* op, Device device, DType router, const char* router_name, const Tensor& router_tensor, const Tensor& experts);
// The groups of seq_len tokens among N (seq_len 0: one group of N); seq_len negative or not
// dividing N is refused.
int64_t moe_groups(const char* op, int64_t tokens, int64_t seq_len);
// counts [G, E] i32.
void expect_moe_counts(const char* op, const Tensor& counts, int64_t groups, int64_t experts, Device device);
// The aux loss's tokens_per_group (positive), top_k (in [1, E]) for E experts.
void expect_moe_aux_loss(const char* op, int64_t tokens_per_group, int64_t top_k, int64_t experts);
// Rows of the permuted buffer: N k (capacity 0, dropless) or E capacity; a negative capacity
// or a buffer past 2^31 - 1 rows (rows are i32) is refused.
int64_t moe_permuted_rows(const char* op, const MoeDims& dims, int64_t capacity);
// The slots and the permuted buffer of the permute and combine ops: rows [N, k] i32 with
// k >= 1 and the [R, C] buffer `buffer_name`, both in `device` memory.
struct MoeSlots {
    int64_t tokens, top_k, rows, channels;  // N, k, R, C
};
MoeSlots expect_moe_slots(const char* op, Device device, const Tensor& rows, const char* buffer_name, const Tensor& buffer);

// FP8 (backend.h): a scale, inverse scale or amax is [1] f32 in `device` memory.
void expect_fp8_scalar(const char* op, const char* name, const Tensor& t, Device device);
// Fp8Cast's tensors: out in e4m3 / e5m2 holding x's elements as [rows, cols] (cols: x's last
// dimension), out_t [cols, rows] in out's format, the scalars. Returns {rows, cols}.
std::pair<int64_t, int64_t> expect_fp8_cast(const char* op, const Fp8Cast& args, Device device);
// MatmulFp8's: a [M, K] and b [N, K] in FP8 and not both e5m2, out [M, N] (its dtype is the
// backend's to check), the inverse scales. Returns M, N, K.
struct Fp8GemmDims {
    int64_t m, n, k;
};
Fp8GemmDims expect_matmul_fp8(const char* op, const MatmulFp8& args, Device device);

}  // namespace llmtrain

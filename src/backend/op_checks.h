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

}  // namespace llmtrain

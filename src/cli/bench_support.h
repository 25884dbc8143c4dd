// What the op benchmarks (`bench attention`, `bench gemm`, `bench moe`) share: reading a shape
// flag, random inputs, a device tensor's values on the host, and how far one result is from
// another.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace llmtrain {

// "8,2048,32" as integers; empty when a part is not an integer (the caller names the flag and
// the form it expects).
std::vector<int64_t> parse_int_list(const std::string& text);

// Fills an f32 or bf16 tensor with uniform values in [-scale, scale) from seed.
void fill_uniform(Backend& be, const Tensor& t, double scale, uint64_t seed);

// The values of a bf16, f16 or f32 device tensor, as floats on the host (waits for it).
std::vector<float> device_values(Backend& be, const Tensor& t);

// max |a - b| / max |b| (max |a - b| when b is all zero); NaN where either holds a
// non-finite value.
double relative_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace llmtrain

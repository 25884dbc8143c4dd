// Element types and devices. Conversions for the 16-bit float formats live here so every
// layer (data files, checkpoints, kernels' host-side checks) rounds the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace llmtrain {

// f64 serves the double-precision reference runs of the tests; training uses f32 (CPU) or
// bf16/f16 compute with f32 master weights (GPU). e4m3 and e5m2 are the FP8 formats of GEMM
// operands (core/fp8.h): bytes read with a scale, never a compute dtype of their own.
enum class DType : uint8_t { f32, f64, bf16, f16, i32, u16, e4m3, e5m2 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* device_name(Device device);
// Whether it is one of the FP8 formats.
inline bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }
// Accepts "f32", "f64", "bf16", "f16", "i32", "u16"; throws a config error otherwise.
DType parse_dtype(const std::string& name);

// Compile-time DType of a C++ element type.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }

// bfloat16 is the top half of an IEEE float; round to nearest even, NaN stays NaN.
inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_to_float(uint16_t value) {
    uint32_t bits = static_cast<uint32_t>(value) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

// IEEE 754 binary16, round to nearest even; overflow goes to infinity.
uint16_t float_to_f16(float value);
float f16_to_float(uint16_t value);

}  // namespace llmtrain

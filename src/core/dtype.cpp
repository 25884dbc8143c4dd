#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace llmtrain {

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::f64: return 8;
        case DType::f32:
        case DType::i32: return 4;
        case DType::bf16:
        case DType::f16:
        case DType::u16: return 2;
        case DType::e4m3:
        case DType::e5m2: return 1;
    }
    return 0;
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::f32: return "f32";
        case DType::f64: return "f64";
        case DType::bf16: return "bf16";
        case DType::f16: return "f16";
        case DType::i32: return "i32";
        case DType::u16: return "u16";
        case DType::e4m3: return "e4m3";
        case DType::e5m2: return "e5m2";
    }
    return "?";
}

const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

DType parse_dtype(const std::string& name) {
    for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::u16})
        if (name == dtype_name(d)) return d;
    fail(ErrorKind::config, "unknown dtype '", name, "' (allowed: f32, f64, bf16, f16, i32, u16)");
}

uint16_t float_to_f16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) return sign | 0x7e00u;              // NaN
    if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;             // rounds past 65504: inf
    if (abs_bits < 0x38800000u) {                                   // f16 subnormal or zero
        // Subnormal f16 has value m * 2^-24; scale, then let the FPU round to nearest even.
        float abs_value;
        std::memcpy(&abs_value, &abs_bits, sizeof abs_value);
        const float scaled = std::nearbyint(abs_value * 16777216.0f);  // * 2^24
        return sign | static_cast<uint16_t>(scaled);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
    uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float f16_to_float(uint16_t value) {
    const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
    const uint32_t exponent = (value >> 10) & 0x1fu;
    const uint32_t mantissa = value & 0x3ffu;
    float magnitude;
    if (exponent == 0) {
        magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    } else if (exponent == 31) {
        magnitude = mantissa ? NAN : INFINITY;
    } else {
        magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
    }
    uint32_t bits;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

}  // namespace llmtrain

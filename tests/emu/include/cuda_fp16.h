// __half of the CUDA emulation: the conversions round to nearest even (subnormals, overflow
// to infinity) as the device does.
#pragma once

#include <cstdint>
#include <cstring>

#include "emu/emu.h"

struct alignas(2) __half {
    unsigned short __x;
};
typedef __half half;
struct alignas(4) __half2 {
    __half x, y;
};

inline float __half2float(__half h) {
    const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16;
    uint32_t exponent = (h.__x >> 10) & 0x1fu, mantissa = h.__x & 0x3ffu, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalize
        exponent = 113;
        while ((mantissa & 0x400u) == 0) {
            mantissa <<= 1;
            --exponent;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest even; subnormal results by one fp32 addition that aligns the 10 mantissa
// bits at the bottom (exact under the default rounding); NaN becomes the canonical 0x7fff.
inline __half __float2half_rn(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    bits &= 0x7fffffffu;
    if (bits >= 0x47800000u) return {static_cast<unsigned short>(bits > 0x7f800000u ? 0x7fffu : (sign | 0x7c00u))};  // >= 2^16
    if (bits < 0x38800000u) {                                                                                        // below 2^-14
        const uint32_t magic_bits = 0x3f000000u;  // 0.5f: its ulp is 2^-24, the f16 subnormal step
        float magic, value;
        std::memcpy(&magic, &magic_bits, sizeof magic);
        std::memcpy(&value, &bits, sizeof value);
        volatile float sum = value + magic;
        const float s = sum;
        uint32_t sum_bits;
        std::memcpy(&sum_bits, &s, sizeof sum_bits);
        return {static_cast<unsigned short>(sign | (sum_bits - magic_bits))};
    }
    const uint32_t odd = (bits >> 13) & 1u;
    bits += 0xc8000fffu + odd;  // rebias the exponent (-112 << 23) and round
    return {static_cast<unsigned short>(sign | (bits >> 13))};
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short v) { return {v}; }
inline unsigned short __half_as_ushort(__half v) { return v.__x; }

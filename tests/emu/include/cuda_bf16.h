// __nv_bfloat16 of the CUDA emulation: the conversions round to nearest even as the device does.
#pragma once

#include <cstdint>
#include <cstring>

#include "emu/emu.h"

struct alignas(2) __nv_bfloat16 {
    unsigned short __x;
};
typedef __nv_bfloat16 nv_bfloat16;
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 v) {
    const uint32_t bits = static_cast<uint32_t>(v.__x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// NaN becomes the canonical 0x7fff, as on the device.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return {static_cast<unsigned short>(bits >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { return {v}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.__x; }

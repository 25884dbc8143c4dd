#include "core/philox.h"

#include <cmath>

namespace llmtrain {

namespace {
constexpr uint32_t philox_m0 = 0xD2511F53u;
constexpr uint32_t philox_m1 = 0xCD9E8D57u;
constexpr uint32_t philox_w0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t philox_w1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    const uint64_t product = static_cast<uint64_t>(a) * b;
    hi = static_cast<uint32_t>(product >> 32);
    lo = static_cast<uint32_t>(product);
}
}  // namespace

PhiloxBlock philox4x32(PhiloxBlock c, std::array<uint32_t, 2> key) {
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        mul_hi_lo(philox_m0, c[0], hi0, lo0);
        mul_hi_lo(philox_m1, c[2], hi1, lo1);
        c = {hi1 ^ c[1] ^ key[0], lo1, hi0 ^ c[3] ^ key[1], lo0};
        key[0] += philox_w0;
        key[1] += philox_w1;
    }
    return c;
}

uint64_t fnv1a64(std::string_view text) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (unsigned char ch : text) {
        hash ^= ch;
        hash *= 0x100000001b3ull;
    }
    return hash;
}

float uniform_from_bits(uint32_t bits) {
    // 24 high bits -> (0, 1] with step 2^-24.
    return (static_cast<float>(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

PhiloxBlock PhiloxStream::block(uint64_t block_index) const {
    const PhiloxBlock counter = {static_cast<uint32_t>(block_index), static_cast<uint32_t>(block_index >> 32),
                                 static_cast<uint32_t>(stream_id_), static_cast<uint32_t>(stream_id_ >> 32)};
    return philox4x32(counter, {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
}

uint32_t PhiloxStream::bits(uint64_t index) const { return block(index / 4)[index % 4]; }

float PhiloxStream::normal(uint64_t index) const {
    // Numbers 2k and 2k+1 are the cosine and sine halves of one Box-Muller pair drawn from
    // block k; computed in double so that the result does not depend on the compiler's fma.
    const PhiloxBlock b = block(index / 2);
    const double u1 = uniform_from_bits(b[0]);
    const double u2 = uniform_from_bits(b[1]);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * M_PI * u2;
    return static_cast<float>(index % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle));
}

uint64_t PhiloxStream::below(uint64_t index, uint64_t bound) const {
    const PhiloxBlock b = block(index);
    const uint64_t wide = (static_cast<uint64_t>(b[0]) << 32) | b[1];
    return wide % bound;
}

}  // namespace llmtrain

// Philox-4x32-10 counter-based RNG (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11). A random value is a pure function of (key, counter), so element i of a
// tensor gets the same value however the tensor is later split across ranks, and a stream
// can jump to any position for free (resume, data sampling by step).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace llmtrain {

using PhiloxBlock = std::array<uint32_t, 4>;

// Ten rounds of Philox-4x32 on counter under key.
PhiloxBlock philox4x32(PhiloxBlock counter, std::array<uint32_t, 2> key);

// 64-bit FNV-1a: a stable id for a name (parameter names key their initialization).
uint64_t fnv1a64(std::string_view text);

// Uniform in (0, 1]: never 0, so log() is safe.
float uniform_from_bits(uint32_t bits);

// The stream (seed, stream_id) viewed as an infinite array of random values.
class PhiloxStream {
public:
    PhiloxStream(uint64_t seed, uint64_t stream_id) : seed_(seed), stream_id_(stream_id) {}

    // Raw 32-bit word number index.
    uint32_t bits(uint64_t index) const;
    // Uniform in (0, 1].
    float uniform(uint64_t index) const { return uniform_from_bits(bits(index)); }
    // Standard normal number index (Box-Muller on a pair of words; pairs never overlap).
    float normal(uint64_t index) const;
    // Uniform integer in [0, bound) (bound > 0), from two words to keep the bias below 2^-32.
    uint64_t below(uint64_t index, uint64_t bound) const;

private:
    PhiloxBlock block(uint64_t block_index) const;
    uint64_t seed_;
    uint64_t stream_id_;
};

}  // namespace llmtrain

// FP8 numerics: the two 8-bit float formats of Hopper's tensor cores and the per-tensor
// scaling that makes them usable for training (Micikevicius et al. 2022, "FP8 Formats for
// Deep Learning"; NVIDIA Transformer Engine's recipes). Everything here is host code: the CPU
// reference emulates FP8 with it, and the CUDA kernels are checked against it.
//
//   e4m3 ("E4M3FN"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; the
//        one NaN pattern per sign is S.1111.111, so the largest finite value is
//        1.75 * 2^8 = 448. Normals from 2^-6, subnormals down to 2^-9. Weights, activations.
//   e5m2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like with infinities and
//        NaNs. Largest finite 1.75 * 2^15 = 57344; normals from 2^-14, subnormals down to
//        2^-16. Gradients (the "hybrid" recipe), which need range more than precision.
//
// A cast rounds to nearest, ties to even, and saturates: a finite value beyond the largest
// finite one (after rounding) and an infinity become +-max (CUDA's __NV_SATFINITE, what
// Transformer Engine casts with), NaN stays NaN. Values below half the smallest subnormal
// become a zero of their sign.
//
// Scaling: a tensor x is stored as q = cast(x * scale) and read as q / scale, so its amax
// (largest |x|) lands near the format's max: scale = max / amax / 2^margin. Current scaling
// takes this tensor's own amax; delayed scaling takes the largest (or the most recent) amax
// of the last amax_history_len steps, so the cast needs no reduction over the tensor first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace llmtrain {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

const char* fp8_format_name(Fp8Format format);
// The format of an FP8 dtype (DType::e4m3, DType::e5m2); a runtime error for another dtype.
Fp8Format fp8_format_of(DType dtype);
// The largest finite value: 448 (e4m3), 57344 (e5m2).
float fp8_max(Fp8Format format);

// Rounds a float to the nearest FP8 value of `format` (ties to even, saturating as above)
// and returns its bit pattern.
uint8_t float_to_fp8(float value, Fp8Format format);
// The value of a bit pattern (exact in float).
float fp8_to_float(uint8_t bits, Fp8Format format);
// float_to_fp8 then back: what the emulation computes with.
inline float round_to_fp8(float value, Fp8Format format) { return fp8_to_float(float_to_fp8(value, format), format); }

// The scale that maps amax onto the format's max with `margin` binary orders of headroom:
// max / amax / 2^margin. An amax that is zero, negative or not finite gives no information:
// the previous scale is kept (Transformer Engine's rule), 1 when there is none.
float fp8_scale_for_amax(float amax, Fp8Format format, int margin, float previous_scale = 1.0f);

// How delayed scaling reduces its amax history (Transformer Engine's amax_compute_algo).
enum class AmaxCompute : uint8_t { max, most_recent };
// Accepts "max" and "most_recent"; throws a config error naming `key` otherwise.
AmaxCompute parse_amax_compute(const std::string& name, const std::string& key);

// The amax history of one tensor under delayed scaling: the last `length` amaxes (zeros
// before the first ones), and the scale the next cast uses, derived from them.
class AmaxHistory {
public:
    // Throws a config error when length < 1.
    AmaxHistory(int length, AmaxCompute compute);

    // Records this step's amax and recomputes the scale from the history. A non-finite amax
    // (a step that overflowed, which the non-finite guard skips) is not recorded: it would
    // hold the scale for the whole window.
    void record(float amax, Fp8Format format, int margin);
    float scale() const { return scale_; }
    // The amax the scale was computed from: the history's max or its newest entry.
    float reduced_amax() const;
    // Oldest first: what a checkpoint stores, restored bit-exact by restore().
    std::vector<float> entries() const;
    // Throws a runtime error when the entry count is not the history's length.
    void restore(const std::vector<float>& oldest_first, float scale);
    int length() const { return static_cast<int>(ring_.size()); }

private:
    std::vector<float> ring_;  // ring_[next_] is the oldest entry
    size_t next_ = 0;
    AmaxCompute compute_;
    float scale_ = 1.0f;
};

}  // namespace llmtrain

#include "core/fp8.h"

#include <cfloat>
#include <cmath>

#include "core/error.h"

namespace llmtrain {

namespace {

struct Fp8Layout {
    int exponent_bits, mantissa_bits, bias;
    uint8_t max_bits;  // the largest finite value's pattern
    uint8_t nan_bits;  // the canonical (positive) NaN
    bool has_infinity;
};

// e4m3: 0.1111.110 = 1.75 * 2^(15 - 7) = 448 (0.1111.111 is NaN).
// e5m2: 0.11110.11 = 1.75 * 2^(30 - 15) = 57344 (exponent 11111 is infinity or NaN).
constexpr Fp8Layout kE4m3{4, 3, 7, 0x7e, 0x7f, false};
constexpr Fp8Layout kE5m2{5, 2, 15, 0x7b, 0x7e, true};

const Fp8Layout& layout_of(Fp8Format format) { return format == Fp8Format::e4m3 ? kE4m3 : kE5m2; }

int min_normal_exponent(const Fp8Layout& l) { return 1 - l.bias; }

// The pattern of a value that is exactly representable, finite and >= 0.
uint8_t encode_exact(double value, const Fp8Layout& l) {
    if (value == 0) return 0;
    int e = 0;
    std::frexp(value, &e);  // value = m 2^e, m in [0.5, 1): its binary exponent is e - 1
    const int exponent = e - 1;
    if (exponent < min_normal_exponent(l)) {  // subnormal: value = mantissa * 2^(emin - mbits)
        return static_cast<uint8_t>(std::ldexp(value, l.mantissa_bits - min_normal_exponent(l)));
    }
    const auto mantissa = static_cast<int>(std::ldexp(value, l.mantissa_bits - exponent)) - (1 << l.mantissa_bits);
    return static_cast<uint8_t>(((exponent + l.bias) << l.mantissa_bits) | mantissa);
}

}  // namespace

const char* fp8_format_name(Fp8Format format) { return format == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

Fp8Format fp8_format_of(DType dtype) {
    if (dtype == DType::e4m3) return Fp8Format::e4m3;
    if (dtype == DType::e5m2) return Fp8Format::e5m2;
    fail(ErrorKind::runtime, "dtype ", dtype_name(dtype), " is not an FP8 format (e4m3, e5m2)");
}

float fp8_max(Fp8Format format) { return fp8_to_float(layout_of(format).max_bits, format); }

// Rounds |value| on the grid of its binade: the spacing there is 2^(exponent - mbits), with
// the exponent held at the smallest normal one below it (the subnormals share that spacing).
// |value| / spacing is exact in double (a float's 24 bits, scaled by a power of two), so
// nearbyint's ties-to-even (the default rounding mode) is the format's.
uint8_t float_to_fp8(float value, Fp8Format format) {
    const Fp8Layout& l = layout_of(format);
    const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
    if (std::isnan(value)) return sign | l.nan_bits;
    const double magnitude = std::fabs(static_cast<double>(value));
    const double max = fp8_to_float(l.max_bits, format);
    if (magnitude > max) return sign | l.max_bits;  // saturate, infinities included
    int e = 0;
    std::frexp(magnitude, &e);
    const int exponent = std::max(e - 1, min_normal_exponent(l));
    const double spacing = std::ldexp(1.0, exponent - l.mantissa_bits);
    const double rounded = std::nearbyint(magnitude / spacing) * spacing;
    return sign | encode_exact(std::min(rounded, max), l);
}

float fp8_to_float(uint8_t bits, Fp8Format format) {
    const Fp8Layout& l = layout_of(format);
    const int mantissa = bits & ((1 << l.mantissa_bits) - 1);
    const int exponent = (bits >> l.mantissa_bits) & ((1 << l.exponent_bits) - 1);
    const int all_ones = (1 << l.exponent_bits) - 1;
    const float sign = (bits & 0x80) ? -1.0f : 1.0f;
    if (l.has_infinity && exponent == all_ones) return mantissa == 0 ? sign * INFINITY : NAN;
    if (!l.has_infinity && exponent == all_ones && mantissa == (1 << l.mantissa_bits) - 1) return NAN;
    if (exponent == 0) return sign * static_cast<float>(std::ldexp(mantissa, min_normal_exponent(l) - l.mantissa_bits));
    const double significand = 1.0 + std::ldexp(mantissa, -l.mantissa_bits);
    return sign * static_cast<float>(std::ldexp(significand, exponent - l.bias));
}

float fp8_scale_for_amax(float amax, Fp8Format format, int margin, float previous_scale) {
    if (!(amax > 0) || !std::isfinite(amax)) return previous_scale;
    const double scale = static_cast<double>(fp8_max(format)) / amax / std::ldexp(1.0, margin);
    return static_cast<float>(std::min(scale, static_cast<double>(FLT_MAX)));  // a subnormal amax
}

AmaxCompute parse_amax_compute(const std::string& name, const std::string& key) {
    if (name == "max") return AmaxCompute::max;
    if (name == "most_recent") return AmaxCompute::most_recent;
    fail(ErrorKind::config, key, " = \"", name, "\": expected \"max\" or \"most_recent\"");
}

AmaxHistory::AmaxHistory(int length, AmaxCompute compute) : compute_(compute) {
    if (length < 1) fail(ErrorKind::config, "fp8.amax_history_len = ", length, ": the history holds at least 1 step");
    ring_.assign(static_cast<size_t>(length), 0.0f);
}

void AmaxHistory::record(float amax, Fp8Format format, int margin) {
    if (!std::isfinite(amax)) return;  // an overflowed step (skipped by the non-finite guard) says nothing of the range
    ring_[next_] = amax;
    next_ = (next_ + 1) % ring_.size();
    scale_ = fp8_scale_for_amax(reduced_amax(), format, margin, scale_);
}

float AmaxHistory::reduced_amax() const {
    if (compute_ == AmaxCompute::most_recent) return ring_[(next_ + ring_.size() - 1) % ring_.size()];
    float largest = 0;
    for (const float a : ring_) largest = std::max(largest, a);
    return largest;
}

std::vector<float> AmaxHistory::entries() const {
    std::vector<float> out;
    out.reserve(ring_.size());
    for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
    return out;
}

void AmaxHistory::restore(const std::vector<float>& oldest_first, float scale) {
    if (oldest_first.size() != ring_.size())
        fail(ErrorKind::runtime, "amax history of ", oldest_first.size(), " entries restored into one of ", ring_.size(), " (fp8.amax_history_len)");
    ring_ = oldest_first;
    next_ = 0;
    scale_ = scale;
}

}  // namespace llmtrain

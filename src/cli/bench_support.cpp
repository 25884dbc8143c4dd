#include "cli/bench_support.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

namespace llmtrain {

void fill_uniform(Backend& be, const Tensor& t, double scale, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const auto n = static_cast<size_t>(t.numel());
    if (t.dtype() == DType::f32) {
        std::vector<float> values(n);
        for (float& v : values) v = static_cast<float>(uniform(rng) * scale);
        be.copy_from_host(t, values.data());
    } else {
        std::vector<uint16_t> bits(n);
        for (uint16_t& b : bits) b = float_to_bf16(static_cast<float>(uniform(rng) * scale));
        be.copy_from_host(t, bits.data());
    }
}

std::vector<int64_t> parse_int_list(const std::string& text) {
    std::vector<int64_t> values;
    std::stringstream in(text);
    std::string part;
    while (std::getline(in, part, ',')) {
        try {
            size_t used = 0;
            values.push_back(std::stoll(part, &used));
            if (used != part.size()) return {};
        } catch (const std::exception&) {
            return {};
        }
    }
    return values;
}

std::vector<float> device_values(Backend& be, const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    if (t.dtype() == DType::f32) {
        be.copy_to_host(out.data(), t);
        return out;
    }
    std::vector<uint16_t> bits(out.size());
    be.copy_to_host(bits.data(), t);
    for (size_t i = 0; i < out.size(); ++i) out[i] = t.dtype() == DType::bf16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]);
    return out;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::nan("");
        worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return scale > 0 ? worst / scale : worst;
}

}  // namespace llmtrain

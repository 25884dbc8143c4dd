#include "model/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace llmtrain {

KvCache::KvCache(int64_t layers, int64_t capacity_positions, int64_t width)
    : capacity(capacity_positions), kv_width(width), keys(static_cast<size_t>(layers)), values(static_cast<size_t>(layers)) {
    for (auto& k : keys) k.resize(static_cast<size_t>(capacity * kv_width));
    for (auto& v : values) v.resize(static_cast<size_t>(capacity * kv_width));
}

void cached_attention(double* out, const double* q, const std::vector<double>& keys, const std::vector<double>& values, int64_t positions,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
    const int64_t D = head_dim, width = n_kv_heads * D, group = n_heads / n_kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<double> weights(static_cast<size_t>(positions));
    for (int64_t h = 0; h < n_heads; ++h) {
        const double* qh = q + h * D;
        const int64_t kv = (h / group) * D;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < positions; ++s) {
            const double* k = keys.data() + s * width + kv;
            double score = 0;
            for (int64_t d = 0; d < D; ++d) score += qh[d] * k[d];
            weights[static_cast<size_t>(s)] = score * scale;
            max_score = std::max(max_score, score * scale);
        }
        double total = 0;
        for (double& w : weights) total += w = std::exp(w - max_score);
        double* oh = out + h * D;
        std::fill(oh, oh + D, 0.0);
        for (int64_t s = 0; s < positions; ++s) {
            const double* v = values.data() + s * width + kv;
            const double p = weights[static_cast<size_t>(s)] / total;
            for (int64_t d = 0; d < D; ++d) oh[d] += p * v[d];
        }
    }
}

}  // namespace llmtrain

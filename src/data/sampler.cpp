#include "data/sampler.h"

#include <xxhash.h>

#include <bit>
#include <cmath>

#include "core/error.h"

namespace llmtrain {

namespace {
constexpr int kFeistelRounds = 4;
constexpr double kBlendSlots = 1000;  // round length for several sources: weights to 0.1%
}  // namespace

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    if (n == 0) fail(ErrorKind::runtime, "a permutation of an empty range");
    const unsigned bits = std::max(2u, static_cast<unsigned>(std::bit_width(n - 1)));
    half_bits_ = (bits + 1) / 2;
    half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

// A balanced Feistel network on 2 * half_bits bits: a bijection for any round function.
uint64_t Permutation::feistel(uint64_t x) const {
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (int round = 0; round < kFeistelRounds; ++round) {
        const uint64_t mixed = XXH3_64bits_withSeed(&right, sizeof right, key_ + static_cast<uint64_t>(round));
        const uint64_t next_right = left ^ (mixed & half_mask_);
        left = right;
        right = next_right;
    }
    return (left << half_bits_) | right;
}

// Cycle walking: the domain is < 4n, so a few steps on average reach [0, n) again.
uint64_t Permutation::operator()(uint64_t index) const {
    uint64_t x = index;
    do x = feistel(x);
    while (x >= n_);
    return x;
}

GlobalSampleOrder::GlobalSampleOrder(std::vector<uint64_t> samples, const std::vector<double>& weights, uint64_t seed)
    : samples_(std::move(samples)), seed_(seed) {
    if (samples_.empty() || samples_.size() != weights.size()) fail(ErrorKind::runtime, "sample order: one weight per source is needed");
    double total = 0;
    for (double w : weights) total += w;
    for (size_t i = 0; i < samples_.size(); ++i) {
        if (samples_[i] == 0 || !(weights[i] > 0)) fail(ErrorKind::runtime, "sample order: source ", i, " has no samples or a weight <= 0");
        quotas_.push_back(samples_.size() == 1 ? 1 : std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(weights[i] / total * kBlendSlots))));
    }
    uint64_t round = 0;
    for (uint64_t q : quotas_) round += q;
    std::vector<uint64_t> taken(quotas_.size(), 0);
    for (uint64_t slot = 0; slot < round; ++slot) {
        // The source furthest below its share after this slot; ties: the lower index.
        size_t best = 0;
        double best_deficit = -1e300;
        for (size_t i = 0; i < quotas_.size(); ++i) {
            const double deficit = static_cast<double>(quotas_[i]) * static_cast<double>(slot + 1) / static_cast<double>(round) - static_cast<double>(taken[i]);
            if (deficit > best_deficit) { best = i; best_deficit = deficit; }
        }
        slots_.push_back({static_cast<uint32_t>(best), taken[best]++});
    }
}

SampleRef GlobalSampleOrder::at(uint64_t global_index) const {
    const Slot& slot = slots_[global_index % slots_.size()];
    const uint64_t local = global_index / slots_.size() * quotas_[slot.source] + slot.ordinal;
    const uint64_t n = samples_[slot.source];
    const uint64_t epoch = local / n;
    const uint64_t key_parts[3] = {seed_, slot.source, epoch};
    const Permutation shuffle(n, XXH3_64bits(key_parts, sizeof key_parts));
    return {slot.source, shuffle(local % n), epoch};
}

}  // namespace llmtrain

// The global order of training samples. A sample is seq_len + 1 consecutive tokens of one
// source, starting at a multiple of seq_len (inputs: the first seq_len, targets: the last
// seq_len), so sequences are packed across documents and every token is a target once per
// epoch. Global sample g is a pure function of (seed, g):
//  - blending: the sources take turns in rounds; a round of R slots gives source i
//    quota_i ~ weight_i * R slots, spread evenly by Megatron's rule (each slot goes to the
//    source furthest below its share so far);
//  - each source's k-th sample of its epoch e is perm_{seed, i, e}(k mod n_i), where perm is
//    a keyed Feistel bijection of [0, n_i) (cycle walking): a fresh shuffle every epoch in
//    O(1) memory, whatever the dataset size.
// No state but the seed: a checkpoint needs only the global cursor.
#pragma once

#include <cstdint>
#include <vector>

namespace llmtrain {

// A keyed pseudo-random bijection of [0, n).
class Permutation {
public:
    Permutation(uint64_t n, uint64_t key);
    uint64_t operator()(uint64_t index) const;

private:
    uint64_t feistel(uint64_t x) const;
    uint64_t n_, key_;
    unsigned half_bits_;
    uint64_t half_mask_;
};

struct SampleRef {
    uint32_t source;
    uint64_t sample;  // index within the source: tokens [sample * seq_len, sample * seq_len + seq_len + 1)
    uint64_t epoch;   // of that source
};

class GlobalSampleOrder {
public:
    // samples[i] > 0 for every source; weights > 0 (normalized here).
    GlobalSampleOrder(std::vector<uint64_t> samples, const std::vector<double>& weights, uint64_t seed);
    SampleRef at(uint64_t global_index) const;
    // Global samples in one round of the blend (1 for a single source).
    uint64_t round_length() const { return slots_.size(); }

private:
    struct Slot {
        uint32_t source;
        uint64_t ordinal;  // this source's count before the slot, within the round
    };
    std::vector<uint64_t> samples_;
    std::vector<uint64_t> quotas_;
    std::vector<Slot> slots_;
    uint64_t seed_;
};

}  // namespace llmtrain

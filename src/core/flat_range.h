// A range [begin, end) of elements of a flat buffer: what a parameter occupies in the flat
// parameter buffer, what a gradient bucket reduces, what a ZeRO-1 rank owns. The parallel
// layer works on these alone and knows nothing of the model that laid the buffer out.
#pragma once

#include <algorithm>
#include <cstdint>

namespace llmtrain {

struct FlatRange {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
    bool overlaps(const FlatRange& other) const { return std::max(begin, other.begin) < std::min(end, other.end); }
    // The elements both hold; empty (size 0) when they do not overlap.
    FlatRange intersect(const FlatRange& other) const {
        const int64_t b = std::max(begin, other.begin), e = std::min(end, other.end);
        return b < e ? FlatRange{b, e} : FlatRange{b, b};
    }
    bool operator==(const FlatRange&) const = default;
};

}  // namespace llmtrain

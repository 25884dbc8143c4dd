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
};

}  // namespace llmtrain

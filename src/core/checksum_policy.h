// Whether a recorded checksum that disagrees with the bytes stops the read. It always does in
// llmtrain. The fuzzing build (-DLLMTRAIN_FUZZ=ON defines LLMTRAIN_FUZZ_SKIP_CHECKSUMS) still
// computes every checksum but reads on, so that mutated bytes reach the parsers behind the
// checksums instead of stopping at the first hash (a shard's metadata XXH3, zstd frame and gzip
// CRC-32 checksums, HDF5's Fletcher32 per chunk, a checkpoint's rank file XXH64 and its
// manifest's own). src/main.cpp refuses to compile with that
// definition and the fuzzing build makes no llmtrain binary (tests/fuzz/CMakeLists.txt), so a
// binary that skips them cannot be built.
#pragma once

namespace llmtrain {

#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
inline constexpr bool kChecksumsEnforced = false;
#else
inline constexpr bool kChecksumsEnforced = true;
#endif

// True where `actual` (computed from the bytes) is not `recorded` (stored with them) and the
// difference stops the read.
template <class T>
constexpr bool checksum_mismatch(const T& recorded, const T& actual) {
    return kChecksumsEnforced && !(recorded == actual);
}

}  // namespace llmtrain

// Arbitrary bytes as a zstd-compressed JSONL input (input.jsonl.zst) of `llmtrain prepare`:
// see fuzz_compressed_input.h.
#include "fuzz_compressed_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    llmtrain::fuzz::check_compressed_input(llmtrain::Compression::zstd, "input.jsonl.zst", data, size);
    return 0;
}

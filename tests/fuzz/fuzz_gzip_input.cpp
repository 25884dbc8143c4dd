// Arbitrary bytes as a gzip-compressed JSONL input (input.jsonl.gz) of `llmtrain prepare`:
// see fuzz_compressed_input.h.
#include "fuzz_compressed_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    llmtrain::fuzz::check_compressed_input(llmtrain::Compression::gzip, "input.jsonl.gz", data, size);
    return 0;
}

// Arbitrary bytes as an llm.c shard file: read every token or throw llmtrain::Error.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/external_formats.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = llmtrain::fuzz::write_scratch_file("llmc.bin", data, size);
    try {
        auto source = llmtrain::open_llmc(path, 50257);
        std::vector<int32_t> tokens(source->token_count());
        source->read(0, tokens.size(), tokens.data());
    } catch (const llmtrain::Error&) {
    }
    return 0;
}

// Arbitrary bytes as an llm.c shard file: read every token or throw llmtrain::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/external_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = "/tmp/llmtrain-fuzz-llmc-" + std::to_string(getpid()) + ".bin";
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    try {
        auto source = llmtrain::open_llmc(path, 50257);
        std::vector<int32_t> tokens(source->token_count());
        source->read(0, tokens.size(), tokens.data());
    } catch (const llmtrain::Error&) {
    }
    return 0;
}

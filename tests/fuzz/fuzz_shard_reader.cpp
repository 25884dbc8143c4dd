// Arbitrary bytes as a token shard: the reader either reads every token or throws
// llmtrain::Error; it never crashes, hangs or reads out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        llmtrain::ShardReader reader("fuzz.ltshard", std::string(reinterpret_cast<const char*>(data), size));
        if (reader.token_count() < (uint64_t{1} << 24)) reader.read_all();
    } catch (const llmtrain::Error&) {
    }
    return 0;
}

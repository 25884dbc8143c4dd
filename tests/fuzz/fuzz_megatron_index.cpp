// Arbitrary bytes as a Megatron .idx (the first 8 bytes give the .bin size it must fit).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "data/external_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    uint64_t bin_bytes;
    std::memcpy(&bin_bytes, data, 8);
    try {
        llmtrain::check_megatron_index("fuzz.idx", std::string(reinterpret_cast<const char*>(data) + 8, size - 8), bin_bytes);
    } catch (const llmtrain::Error&) {
    }
    return 0;
}

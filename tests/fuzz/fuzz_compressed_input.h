// The gzip and zstd targets' one body: arbitrary bytes as a compressed JSONL input of `llmtrain
// prepare`. Decompressed in memory (decompress) and streamed from the file (TextReader, as
// prepare reads), the text is the same, or the stream refuses what memory refused; then the
// file is read as prepare reads it (prepare_input.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_input.h"
#include "prepare_input.h"

namespace llmtrain::fuzz {

// Text beyond this is not compared (a compression bomb is refused by memory's limit alone).
constexpr size_t kMaxCompared = size_t{1} << 22;

inline void check_compressed_input(Compression compression, const char* name, const uint8_t* data, size_t size) {
    const std::string path = write_scratch_file(name, data, size);
    std::string in_memory;
    bool memory_read = true;
    try {
        in_memory = decompress(compression, std::string_view(reinterpret_cast<const char*>(data), size), path, kMaxCompared);
    } catch (const Error&) {
        memory_read = false;
    }
    std::string streamed;
    bool stream_read = true;
    try {
        TextReader reader(path);
        char chunk[4096];
        while (streamed.size() <= kMaxCompared) {
            const size_t n = reader.read(chunk, sizeof chunk);
            if (n == 0) break;
            streamed.append(chunk, n);
        }
    } catch (const Error& e) {
        if (std::string(e.what()).find(path) == std::string::npos) std::abort();  // a refusal that does not name the file
        stream_read = false;
    }
    if (memory_read && (!stream_read || streamed != in_memory)) std::abort();
    if (!memory_read && stream_read && streamed.size() <= kMaxCompared) std::abort();  // the stream took what memory refused
    check_prepare_reads(path);
}

}  // namespace llmtrain::fuzz

// Arbitrary bytes as a JSONL input of `llmtrain prepare --input-format jsonl`: each line a JSON
// object whose "text" field is a document. The file is split into its documents as prepare
// splits a piece of it (the first byte of the input picks where the piece starts, at a line
// boundary, as prepare's work units do), or refused with llmtrain::Error naming the file and
// the line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/prepare.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text = llmtrain::fuzz::as_text(data, size);
    const std::string path = llmtrain::fuzz::write_scratch_file("input.jsonl", data, size);
    llmtrain::PrepareOptions options;
    options.input_format = llmtrain::InputFormat::jsonl;
    // A work unit starts after a newline (or at the file's start).
    const size_t newline = size > 0 ? text.find('\n', data[0] % size) : std::string::npos;
    const size_t piece = newline == std::string::npos ? 0 : newline + 1;
    try {
        for (const std::string& document : llmtrain::split_documents(text.substr(piece), options, path, piece))
            if (document.empty()) std::abort();  // an empty document is dropped, never passed on
    } catch (const llmtrain::Error& e) {
        if (std::string(e.what()).find("'" + path + "' line ") != 0) std::abort();  // every refusal names the file and the line
    }
    return 0;
}

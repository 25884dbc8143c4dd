// Arbitrary text as tokenizer.json: refused with llmtrain::Error, or loaded into a tokenizer
// whose decode(encode(x)) == x and whose saved JSON loads back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const llmtrain::Tokenizer t = llmtrain::Tokenizer::from_hf_json(text, "fuzz.json");
        const std::string sample = "Hello, world! It's 2024 \xC3\xA9\xF0\x9F\x99\x82 \xFF<|endoftext|>";
        if (t.decode(t.encode(sample)) != sample) std::abort();
        llmtrain::Tokenizer::from_hf_json(t.to_hf_json(), "saved.json");
    } catch (const llmtrain::Error&) {
    }
    return 0;
}

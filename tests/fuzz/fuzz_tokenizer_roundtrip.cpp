// decode(encode(x)) == x for arbitrary bytes x, with the GPT-2 and the cl100k split patterns
// and a vocabulary trained on a little text (so merges and added tokens take part).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/bpe_trainer.h"

namespace {
llmtrain::Tokenizer trained(const char* pattern) {
    llmtrain::BpeTrainer trainer({400, pattern, {"<|endoftext|>", "<|pad|>"}, 2});
    for (int i = 0; i < 10; ++i) trainer.add_text("The quick brown fox's 12345 jumps \xC3\xA9t\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82\r\n  \t");
    return trainer.train("fuzz");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const llmtrain::Tokenizer gpt2 = trained(llmtrain::kGpt2Pattern), cl100k = trained(llmtrain::kCl100kPattern);
    const std::string text(reinterpret_cast<const char*>(data), size);
    for (const llmtrain::Tokenizer* t : {&gpt2, &cl100k}) {
        llmtrain::EncodeCache cache;
        if (t->decode(t->encode(text, &cache)) != text) std::abort();
        if (t->encode(text, &cache) != t->encode(text)) std::abort();
    }
    return 0;
}

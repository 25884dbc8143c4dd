// The pre-tokenizer of byte-level BPE: a regular expression cuts text into pieces (words,
// numbers, punctuation runs, whitespace) and BPE merges never cross a piece boundary. The
// pattern is Unicode-aware (\p{L}, \p{N}), so it runs on PCRE2 with JIT in UTF + UCP mode.
//
// Hugging Face's tokenizers run the pattern with Oniguruma, whose \s is Unicode White_Space
// (U+0085 in, U+180E and U+FEFF out); PCRE2's \s is not quite that set, so \s and \S are
// rewritten as explicit classes of it.
// Text need not be valid UTF-8: each maximal valid run is split by the pattern and every
// invalid byte becomes a piece of its own, so any byte string has a tokenization.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace llmtrain {

// GPT-2's pattern (Hugging Face ByteLevel with use_regex = true).
extern const char* const kGpt2Pattern;
// The pattern of cl100k_base and Llama 3: case-insensitive contractions, digits in groups
// of at most three, newlines kept apart.
extern const char* const kCl100kPattern;

class Pretokenizer {
public:
    explicit Pretokenizer(std::string pattern);
    ~Pretokenizer();
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;

    // Calls piece() for each piece in order; the pieces concatenate to text.
    void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;
    const std::string& pattern() const { return pattern_; }

private:
    void split_valid_utf8(std::string_view text, const std::function<void(std::string_view)>& piece) const;

    std::string pattern_;
    struct Compiled;
    std::unique_ptr<Compiled> compiled_;
};

}  // namespace llmtrain

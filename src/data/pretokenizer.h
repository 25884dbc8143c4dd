// The pre-tokenizer of byte-level BPE: a regular expression cuts text into pieces (words,
// numbers, punctuation runs, whitespace) and BPE merges never cross a piece boundary. The
// pattern is Unicode-aware (\p{L}, \p{N}), so it runs on PCRE2 with JIT in UTF + UCP mode.
//
// Hugging Face's tokenizers run the pattern with Oniguruma, whose \s is Unicode White_Space
// (U+0085 in, U+180E and U+FEFF out); PCRE2's \s is not quite that set, so \s and \S are
// rewritten as explicit classes of it.
// GPT-2's, cl100k's (Llama 3's) and Qwen2's patterns run on hand-written matchers instead
// (split_matchers.h), several times faster than the JIT and equal to it piece for piece;
// PCRE2 stays the reference and the engine of any other pattern.
//
// Text need not be valid UTF-8: each maximal valid run is split by the pattern and every
// invalid byte becomes a piece of its own, so any byte string has a tokenization.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "data/split_matchers.h"

namespace llmtrain {

// GPT-2's pattern (Hugging Face ByteLevel with use_regex = true).
extern const char* const kGpt2Pattern;
// The pattern of cl100k_base and Llama 3: case-insensitive contractions, digits in groups
// of at most three, newlines kept apart.
extern const char* const kCl100kPattern;
// Qwen2's: cl100k's with single digits.
extern const char* const kQwen2Pattern;

enum class SplitEngine {
    fastest,  // the specialised matcher of a known pattern, else PCRE2
    pcre2,    // PCRE2 always (the reference the matchers are tested against)
};

class Pretokenizer {
public:
    explicit Pretokenizer(std::string pattern, SplitEngine engine = SplitEngine::fastest);
    ~Pretokenizer();
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;

    // Calls piece() for each piece in order; the pieces concatenate to text.
    void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;
    // The same, for a hot loop: on_piece is inlined and nothing is allocated.
    template <class OnPiece>
    void for_each_piece(std::string_view text, OnPiece&& on_piece) const {
        if (!matcher_) return split(text, on_piece);
        for (size_t pos = 0, end; pos < text.size(); pos = end) {
            end = matcher_(text, pos);
            on_piece(text.substr(pos, end - pos));
        }
    }
    const std::string& pattern() const { return pattern_; }
    // "gpt2", "cl100k" or "qwen2" when a specialised matcher runs the pattern, else "pcre2".
    const char* engine_name() const;

private:
    void split_valid_utf8(std::string_view text, const std::function<void(std::string_view)>& piece) const;

    std::string pattern_;
    PieceEndFn matcher_ = nullptr;
    struct Compiled;
    std::unique_ptr<Compiled> compiled_;
};

}  // namespace llmtrain

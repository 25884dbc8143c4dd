// Hand-written matchers for the split patterns that almost every byte-level BPE uses, in
// place of a general regex engine: GPT-2's, cl100k's (= Llama 3's) and Qwen2's (cl100k's with
// single digits). Each answers where the piece that starts at a position ends, exactly as
// the pattern's leftmost-first alternation run by PCRE2 (or Oniguruma) would, without
// backtracking: every alternative's outcome follows from the classes of one or two
// characters and the extent of one run. Tests compare them with PCRE2 on random and
// Unicode-heavy text; any other pattern runs on PCRE2 (pretokenizer.h).
//
// Text need not be valid UTF-8: a byte that does not start a valid sequence is a piece of its
// own, and a piece never extends over one; the pattern sees each valid run as its own text.
#pragma once

#include <cstddef>
#include <string_view>

namespace llmtrain {

// The end of the piece that starts at text[pos] (pos < text.size()); always > pos.
using PieceEndFn = size_t (*)(std::string_view text, size_t pos);

// The matcher of a pattern written exactly as one of the known ones, else nullptr.
PieceEndFn specialised_matcher(std::string_view pattern);

// Its name, for `bench tokenizer` and logs: "gpt2", "cl100k" or "qwen2"; nullptr if none.
const char* specialised_matcher_name(std::string_view pattern);

}  // namespace llmtrain

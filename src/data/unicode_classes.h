// The four character classes the split patterns of byte-level BPE tell apart: letters
// (\p{L}), numbers (\p{N}), white space (Unicode White_Space, the set Oniguruma's \s means)
// and everything else. Letters and numbers are asked of PCRE2, the engine that runs every
// other pattern, one block of 256 code points at a time on first use, so the specialised
// matchers (split_matchers.h) and the regex agree on every code point by construction,
// whatever Unicode version the installed PCRE2 carries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llmtrain {

enum class CharClass : uint8_t { other, letter, number, space };

// Unicode White_Space: \t \n \v \f \r, space, U+0085, U+00A0, U+1680, U+2000-U+200A,
// U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_unicode_white_space(uint32_t cp);

// Class of a code point (< 0x110000); thread-safe.
CharClass char_class(uint32_t cp);

// Decodes the valid UTF-8 sequence at text[pos] into cp and returns its length (1..4), or 0
// when the bytes there are not valid UTF-8 (the rules of utf8_sequence_length).
inline size_t decode_utf8(std::string_view text, size_t pos, uint32_t& cp) {
    const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
    const uint8_t lead = at(pos);
    if (lead < 0x80) { cp = lead; return 1; }
    const size_t left = text.size() - pos;
    if (lead >= 0xC2 && lead <= 0xDF) {
        if (left < 2 || (at(pos + 1) & 0xC0) != 0x80) return 0;
        cp = (uint32_t{lead} & 0x1F) << 6 | (at(pos + 1) & 0x3F);
        return 2;
    }
    if (lead >= 0xE0 && lead <= 0xEF) {
        if (left < 3 || (at(pos + 1) & 0xC0) != 0x80 || (at(pos + 2) & 0xC0) != 0x80) return 0;
        cp = (uint32_t{lead} & 0x0F) << 12 | uint32_t{at(pos + 1) & 0x3Fu} << 6 | (at(pos + 2) & 0x3F);
        return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;  // no overlongs, no surrogates
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
        if (left < 4 || (at(pos + 1) & 0xC0) != 0x80 || (at(pos + 2) & 0xC0) != 0x80 || (at(pos + 3) & 0xC0) != 0x80) return 0;
        cp = (uint32_t{lead} & 0x07) << 18 | uint32_t{at(pos + 1) & 0x3Fu} << 12 | uint32_t{at(pos + 2) & 0x3Fu} << 6 | (at(pos + 3) & 0x3F);
        return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
    }
    return 0;
}

}  // namespace llmtrain

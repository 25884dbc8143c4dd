#include "data/byte_level.h"

#include <vector>

namespace llmtrain {

namespace {

// Code point that stands for each byte (GPT-2's bytes_to_unicode()).
std::array<uint32_t, 256> byte_code_points() {
    std::array<uint32_t, 256> cps{};
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cps[b] = printable ? b : next_extra++;
    }
    return cps;
}

struct Tables {
    std::array<std::string, 256> utf8;
    std::vector<int16_t> byte_of_code_point;  // index: code point < 324; -1: not in the map
    Tables() : byte_of_code_point(324, -1) {
        const auto cps = byte_code_points();
        for (uint32_t b = 0; b < 256; ++b) {
            append_utf8(utf8[b], cps[b]);
            byte_of_code_point[cps[b]] = static_cast<int16_t>(b);
        }
    }
};

const Tables& tables() {
    static const Tables t;
    return t;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

size_t utf8_sequence_length(std::string_view text, size_t pos) {
    const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
    const uint8_t lead = at(pos);
    if (lead < 0x80) return 1;
    size_t length;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (excludes overlongs, surrogates)
    if (lead >= 0xC2 && lead <= 0xDF) length = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) { length = 3; if (lead == 0xE0) lo = 0xA0; if (lead == 0xED) hi = 0x9F; }
    else if (lead >= 0xF0 && lead <= 0xF4) { length = 4; if (lead == 0xF0) lo = 0x90; if (lead == 0xF4) hi = 0x8F; }
    else return 0;
    if (pos + length > text.size()) return 0;
    if (at(pos + 1) < lo || at(pos + 1) > hi) return 0;
    for (size_t i = 2; i < length; ++i)
        if ((at(pos + i) & 0xC0) != 0x80) return 0;
    return length;
}

const std::string& byte_to_unicode(uint8_t b) { return tables().utf8[b]; }

std::string bytes_to_byte_level(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) out += tables().utf8[static_cast<uint8_t>(c)];
    return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
    std::string out;
    const auto& byte_of = tables().byte_of_code_point;
    for (size_t pos = 0; pos < text.size();) {
        const size_t length = utf8_sequence_length(text, pos);
        if (length == 0 || length > 2) return std::nullopt;  // every mapped code point is < 0x800
        uint32_t cp = static_cast<uint8_t>(text[pos]);
        if (length == 2) cp = ((cp & 0x1F) << 6) | (static_cast<uint8_t>(text[pos + 1]) & 0x3F);
        if (cp >= byte_of.size() || byte_of[cp] < 0) return std::nullopt;
        out += static_cast<char>(byte_of[cp]);
        pos += length;
    }
    return out;
}

}  // namespace llmtrain

#include "data/split_matchers.h"

#include <array>

#include "data/pretokenizer.h"
#include "data/unicode_classes.h"

namespace llmtrain {

namespace {

// A character's class as the patterns see it; `edge` stands for the end of the text and for
// an invalid byte, where the pattern's subject ends.
enum Kind : uint8_t { other, letter, number, space, edge };

constexpr std::array<uint8_t, 128> ascii_kinds() {
    std::array<uint8_t, 128> kinds{};
    for (int c = 0; c < 128; ++c) {
        kinds[c] = other;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) kinds[c] = letter;
        if (c >= '0' && c <= '9') kinds[c] = number;
        if (c == ' ' || (c >= '\t' && c <= '\r')) kinds[c] = space;
    }
    return kinds;
}
constexpr std::array<uint8_t, 128> kAsciiKinds = ascii_kinds();

struct Char {
    uint32_t cp;
    uint8_t kind;
    uint8_t length;  // bytes; 0 at an edge
};

inline Char char_at(std::string_view text, size_t pos) {
    if (pos >= text.size()) return {0, edge, 0};
    const auto byte = static_cast<uint8_t>(text[pos]);
    if (byte < 0x80) return {byte, kAsciiKinds[byte], 1};
    uint32_t cp = 0;
    const size_t length = decode_utf8(text, pos, cp);
    if (length == 0) return {0, edge, 0};
    return {cp, static_cast<uint8_t>(char_class(cp)), static_cast<uint8_t>(length)};
}

// End of the run of characters of `kind` from pos.
inline size_t run_end(std::string_view text, size_t pos, uint8_t kind) {
    for (;;) {
        if (pos < text.size() && static_cast<uint8_t>(text[pos]) < 0x80) {
            if (kAsciiKinds[static_cast<uint8_t>(text[pos])] != kind) return pos;
            ++pos;
            continue;
        }
        const Char c = char_at(text, pos);
        if (c.kind != kind) return pos;
        pos += c.length;
    }
}

// `'s|'t|'re|'ve|'m|'ll|'d` at text[pos] == '\'': the end of the contraction, or 0. With
// `caseless` ((?i:...) in UCP mode) a letter matches its other case too, and 's' also the
// long s U+017F (which folds to it); no other code point folds to these letters.
size_t contraction_end(std::string_view text, size_t pos, bool caseless) {
    const auto folded = [&](size_t at, size_t& length) -> char {
        length = 1;
        if (at >= text.size()) return 0;
        const auto c = static_cast<uint8_t>(text[at]);
        if (!caseless) return static_cast<char>(c);
        if (c == 0xC5 && at + 1 < text.size() && static_cast<uint8_t>(text[at + 1]) == 0xBF) { length = 2; return 's'; }
        return static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    };
    size_t first_length = 0, second_length = 0;
    const char first = folded(pos + 1, first_length);
    if (first == 's' || first == 't' || first == 'm' || first == 'd') return pos + 1 + first_length;
    const char second = folded(pos + 1 + first_length, second_length);
    if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') || (first == 'l' && second == 'l')) return pos + 1 + first_length + second_length;
    return 0;
}

// A run of white space from pos (the caller knows text[pos] is white space); `last` is the
// start of its last character.
struct SpaceRun {
    size_t end, last;
    bool followed_by_edge;
};
inline SpaceRun space_run(std::string_view text, size_t pos) {
    SpaceRun run{pos, pos, false};
    for (;;) {
        const Char c = char_at(text, run.end);
        if (c.kind != space) {
            run.followed_by_edge = c.kind == edge;
            return run;
        }
        run.last = run.end;
        run.end += c.length;
    }
}

// `\s+(?!\S)|\s+` on a white-space run: the whole run where the text (or the valid run)
// ends after it, else all but its last character, which then starts the next piece, unless
// the run is that one character.
inline size_t trailing_space_end(const SpaceRun& run, size_t pos) {
    if (run.followed_by_edge || run.last == pos) return run.end;
    return run.last;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_piece_end(std::string_view text, size_t pos) {
    const Char c = char_at(text, pos);
    if (c.kind == edge) return pos + 1;
    if (c.cp == '\'') {
        if (const size_t end = contraction_end(text, pos, false)) return end;
    }
    if (c.kind != space) return run_end(text, pos + c.length, c.kind);
    if (c.cp == ' ') {
        const Char next = char_at(text, pos + 1);
        if (next.kind == letter || next.kind == number || next.kind == other) return run_end(text, pos + 1 + next.length, next.kind);
    }
    return trailing_space_end(space_run(text, pos), pos);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
template <int max_digits>
size_t cl100k_piece_end(std::string_view text, size_t pos) {
    const Char c = char_at(text, pos);
    if (c.kind == edge) return pos + 1;
    if (c.cp == '\'') {
        if (const size_t end = contraction_end(text, pos, true)) return end;
    }
    if (c.kind == letter) return run_end(text, pos + c.length, letter);
    if (c.kind == number) {
        size_t end = pos + c.length;
        for (int digits = 1; digits < max_digits; ++digits) {
            const Char next = char_at(text, end);
            if (next.kind != number) break;
            end += next.length;
        }
        return end;
    }
    const Char next = char_at(text, pos + c.length);
    if (c.cp != '\r' && c.cp != '\n' && next.kind == letter) return run_end(text, pos + c.length + next.length, letter);
    size_t others = c.kind == other ? pos : c.cp == ' ' && next.kind == other ? pos + 1 : text.size() + 1;
    if (others <= text.size()) {
        size_t end = run_end(text, others + char_at(text, others).length, other);
        while (end < text.size() && (text[end] == '\r' || text[end] == '\n')) ++end;
        return end;
    }
    const SpaceRun run = space_run(text, pos);
    for (size_t i = run.end; i > pos; --i)
        if (text[i - 1] == '\r' || text[i - 1] == '\n') return i;  // \s*[\r\n]+: up to the run's last line break
    return trailing_space_end(run, pos);
}

}  // namespace

PieceEndFn specialised_matcher(std::string_view pattern) {
    if (pattern == kGpt2Pattern) return gpt2_piece_end;
    if (pattern == kCl100kPattern) return cl100k_piece_end<3>;
    if (pattern == kQwen2Pattern) return cl100k_piece_end<1>;
    return nullptr;
}

const char* specialised_matcher_name(std::string_view pattern) {
    if (pattern == kGpt2Pattern) return "gpt2";
    if (pattern == kCl100kPattern) return "cl100k";
    if (pattern == kQwen2Pattern) return "qwen2";
    return nullptr;
}

}  // namespace llmtrain

// GPT-2's byte-level alphabet: every byte value is shown as one printable Unicode character,
// so a BPE vocabulary of strings covers arbitrary bytes. Printable Latin-1 bytes map to
// themselves; the other 68 (controls, space, soft hyphen, ...) map to U+0100 upward in byte
// order (space -> U+0120 'Ġ', newline -> U+010A 'Ċ'). This is the table of GPT-2's
// encoder.py and of Hugging Face's ByteLevel pre-tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmtrain {

// The UTF-8 encoding of the character that stands for byte b.
const std::string& byte_to_unicode(uint8_t b);

// Bytes -> their byte-level string (each byte becomes its character).
std::string bytes_to_byte_level(std::string_view bytes);

// Byte-level string -> bytes; nullopt when it holds a character outside the 256 of the map
// or is not valid UTF-8.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

// Length of the valid UTF-8 sequence starting at text[pos] (1..4), or 0 when the bytes there
// do not start one (stray continuation, overlong form, surrogate, above U+10FFFF, truncated).
size_t utf8_sequence_length(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace llmtrain

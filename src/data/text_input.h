// Input text as `prepare`, `tokenizer train` and `bench tokenizer` read it: plain, gzip
// (zlib's inflate; concatenated members too) or zstd (concatenated and skippable frames
// too), told apart by the file's magic bytes, streamed in bounded chunks so a file of any
// size (or a compression bomb) is never held whole. A name that promises a compression the
// bytes lack (x.gz that is not gzip), and formats that cannot be read (xz, bzip2, zip, lz4,
// 7z), are refused naming the file; so is text that is not text (sniff_text).
//
// The decoders and the sniffer are small functions of bytes in memory as well, so fuzzing
// targets can call them without files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace llmtrain {

enum class Compression { none, gzip, zstd };

const char* compression_name(Compression c);

// The compression the first bytes of a file announce (4 suffice); none for anything else.
// Throws ErrorKind::data, naming `name`, for a compressed format this reader does not handle.
Compression compression_of_magic(std::string_view first_bytes, const std::string& name);

// The compression a file name promises by its last extension (.gz, .zst, .zstd).
Compression compression_of_name(std::string_view path);

// The name without its compression extension ("a.jsonl.zst" -> "a.jsonl").
std::string_view without_compression_extension(std::string_view path);

// An incremental decoder: compressed bytes in, text out, a bounded amount per call.
class Decoder {
public:
    virtual ~Decoder() = default;
    // Decodes from the front of `in` (advancing it past what was consumed) into out, at most
    // capacity bytes; returns how many it wrote (0 when it needs more input). Throws
    // ErrorKind::data on corrupt data, naming the stream.
    virtual size_t decode(std::string_view& in, char* out, size_t capacity) = 0;
    // Whether the data so far ends a whole member / frame (else the input was cut short).
    virtual bool complete() const = 0;
};

// name stands for the stream in errors.
std::unique_ptr<Decoder> make_decoder(Compression c, std::string name);

// The whole text of compressed bytes in memory, at most max_bytes of it (ErrorKind::data
// beyond, and when the data is corrupt or cut short).
std::string decompress(Compression c, std::string_view bytes, const std::string& name, size_t max_bytes);

// Reads a file's text from the start, decompressing by its magic bytes.
class TextReader {
public:
    explicit TextReader(std::string path);
    ~TextReader();
    TextReader(const TextReader&) = delete;
    TextReader& operator=(const TextReader&) = delete;

    // Up to capacity bytes of text; 0 at the end. Throws ErrorKind::data naming the file on
    // corrupt or truncated compressed data.
    size_t read(char* out, size_t capacity);
    // Reads and drops count bytes of text; false when the text ends first.
    bool skip(uint64_t count);
    // Reads until `text` holds count more bytes or the text ends.
    void read_into(std::string& text, size_t count);

    Compression compression() const { return compression_; }
    const std::string& path() const { return path_; }
    uint64_t text_offset() const { return text_offset_; }

private:
    bool fill_input();

    std::string path_;
    int fd_ = -1;
    Compression compression_ = Compression::none;
    std::unique_ptr<Decoder> decoder_;
    std::string input_;          // compressed bytes read from the file, not yet decoded
    size_t input_used_ = 0;
    bool input_ended_ = false;
    uint64_t text_offset_ = 0;   // text bytes handed out so far
};

// The text of a whole file (decompressed), refused as sniff_text says; for small inputs
// (tokenizer training, the benchmark).
std::string read_input_text(const std::string& path);

// Whether bytes look like text: the share of bytes that are neither valid UTF-8 nor
// ordinary characters (controls other than \t \n \v \f \r and ESC count against it, NUL
// above all) must stay at or below kMaxNonTextShare; fewer than kMinNonTextBytes such bytes
// pass whatever the share (a short text quoting a few stray bytes). A cut-off UTF-8 sequence at the very
// end of the sample does not count.
constexpr double kMaxNonTextShare = 0.05;
constexpr size_t kMinNonTextBytes = 16;
struct TextSniff {
    size_t bytes = 0, non_text = 0;
    bool looks_like_text() const { return non_text < kMinNonTextBytes || static_cast<double>(non_text) <= kMaxNonTextShare * static_cast<double>(bytes); }
};
TextSniff sniff_text(std::string_view sample, bool sample_is_cut = true);

// Throws ErrorKind::data naming `where` when the sniff says the bytes are not text.
void require_text(const TextSniff& sniff, const std::string& where);

// Bytes a plain or compressed file's start is sniffed over before any work.
constexpr size_t kSniffBytes = 64 * 1024;

}  // namespace llmtrain

#include "data/text_input.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_d_forceIgnoreChecksum (core/checksum_policy.h)
#endif
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "core/checksum_policy.h"
#include "core/error.h"
#include "data/byte_level.h"

namespace llmtrain {

namespace {

constexpr size_t kReadChunk = 1 << 20;

bool starts_with_bytes(std::string_view bytes, std::initializer_list<uint8_t> magic) {
    if (bytes.size() < magic.size()) return false;
    size_t i = 0;
    for (uint8_t m : magic)
        if (static_cast<uint8_t>(bytes[i++]) != m) return false;
    return true;
}

bool is_gzip_magic(std::string_view b) { return starts_with_bytes(b, {0x1F, 0x8B}); }
bool is_zstd_magic(std::string_view b) {
    if (starts_with_bytes(b, {0x28, 0xB5, 0x2F, 0xFD})) return true;
    // A skippable frame: 0x184D2A50-0x184D2A5F, little-endian.
    return b.size() >= 4 && (static_cast<uint8_t>(b[0]) & 0xF0) == 0x50 && starts_with_bytes(b.substr(1), {0x2A, 0x4D, 0x18});
}

// gzip members, one after another (`cat a.gz b.gz` is one gzip file).
class GzipDecoder final : public Decoder {
public:
    explicit GzipDecoder(std::string name) : name_(std::move(name)) {
        if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail(ErrorKind::runtime, "'", name_, "': cannot start zlib's inflate");
        if (!kChecksumsEnforced) inflateValidate(&z_, 0);  // each member's CRC-32 and length
    }
    ~GzipDecoder() override { inflateEnd(&z_); }
    GzipDecoder(const GzipDecoder&) = delete;
    GzipDecoder& operator=(const GzipDecoder&) = delete;

    size_t decode(std::string_view& in, char* out, size_t capacity) override {
        if (capacity == 0) return 0;
        if (complete_ && !in.empty()) {
            if (in.find_first_not_of('\0') == std::string_view::npos) {  // zero padding after the last member, which gzip ignores too
                in = {};
                return 0;
            }
            if (!is_gzip_magic(in) && in.size() >= 2)
                fail(ErrorKind::data, "'", name_, "': ", in.size(), " byte(s) after the end of the gzip data are not another gzip member (corrupt or appended data)");
        }
        z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
        const auto offered = static_cast<uInt>(std::min<size_t>(in.size(), UINT32_MAX));
        z_.avail_in = offered;
        z_.next_out = reinterpret_cast<Bytef*>(out);
        z_.avail_out = static_cast<uInt>(std::min<size_t>(capacity, UINT32_MAX));
        const int rc = inflate(&z_, Z_NO_FLUSH);
        const size_t consumed = offered - z_.avail_in;
        const size_t produced = std::min<size_t>(capacity, UINT32_MAX) - z_.avail_out;
        in.remove_prefix(consumed);
        if (rc == Z_STREAM_END) {
            complete_ = true;
            inflateReset(&z_);
        } else if (rc == Z_OK || rc == Z_BUF_ERROR) {
            if (consumed > 0 || produced > 0) complete_ = false;
        } else {
            fail(ErrorKind::data, "'", name_, "': corrupt gzip data (zlib: ", z_.msg ? z_.msg : zError(rc), ")");
        }
        return produced;
    }
    bool complete() const override { return complete_; }

private:
    std::string name_;
    z_stream z_{};
    bool complete_ = false;
};

// zstd frames, one after another; skippable frames are passed over by the library.
class ZstdDecoder final : public Decoder {
public:
    explicit ZstdDecoder(std::string name) : name_(std::move(name)), context_(ZSTD_createDCtx()) {
        if (!context_) fail(ErrorKind::runtime, "'", name_, "': cannot create a zstd context");
#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
        ZSTD_DCtx_setParameter(context_, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
#endif
    }
    ~ZstdDecoder() override { ZSTD_freeDCtx(context_); }
    ZstdDecoder(const ZstdDecoder&) = delete;
    ZstdDecoder& operator=(const ZstdDecoder&) = delete;

    size_t decode(std::string_view& in, char* out, size_t capacity) override {
        if (capacity == 0) return 0;
        ZSTD_inBuffer input{in.data(), in.size(), 0};
        ZSTD_outBuffer output{out, capacity, 0};
        const size_t rc = ZSTD_decompressStream(context_, &output, &input);
        if (ZSTD_isError(rc)) fail(ErrorKind::data, "'", name_, "': corrupt zstd data (", ZSTD_getErrorName(rc), ")");
        in.remove_prefix(input.pos);
        if (input.pos > 0 || output.pos > 0) complete_ = rc == 0;
        return output.pos;
    }
    bool complete() const override { return complete_; }

private:
    std::string name_;
    ZSTD_DCtx* context_;
    bool complete_ = false;
};

}  // namespace

const char* compression_name(Compression c) {
    switch (c) {
        case Compression::gzip: return "gzip";
        case Compression::zstd: return "zstd";
        case Compression::none: break;
    }
    return "none";
}

Compression compression_of_magic(std::string_view b, const std::string& name) {
    if (is_gzip_magic(b)) return Compression::gzip;
    if (is_zstd_magic(b)) return Compression::zstd;
    const auto refuse = [&](const char* format) {
        fail(ErrorKind::data, "input '", name, "' is ", format, "-compressed, which prepare does not read; recompress it with zstd or gzip (or decompress it)");
    };
    if (starts_with_bytes(b, {0xFD, '7', 'z', 'X', 'Z', 0x00})) refuse("xz");
    if (starts_with_bytes(b, {'B', 'Z', 'h'}) && b.size() >= 10 && b[3] >= '1' && b[3] <= '9' && starts_with_bytes(b.substr(4), {0x31, 0x41, 0x59, 0x26, 0x53, 0x59})) refuse("bzip2");
    if (starts_with_bytes(b, {0x04, 0x22, 0x4D, 0x18})) refuse("lz4");
    if (starts_with_bytes(b, {'P', 'K', 0x03, 0x04})) refuse("zip");
    if (starts_with_bytes(b, {'7', 'z', 0xBC, 0xAF, 0x27, 0x1C})) refuse("7z");
    return Compression::none;
}

Compression compression_of_name(std::string_view path) {
    if (path.ends_with(".gz")) return Compression::gzip;
    if (path.ends_with(".zst") || path.ends_with(".zstd")) return Compression::zstd;
    return Compression::none;
}

std::string_view without_compression_extension(std::string_view path) {
    for (std::string_view ext : {".gz", ".zst", ".zstd"})
        if (path.ends_with(ext)) return path.substr(0, path.size() - ext.size());
    return path;
}

std::unique_ptr<Decoder> make_decoder(Compression c, std::string name) {
    switch (c) {
        case Compression::gzip: return std::make_unique<GzipDecoder>(std::move(name));
        case Compression::zstd: return std::make_unique<ZstdDecoder>(std::move(name));
        case Compression::none: break;
    }
    fail(ErrorKind::runtime, "make_decoder: no decoder for uncompressed data");
}

std::string decompress(Compression c, std::string_view bytes, const std::string& name, size_t max_bytes) {
    const auto decoder = make_decoder(c, name);
    std::string text;
    char chunk[64 * 1024];
    for (;;) {
        const size_t before = bytes.size();
        const size_t n = decoder->decode(bytes, chunk, sizeof chunk);
        if (text.size() + n > max_bytes) fail(ErrorKind::data, "'", name, "': decompresses to more than ", max_bytes, " bytes");
        text.append(chunk, n);
        if (n == 0 && bytes.size() == before) break;  // no progress: all input consumed and flushed
    }
    if (!decoder->complete()) fail(ErrorKind::data, "'", name, "': the ", compression_name(c), " data ends early (truncated file?)");
    return text;
}

TextReader::TextReader(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(ErrorKind::data, "cannot open input '", path_, "': ", std::strerror(errno));
    while (input_.size() < 16 && fill_input()) {
    }
    compression_ = compression_of_magic(input_, path_);
    const Compression named = compression_of_name(path_);
    if (named != Compression::none && named != compression_)
        fail(ErrorKind::data, "input '", path_, "' is named as ", compression_name(named), " but its bytes are not ", compression_name(named), " data");
    if (compression_ != Compression::none) decoder_ = make_decoder(compression_, path_);
}

TextReader::~TextReader() {
    if (fd_ >= 0) ::close(fd_);
}

bool TextReader::fill_input() {
    if (input_ended_) return false;
    if (input_used_ > 0) {
        input_.erase(0, input_used_);
        input_used_ = 0;
    }
    const size_t old = input_.size();
    input_.resize(old + kReadChunk);
    ssize_t n;
    do n = ::read(fd_, input_.data() + old, kReadChunk);
    while (n < 0 && errno == EINTR);
    if (n < 0) fail(ErrorKind::io, "read error on input '", path_, "': ", std::strerror(errno));
    input_.resize(old + static_cast<size_t>(n));
    if (n == 0) input_ended_ = true;
    return n > 0;
}

size_t TextReader::read(char* out, size_t capacity) {
    if (capacity == 0) return 0;
    for (;;) {
        std::string_view pending(input_.data() + input_used_, input_.size() - input_used_);
        const size_t before = pending.size();
        size_t produced = 0;
        if (!decoder_) {
            produced = std::min(capacity, pending.size());
            std::memcpy(out, pending.data(), produced);
            pending.remove_prefix(produced);
        } else {
            // Asked even when all input has been handed over: it may hold decoded bytes that
            // did not fit the last call.
            produced = decoder_->decode(pending, out, capacity);
        }
        const size_t consumed = before - pending.size();
        input_used_ += consumed;
        if (produced > 0) {
            text_offset_ += produced;
            return produced;
        }
        if (consumed > 0) continue;  // headers, or a member's end: no text yet
        if (!fill_input()) {
            if (decoder_ && !decoder_->complete())
                fail(ErrorKind::data, "input '", path_, "': the ", compression_name(compression_), " data ends early after ", text_offset_, " bytes of text (truncated file?)");
            return 0;
        }
    }
}

bool TextReader::skip(uint64_t count) {
    char chunk[64 * 1024];
    while (count > 0) {
        const size_t n = read(chunk, static_cast<size_t>(std::min<uint64_t>(count, sizeof chunk)));
        if (n == 0) return false;
        count -= n;
    }
    return true;
}

void TextReader::read_into(std::string& text, size_t count) {
    const size_t start = text.size();
    text.resize(start + count);
    size_t done = 0;
    while (done < count) {
        const size_t n = read(text.data() + start + done, count - done);
        if (n == 0) break;
        done += n;
    }
    text.resize(start + done);
}

std::string read_input_text(const std::string& path) {
    TextReader reader(path);
    std::string text;
    for (;;) {
        const size_t before = text.size();
        reader.read_into(text, kReadChunk);
        if (before == 0) require_text(sniff_text(std::string_view(text).substr(0, kSniffBytes), text.size() > kSniffBytes), cat("input '", path, "'"));
        if (text.size() - before < kReadChunk) break;
    }
    return text;
}

TextSniff sniff_text(std::string_view sample, bool sample_is_cut) {
    TextSniff sniff;
    sniff.bytes = sample.size();
    for (size_t pos = 0; pos < sample.size();) {
        const auto byte = static_cast<uint8_t>(sample[pos]);
        if (byte >= 0x20 && byte < 0x80) { ++pos; continue; }
        if (byte < 0x20) {
            const bool ordinary = (byte >= '\t' && byte <= '\r') || byte == 0x1B;
            if (!ordinary) ++sniff.non_text;
            ++pos;
            continue;
        }
        const size_t length = utf8_sequence_length(sample, pos);
        if (length > 0) { pos += length; continue; }
        if (sample_is_cut && sample.size() - pos < 4) break;  // a sequence the sample's end cut in two
        ++sniff.non_text;
        ++pos;
    }
    return sniff;
}

void require_text(const TextSniff& sniff, const std::string& where) {
    if (sniff.looks_like_text()) return;
    fail(ErrorKind::data, where, " does not look like text: ", sniff.non_text, " of ", sniff.bytes, " bytes (more than ", kMaxNonTextShare * 100,
         "%) are invalid UTF-8 or control characters; is it binary, or in another encoding than UTF-8?");
}

}  // namespace llmtrain

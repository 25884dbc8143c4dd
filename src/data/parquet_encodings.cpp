#include "data/parquet_encodings.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace llmtrain::parquet {

namespace {

// Value `index` of a bit-packed run, LSB first: bit i of the value is bit (index*width + i)
// of the bytes.
uint64_t unpack_bits(std::string_view bytes, uint64_t index, int width) {
    uint64_t bit = index * static_cast<uint64_t>(width), value = 0;
    for (int got = 0; got < width;) {
        const auto byte = static_cast<uint8_t>(bytes[static_cast<size_t>(bit / 8)]);
        const int offset = static_cast<int>(bit % 8), take = std::min(8 - offset, width - got);
        value |= static_cast<uint64_t>((byte >> offset) & ((1u << take) - 1)) << got;
        got += take;
        bit += static_cast<uint64_t>(take);
    }
    return value;
}

// The largest output each codec can make of n bytes: snappy's densest element is a 3-byte
// copy of 64 bytes; deflate's is 258 bytes from 2 bits (1032:1). Zstd has no useful bound
// (a 4-byte block may stand for 128 KiB), so its frame header's size is checked instead.
bool could_decompress_to(Codec codec, size_t compressed, size_t size) {
    switch (codec) {
        case Codec::snappy: return size <= 22 * compressed + 64;
        case Codec::gzip: return size <= 1032 * compressed + 1024;
        default: return true;
    }
}

void lies(size_t size, const std::string& what) { fail(ErrorKind::data, "the decompressed size lies: the header says ", size, " bytes, ", what); }

std::string inflate_gzip(std::string_view in, size_t size) {
    std::string out(size, '\0');
    z_stream z{};
    if (inflateInit2(&z, 15 + 32) != Z_OK) fail(ErrorKind::runtime, "zlib: inflateInit2 failed");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z.avail_in = static_cast<uInt>(in.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    int rc = Z_OK;
    for (;;) {  // members one after another, as gzip allows
        rc = inflate(&z, Z_FINISH);
        if (rc != Z_STREAM_END || z.avail_in == 0) break;
        inflateReset(&z);
    }
    const size_t produced = size - z.avail_out;
    const bool more_output = rc == Z_BUF_ERROR && z.avail_out == 0 && z.avail_in > 0;
    inflateEnd(&z);
    if (rc == Z_STREAM_END && produced == size) return out;
    if (more_output || (rc == Z_OK && z.avail_out == 0)) lies(size, "the GZIP stream holds more");
    if (rc == Z_STREAM_END || rc == Z_BUF_ERROR) lies(size, cat("the GZIP stream ends after ", produced));
    fail(ErrorKind::data, "corrupt GZIP data (zlib: ", z.msg ? z.msg : "error", ")");
}

std::string decompress_zstd(std::string_view in, size_t size) {
    const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());  // of the first frame
    if (declared == ZSTD_CONTENTSIZE_ERROR) fail(ErrorKind::data, "corrupt ZSTD data (no valid frame)");
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > size) lies(size, cat("the ZSTD frame holds ", declared));
    std::string out(size, '\0');
    const size_t got = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
    if (ZSTD_isError(got)) {
        if (ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall) lies(size, "the ZSTD frames hold more");
        fail(ErrorKind::data, "corrupt ZSTD data (", ZSTD_getErrorName(got), ")");
    }
    if (got != size) lies(size, cat("the ZSTD frames hold ", got));
    return out;
}

std::string decompress_snappy(std::string_view in, size_t size) {
    size_t declared = 0;
    if (!snappy::GetUncompressedLength(in.data(), in.size(), &declared)) fail(ErrorKind::data, "corrupt SNAPPY data (no valid length)");
    if (declared != size) lies(size, cat("the SNAPPY data holds ", declared));
    std::string out(size, '\0');
    if (!snappy::RawUncompress(in.data(), in.size(), out.data())) fail(ErrorKind::data, "corrupt SNAPPY data");
    return out;
}

}  // namespace

uint64_t ByteCursor::uleb128(const char* what) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (pos_ >= bytes_.size()) fail(ErrorKind::data, what, ": the bytes end inside a number");
        const auto byte = static_cast<uint8_t>(bytes_[pos_++]);
        value |= static_cast<uint64_t>(byte & 0x7f) << shift;
        if (!(byte & 0x80)) return value;
    }
    fail(ErrorKind::data, what, ": a number longer than 64 bits");
}

int64_t ByteCursor::zigzag_varint(const char* what) {
    const uint64_t z = uleb128(what);
    return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
}

uint32_t ByteCursor::u32_le(const char* what) {
    const std::string_view b = take(4, what);
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
    return v;
}

std::string_view ByteCursor::take(size_t n, const char* what) {
    if (n > left()) fail(ErrorKind::data, what, ": ", n, " bytes wanted at byte ", pos_, ", only ", left(), " left");
    const std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
}

int bit_width_of(uint64_t max_value) {
    int width = 0;
    while (max_value >> width) ++width;
    return width;
}

HybridDecoder::HybridDecoder(std::string_view bytes, int bit_width, const char* what) : cursor_(bytes), bit_width_(bit_width), what_(what) {
    if (bit_width < 0 || bit_width > 32) fail(ErrorKind::data, what, ": bit width ", bit_width, " (at most 32)");
}

void HybridDecoder::start_run() {
    while (run_left_ == 0) {
        const uint64_t header = cursor_.uleb128(what_);
        if (header & 1) {  // bit-packed: header/2 groups of 8 values
            const uint64_t groups = header >> 1;
            if (groups > cursor_.left()) fail(ErrorKind::data, what_, ": a bit-packed run of ", groups, " groups runs past the bytes");
            packed_ = true;
            run_left_ = groups * 8;
            packed_bytes_ = cursor_.take(static_cast<size_t>(groups) * static_cast<size_t>(bit_width_), what_);
            packed_index_ = 0;
        } else {  // a run of one value, stored in ceil(bit_width / 8) bytes
            packed_ = false;
            run_left_ = header >> 1;
            const std::string_view b = cursor_.take(static_cast<size_t>((bit_width_ + 7) / 8), what_);
            repeated_ = 0;
            for (size_t i = b.size(); i-- > 0;) repeated_ = (repeated_ << 8) | static_cast<uint8_t>(b[i]);
        }
    }
}

uint32_t HybridDecoder::next() {
    start_run();
    --run_left_;
    return packed_ ? static_cast<uint32_t>(unpack_bits(packed_bytes_, packed_index_++, bit_width_)) : repeated_;
}

std::vector<int64_t> decode_delta_binary_packed(std::string_view bytes, size_t& end, uint64_t expected_count, const char* what) {
    ByteCursor in(bytes);
    const uint64_t block_size = in.uleb128(what), miniblocks = in.uleb128(what), count = in.uleb128(what);
    const int64_t first = in.zigzag_varint(what);
    if (block_size == 0 || block_size % 128 != 0 || block_size > (1u << 20) || miniblocks == 0 || block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0)
        fail(ErrorKind::data, what, ": DELTA_BINARY_PACKED header with block size ", block_size, " and ", miniblocks, " miniblocks (a multiple of 128, in miniblocks of a multiple of 32)");
    if (count != expected_count) fail(ErrorKind::data, what, ": DELTA_BINARY_PACKED holds ", count, " values, the page ", expected_count);
    const uint64_t per_miniblock = block_size / miniblocks;
    std::vector<int64_t> values;
    values.reserve(static_cast<size_t>(count));
    if (count > 0) values.push_back(first);
    uint64_t last = static_cast<uint64_t>(first);
    while (values.size() < count) {
        const auto min_delta = static_cast<uint64_t>(in.zigzag_varint(what));
        const std::string_view widths = in.take(static_cast<size_t>(miniblocks), what);
        for (size_t m = 0; m < miniblocks && values.size() < count; ++m) {
            const int width = static_cast<uint8_t>(widths[m]);
            if (width > 64) fail(ErrorKind::data, what, ": DELTA_BINARY_PACKED miniblock of bit width ", width, " (at most 64)");
            const std::string_view body = in.take(static_cast<size_t>(per_miniblock * static_cast<uint64_t>(width) / 8), what);
            for (uint64_t j = 0; j < per_miniblock && values.size() < count; ++j) {
                last += min_delta + unpack_bits(body, j, width);  // wrapping, as the specification says
                values.push_back(static_cast<int64_t>(last));
            }
        }
    }
    end = in.position();
    return values;
}

std::vector<std::string_view> decode_plain_byte_arrays(std::string_view bytes, uint64_t count) {
    ByteCursor in(bytes);
    std::vector<std::string_view> values;
    values.reserve(static_cast<size_t>(std::min<uint64_t>(count, bytes.size() / 4)));
    for (uint64_t i = 0; i < count; ++i) {
        const uint32_t length = in.u32_le("PLAIN value length");
        values.push_back(in.take(length, "PLAIN value"));
    }
    return values;
}

std::vector<std::string_view> decode_delta_length_byte_arrays(std::string_view bytes, uint64_t count) {
    size_t start = 0;
    const std::vector<int64_t> lengths = decode_delta_binary_packed(bytes, start, count, "DELTA_LENGTH_BYTE_ARRAY lengths");
    ByteCursor in(bytes.substr(start));
    std::vector<std::string_view> values;
    values.reserve(lengths.size());
    for (const int64_t length : lengths) {
        if (length < 0) fail(ErrorKind::data, "DELTA_LENGTH_BYTE_ARRAY: a negative length (", length, ")");
        values.push_back(in.take(static_cast<size_t>(length), "DELTA_LENGTH_BYTE_ARRAY value"));
    }
    return values;
}

PageValues decode_delta_byte_arrays(std::string_view bytes, uint64_t count) {
    size_t suffixes_start = 0;
    const std::vector<int64_t> prefixes = decode_delta_binary_packed(bytes, suffixes_start, count, "DELTA_BYTE_ARRAY prefix lengths");
    const std::vector<std::string_view> suffixes = decode_delta_length_byte_arrays(bytes.substr(suffixes_start), count);
    // Each value is a prefix of the one before plus its suffix; the total is bounded by the
    // page's bytes times the values, so it is summed first and refused past 1 GiB.
    uint64_t total = 0, previous = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
        if (prefixes[i] < 0 || static_cast<uint64_t>(prefixes[i]) > previous)
            fail(ErrorKind::data, "DELTA_BYTE_ARRAY: value ", i, " keeps ", prefixes[i], " bytes of a previous value of ", previous);
        previous = static_cast<uint64_t>(prefixes[i]) + suffixes[i].size();
        total += previous;
        if (total > (uint64_t{1} << 30)) fail(ErrorKind::data, "DELTA_BYTE_ARRAY: the values of one page exceed 1 GiB");
    }
    PageValues out;
    out.owned = std::make_unique<std::string>();
    out.owned->reserve(static_cast<size_t>(total));
    std::vector<size_t> starts;
    size_t previous_start = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
        const size_t start = out.owned->size();
        out.owned->append(*out.owned, previous_start, static_cast<size_t>(prefixes[i]));  // no reallocation: reserved
        out.owned->append(suffixes[i]);
        starts.push_back(start);
        previous_start = start;
    }
    starts.push_back(out.owned->size());
    for (size_t i = 0; i < prefixes.size(); ++i) out.values.emplace_back(out.owned->data() + starts[i], starts[i + 1] - starts[i]);
    return out;
}

std::vector<std::string_view> decode_dictionary_indices(std::string_view bytes, uint64_t count, const std::vector<std::string_view>& dictionary) {
    if (count == 0) return {};
    ByteCursor in(bytes);
    const int width = static_cast<uint8_t>(in.take(1, "dictionary indices' bit width")[0]);
    HybridDecoder indices(in.rest(), width, "dictionary indices");
    std::vector<std::string_view> values;
    values.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
        const uint32_t index = indices.next();
        if (index >= dictionary.size()) fail(ErrorKind::data, "dictionary index ", index, " out of range (the dictionary holds ", dictionary.size(), " values)");
        values.push_back(dictionary[index]);
    }
    return values;
}

std::string codec_name(int32_t codec) {
    static const char* const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    if (codec >= 0 && codec < 8) return names[codec];
    return cat("codec ", codec);
}

bool codec_supported(int32_t codec) {
    const auto c = static_cast<Codec>(codec);
    return c == Codec::uncompressed || c == Codec::snappy || c == Codec::gzip || c == Codec::zstd;
}

std::string decompress_page(Codec codec, std::string_view compressed, size_t size) {
    if (!could_decompress_to(codec, compressed.size(), size)) lies(size, cat(compressed.size(), " bytes of ", codec_name(static_cast<int32_t>(codec)), " cannot hold that many"));
    switch (codec) {
        case Codec::uncompressed:
            if (compressed.size() != size) lies(size, cat("the page holds ", compressed.size(), " uncompressed"));
            return std::string(compressed);
        case Codec::snappy: return decompress_snappy(compressed, size);
        case Codec::gzip: return inflate_gzip(compressed, size);
        case Codec::zstd: return decompress_zstd(compressed, size);
        default: fail(ErrorKind::data, "the ", codec_name(static_cast<int32_t>(codec)), " codec is not supported");
    }
}

}  // namespace llmtrain::parquet

// The byte-level decoders of Parquet pages that a text column needs, over bytes in memory:
// the RLE / bit-packed hybrid (definition levels, dictionary indices), DELTA_BINARY_PACKED
// (the lengths inside the delta string encodings), PLAIN, DELTA_LENGTH_BYTE_ARRAY and
// DELTA_BYTE_ARRAY strings, and the page codecs (SNAPPY, GZIP, ZSTD).
//
// Every decoder checks each length and count against the bytes it was given and throws
// ErrorKind::data with what was wrong; the caller (parquet_reader.cpp) adds the file and the
// page. The hybrid decoder streams (a run of a billion equal values costs no memory); the
// string decoders hand out views into the page's own bytes where they can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::parquet {

// Reads a little-endian fixed-width or ULEB128 number from the front of a byte span.
class ByteCursor {
public:
    explicit ByteCursor(std::string_view bytes) : bytes_(bytes) {}
    uint64_t uleb128(const char* what);
    int64_t zigzag_varint(const char* what);
    uint32_t u32_le(const char* what);
    std::string_view take(size_t n, const char* what);
    size_t left() const { return bytes_.size() - pos_; }
    size_t position() const { return pos_; }
    std::string_view rest() const { return bytes_.substr(pos_); }

private:
    std::string_view bytes_;
    size_t pos_ = 0;
};

// The RLE / bit-packed hybrid of the specification (Encodings.md): runs of one repeated value
// and groups of 8 values packed LSB first, at bit_width bits each (0..32). Values beyond the
// last group's real count are padding; next() is only asked for the real ones.
class HybridDecoder {
public:
    HybridDecoder(std::string_view bytes, int bit_width, const char* what);
    // The next value; throws when the bytes end first.
    uint32_t next();

private:
    void start_run();
    ByteCursor cursor_;
    int bit_width_;
    const char* what_;
    uint64_t run_left_ = 0;     // values left in the current run or group
    bool packed_ = false;
    uint32_t repeated_ = 0;     // the value of an RLE run
    std::string_view packed_bytes_;
    uint64_t packed_index_ = 0;
};

// Bits needed for values 0..max_value (0 for max_value 0).
int bit_width_of(uint64_t max_value);

// DELTA_BINARY_PACKED: a header <block size> <miniblocks per block> <count> <first value>,
// then blocks of <min delta> <bit width per miniblock> <miniblocks>. Decodes every value,
// which must be expected_count of them (the page says how many: a header claiming more is
// refused before anything is allocated), and sets `end` to where the encoding ended, since
// what follows it starts there. Values are 64-bit with wrapping arithmetic, as the
// specification allows.
std::vector<int64_t> decode_delta_binary_packed(std::string_view bytes, size_t& end, uint64_t expected_count, const char* what);

// The non-null values of one data page, as views: into the page (PLAIN,
// DELTA_LENGTH_BYTE_ARRAY), into the dictionary (dictionary encodings) or into `owned`
// (DELTA_BYTE_ARRAY, whose values are rebuilt from prefixes).
struct PageValues {
    std::vector<std::string_view> values;
    std::unique_ptr<std::string> owned;
};

// `count` PLAIN BYTE_ARRAY values (4-byte length, then the bytes).
std::vector<std::string_view> decode_plain_byte_arrays(std::string_view bytes, uint64_t count);
// `count` values of DELTA_LENGTH_BYTE_ARRAY.
std::vector<std::string_view> decode_delta_length_byte_arrays(std::string_view bytes, uint64_t count);
// `count` values of DELTA_BYTE_ARRAY (prefix lengths, then the suffixes as DELTA_LENGTH_BYTE_ARRAY).
PageValues decode_delta_byte_arrays(std::string_view bytes, uint64_t count);
// `count` dictionary indices (a bit-width byte, then the hybrid), each checked against the
// dictionary's size, resolved to its value.
std::vector<std::string_view> decode_dictionary_indices(std::string_view bytes, uint64_t count, const std::vector<std::string_view>& dictionary);

enum class Codec : int32_t { uncompressed = 0, snappy = 1, gzip = 2, lzo = 3, brotli = 4, lz4 = 5, zstd = 6, lz4_raw = 7 };
// The specification's name of a codec ("SNAPPY"), or "codec N" for one it does not define.
std::string codec_name(int32_t codec);
bool codec_supported(int32_t codec);

// Decompresses a page body that must come out exactly `size` bytes long (the page header's
// uncompressed size): a stream that ends early, runs past it or could not hold that many
// bytes (its format's largest ratio) is refused as a decompressed size that lies.
std::string decompress_page(Codec codec, std::string_view compressed, size_t size);

}  // namespace llmtrain::parquet

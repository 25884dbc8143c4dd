// The byte-level decoders of Parquet pages (data/parquet_encodings.h) on the specification's
// own examples (Encodings.md) and on round trips through a small encoder written here, and
// their refusals: counts past the bytes, indices past the dictionary, sizes that lie.
#include <gtest/gtest.h>
#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/parquet_encodings.h"
#include "data/parquet_input.h"

namespace llmtrain::parquet {
namespace {

std::string bytes(std::initializer_list<int> values) {
    std::string out;
    for (int v : values) out += static_cast<char>(v);
    return out;
}

void put_uleb(std::string& out, uint64_t v) {
    do {
        out += static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
}
void put_zigzag(std::string& out, int64_t v) { put_uleb(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }

// DELTA_BINARY_PACKED with blocks of 128 values in 4 miniblocks of 32, each miniblock at the
// bit width its largest delta needs.
std::string encode_delta_binary_packed(const std::vector<int64_t>& values) {
    std::string out;
    put_uleb(out, 128);
    put_uleb(out, 4);
    put_uleb(out, values.size());
    put_zigzag(out, values.empty() ? 0 : values[0]);
    for (size_t start = 1; start < values.size(); start += 128) {
        const size_t end = std::min(values.size(), start + 128);
        int64_t min_delta = INT64_MAX;
        for (size_t i = start; i < end; ++i) min_delta = std::min(min_delta, values[i] - values[i - 1]);
        put_zigzag(out, min_delta);
        std::string widths(4, '\0'), bodies;
        for (size_t m = 0; m < 4 && start + m * 32 < end; ++m) {
            std::vector<uint64_t> relative(32, 0);
            uint64_t largest = 0;
            for (size_t j = 0; j < 32 && start + m * 32 + j < end; ++j) {
                const size_t i = start + m * 32 + j;
                relative[j] = static_cast<uint64_t>(values[i] - values[i - 1] - min_delta);
                largest = std::max(largest, relative[j]);
            }
            const int width = bit_width_of(largest);
            widths[m] = static_cast<char>(width);
            std::string body(static_cast<size_t>(32 * width / 8), '\0');
            for (size_t j = 0; j < 32; ++j)
                for (int b = 0; b < width; ++b)
                    if ((relative[j] >> b) & 1) body[(j * static_cast<size_t>(width) + static_cast<size_t>(b)) / 8] |= static_cast<char>(1 << ((j * static_cast<size_t>(width) + static_cast<size_t>(b)) % 8));
            bodies += body;
        }
        out += widths + bodies;
    }
    return out;
}

std::string delta_length(const std::vector<std::string>& values) {
    std::vector<int64_t> lengths;
    std::string data;
    for (const std::string& v : values) lengths.push_back(static_cast<int64_t>(v.size())), data += v;
    return encode_delta_binary_packed(lengths) + data;
}

std::vector<std::string> strings(const std::vector<std::string_view>& views) { return {views.begin(), views.end()}; }

TEST(ParquetEncodings, HybridDecodesTheSpecificationsBitPackedExampleThenARun) {
    // Encodings.md: 0..7 bit-packed at width 3 is 10001000 11000110 11111010; then five 6s.
    const std::string data = bytes({0x03, 0x88, 0xc6, 0xfa, 0x0a, 0x06});
    HybridDecoder decoder(data, 3, "levels");
    for (uint32_t v = 0; v < 8; ++v) EXPECT_EQ(decoder.next(), v);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(decoder.next(), 6u);
    EXPECT_THROW(decoder.next(), Error);
}

TEST(ParquetEncodings, HybridRefusesABitPackedRunPastItsBytes) {
    const std::string data = bytes({0x05, 0x88});  // two groups at width 3 need 6 bytes
    HybridDecoder decoder(data, 3, "levels");
    EXPECT_THROW(decoder.next(), Error);
}

TEST(ParquetEncodings, DeltaBinaryPackedDecodesTheSpecificationsExamples) {
    // Example 1: 1 2 3 4 5 (min delta 1, all miniblocks of width 0).
    size_t end = 0;
    const std::string one = bytes({0x80, 0x01, 0x04, 0x05, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00});
    EXPECT_EQ(decode_delta_binary_packed(one, end, 5, "x"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
    EXPECT_EQ(end, one.size());
    // Example 2: 7 5 3 1 2 3 4 5 (min delta -2; relative deltas 0 0 0 3 3 3 3 at width 2).
    const std::string two = bytes({0x80, 0x01, 0x04, 0x08, 0x0e, 0x03, 0x02, 0x00, 0x00, 0x00, 0xc0, 0x3f, 0, 0, 0, 0, 0, 0});
    EXPECT_EQ(decode_delta_binary_packed(two + "rest", end, 8, "x"), (std::vector<int64_t>{7, 5, 3, 1, 2, 3, 4, 5}));
    EXPECT_EQ(end, two.size());
}

TEST(ParquetEncodings, DeltaBinaryPackedRoundTripsAndRefusesAnotherCount) {
    std::mt19937_64 rng(7);
    std::vector<int64_t> values(1000);
    for (int64_t& v : values) v = static_cast<int64_t>(rng() % 100000) - 50000;
    const std::string encoded = encode_delta_binary_packed(values);
    size_t end = 0;
    EXPECT_EQ(decode_delta_binary_packed(encoded, end, values.size(), "x"), values);
    EXPECT_EQ(end, encoded.size());
    EXPECT_THROW(decode_delta_binary_packed(encoded, end, values.size() + 1, "x"), Error);
    EXPECT_THROW(decode_delta_binary_packed(encoded.substr(0, encoded.size() - 1), end, values.size(), "x"), Error);
}

TEST(ParquetEncodings, StringEncodingsGiveTheSameValues) {
    const std::vector<std::string> values = {"axis", "axle", "babble", "babyhood", "", "b\xc3\xa9", "b\xc3\xa9\xc3\xa9"};
    std::string plain;
    for (const std::string& v : values) {
        const uint32_t n = static_cast<uint32_t>(v.size());
        plain += std::string(reinterpret_cast<const char*>(&n), 4) + v;  // little-endian machine
    }
    EXPECT_EQ(strings(decode_plain_byte_arrays(plain, values.size())), values);
    EXPECT_EQ(strings(decode_delta_length_byte_arrays(delta_length(values), values.size())), values);
    std::vector<int64_t> prefixes{0};
    std::vector<std::string> suffixes{values[0]};
    for (size_t i = 1; i < values.size(); ++i) {
        size_t p = 0;
        while (p < values[i].size() && p < values[i - 1].size() && values[i][p] == values[i - 1][p]) ++p;
        prefixes.push_back(static_cast<int64_t>(p));
        suffixes.push_back(values[i].substr(p));
    }
    const PageValues delta = decode_delta_byte_arrays(encode_delta_binary_packed(prefixes) + delta_length(suffixes), values.size());
    EXPECT_EQ(strings(delta.values), values);
    EXPECT_THROW(decode_plain_byte_arrays(plain.substr(0, plain.size() - 1), values.size()), Error);
    prefixes[1] = 5;  // longer than the value before it
    EXPECT_THROW(decode_delta_byte_arrays(encode_delta_binary_packed(prefixes) + delta_length(suffixes), values.size()), Error);
}

TEST(ParquetEncodings, DictionaryIndicesPastTheDictionaryAreRefused) {
    const std::vector<std::string_view> dictionary = {"a", "b", "c"};
    const std::string in_range = bytes({0x02, 0x06, 0x02});  // width 2, a run of three 2s
    EXPECT_EQ(strings(decode_dictionary_indices(in_range, 3, dictionary)), (std::vector<std::string>{"c", "c", "c"}));
    const std::string past = bytes({0x02, 0x06, 0x03});
    try {
        decode_dictionary_indices(past, 3, dictionary);
        FAIL() << "index 3 of a dictionary of 3 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dictionary index 3 out of range"), std::string::npos) << e.what();
    }
}

TEST(ParquetEncodings, EveryCodecDecompressesAndRefusesASizeThatLies) {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i) + "\n";
    std::string snappy_bytes;
    snappy::Compress(text.data(), text.size(), &snappy_bytes);
    std::string zstd_bytes(ZSTD_compressBound(text.size()), '\0');
    zstd_bytes.resize(ZSTD_compress(zstd_bytes.data(), zstd_bytes.size(), text.data(), text.size(), 3));
    std::string gzip_bytes(compressBound(static_cast<uLong>(text.size())) + 32, '\0');
    z_stream z{};
    ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = reinterpret_cast<Bytef*>(text.data());
    z.avail_in = static_cast<uInt>(text.size());
    z.next_out = reinterpret_cast<Bytef*>(gzip_bytes.data());
    z.avail_out = static_cast<uInt>(gzip_bytes.size());
    ASSERT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    gzip_bytes.resize(z.total_out);
    deflateEnd(&z);
    const std::pair<Codec, std::string> cases[] = {{Codec::uncompressed, text}, {Codec::snappy, snappy_bytes}, {Codec::gzip, gzip_bytes}, {Codec::zstd, zstd_bytes}};
    for (const auto& [codec, compressed] : cases) {
        SCOPED_TRACE(codec_name(static_cast<int32_t>(codec)));
        EXPECT_EQ(decompress_page(codec, compressed, text.size()), text);
        for (const size_t lie : {text.size() - 1, text.size() + 1, text.size() * 2}) {
            try {
                decompress_page(codec, compressed, lie);
                ADD_FAILURE() << "a size of " << lie << " for " << text.size() << " bytes was accepted";
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("decompressed size lies"), std::string::npos) << e.what();
            }
        }
    }
    EXPECT_THROW(decompress_page(Codec::snappy, snappy_bytes, 1u << 30), Error);  // more than 22:1, refused before allocating
}

TEST(ParquetEncodings, CodecsAreNamedAsTheSpecificationNamesThem) {
    EXPECT_EQ(codec_name(4), "BROTLI");
    EXPECT_EQ(codec_name(7), "LZ4_RAW");
    EXPECT_EQ(codec_name(42), "codec 42");
    EXPECT_FALSE(codec_supported(5));
    EXPECT_TRUE(codec_supported(6));
}

TEST(ParquetInput, FirstInvalidUtf8FindsWhatJsonParsersRefuse) {
    EXPECT_EQ(first_invalid_utf8("plain ascii"), std::string_view::npos);
    EXPECT_EQ(first_invalid_utf8("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80"), std::string_view::npos);
    EXPECT_EQ(first_invalid_utf8("ab\xc0\x80"), 2u);          // overlong NUL
    EXPECT_EQ(first_invalid_utf8("a\xed\xa0\x80"), 1u);       // a UTF-16 surrogate
    EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u);    // past U+10FFFF
    EXPECT_EQ(first_invalid_utf8("ok\xe4\xb8"), 2u);          // cut short
    EXPECT_EQ(first_invalid_utf8("ok\x80"), 2u);              // a lone continuation byte
}

}  // namespace
}  // namespace llmtrain::parquet

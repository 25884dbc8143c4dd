// Token shards and the external formats: exact round trips, random access, and a clear
// error naming the file (and block / offset) for every kind of damage.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/external_formats.h"
#include "data/input_files.h"
#include "data/token_shard.h"

using namespace llmtrain;

namespace {

std::string temp_path(const std::string& name) { return llmtrain::test::process_temp_path(name); }

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }

ShardContents random_contents(size_t tokens, int32_t vocab, uint32_t seed) {
    std::mt19937 gen(seed);
    ShardContents c;
    for (size_t i = 0; i < tokens; ++i) {
        c.tokens.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab)));
        if (gen() % 50 == 0 || i + 1 == tokens) c.document_starts.push_back(c.tokens.size());
    }
    return c;
}

void expect_data_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
    try {
        fn();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data) << e.what();
        for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
}

const ShardWriteOptions kOptions{2, 1000, 256, 3};

}  // namespace

TEST(TokenShard, RoundTripsTokensAndDocumentStarts) {
    const ShardContents c = random_contents(5000, 1000, 1);
    const std::string path = temp_path("roundtrip.ltshard");
    write_file_atomically(path, encode_shard(c, kOptions));
    ShardReader r(path);
    EXPECT_EQ(r.read_all(), c.tokens);
    EXPECT_EQ(r.document_starts(), c.document_starts);
}

TEST(TokenShard, RandomAccessAcrossBlockEdgesMatchesTheTokens) {
    const ShardContents c = random_contents(3000, 1000, 2);
    ShardReader r("memory", encode_shard(c, kOptions));
    std::mt19937 gen(3);
    for (int trial = 0; trial < 200; ++trial) {
        const uint64_t start = gen() % 3000, count = gen() % (3000 - start + 1);
        std::vector<int32_t> got(count);
        r.read(start, count, got.data());
        EXPECT_TRUE(std::equal(got.begin(), got.end(), c.tokens.begin() + static_cast<std::ptrdiff_t>(start)));
    }
}

TEST(TokenShard, FourByteIdsHoldLargeVocabularies) {
    ShardContents c;
    c.tokens = {0, 70000, 151000, 5};
    c.document_starts = {0, 4};
    ShardReader r("big", encode_shard(c, {4, 152000, 256, 3}));
    EXPECT_EQ(r.read_all(), c.tokens);
}

TEST(TokenShard, TruncatedFileIsAnErrorNamingIt) {
    const std::string bytes = encode_shard(random_contents(2000, 1000, 4), kOptions);
    const std::string path = temp_path("truncated.ltshard");
    write_bytes(path, bytes.substr(0, bytes.size() - 10));
    expect_data_error([&] { ShardReader r(path); }, {"truncated.ltshard", "truncated"});
    write_bytes(path, bytes.substr(0, 20));
    expect_data_error([&] { ShardReader r(path); }, {"truncated.ltshard", "header alone needs 64"});
}

TEST(TokenShard, FlippedBitInABlockNamesTheBlockAndOffset) {
    std::string bytes = encode_shard(random_contents(2000, 1000, 5), kOptions);
    bytes[bytes.size() - 30] ^= 0x10;
    ShardReader r("flipped.ltshard", bytes);
    expect_data_error([&] { r.read_all(); }, {"flipped.ltshard", "block 7 at byte offset"});
}

TEST(TokenShard, FlippedBitInTheIndexFailsTheChecksum) {
    std::string bytes = encode_shard(random_contents(2000, 1000, 6), kOptions);
    bytes[70] ^= 0x01;
    expect_data_error([&] { ShardReader r("index.ltshard", bytes); }, {"index.ltshard", "checksum mismatch"});
}

TEST(TokenShard, WrongMagicIsNotAShard) {
    std::string bytes = encode_shard(random_contents(100, 1000, 7), kOptions);
    bytes[0] = 'X';
    expect_data_error([&] { ShardReader r("magic.ltshard", bytes); }, {"magic.ltshard", "wrong magic"});
}

TEST(TokenShard, TokenIdAtOrAboveVocabularyIsRefusedByTheWriter) {
    ShardContents c;
    c.tokens = {1, 2, 1000};
    c.document_starts = {0, 3};
    expect_data_error([&] { encode_shard(c, kOptions); }, {"token id 1000 at offset 2"});
}

TEST(Megatron, WrittenPairReadsBackWithDocumentBoundaries) {
    const std::string prefix = temp_path("mega");
    auto writer = make_megatron_writer(prefix, 50257);
    const std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 50256}, {7, 50256}, {50000, 4, 4, 4, 50256}};
    for (const auto& d : docs) writer->add_document(d.data(), d.size());
    writer->finish();
    auto source = open_megatron(prefix + ".bin", 50257);
    ASSERT_EQ(source->token_count(), 11u);
    std::vector<int32_t> all(11);
    source->read(0, 11, all.data());
    EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 3, 50256, 7, 50256, 50000, 4, 4, 4, 50256}));
    EXPECT_EQ(megatron_document_starts(prefix, 50257), (std::vector<uint64_t>{0, 4, 6, 11}));
    // The .idx layout: magic, version 1, dtype code 8 (uint16).
    const std::string idx = read_whole_file(prefix + ".idx");
    EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
    EXPECT_EQ(idx[17], 8);
}

TEST(Megatron, WrongMagicOrCountsAreErrorsNamingTheIndex) {
    const std::string prefix = temp_path("mega_bad");
    auto writer = make_megatron_writer(prefix, 100);
    const std::vector<int32_t> doc = {1, 2, 3};
    writer->add_document(doc.data(), doc.size());
    writer->finish();
    const std::string idx = read_whole_file(prefix + ".idx");
    std::string bad = idx;
    bad[0] = 'N';
    expect_data_error([&] { check_megatron_index("x.idx", bad, 6); }, {"x.idx", "wrong magic"});
    bad = idx;
    bad[18] = 5;  // sequence count 5 instead of 1
    expect_data_error([&] { check_megatron_index("x.idx", bad, 6); }, {"x.idx", "truncated or wrong counts"});
    expect_data_error([&] { check_megatron_index("x.idx", idx, 4); }, {"x.idx", "sequence 0", "outside the 4-byte .bin"});
    expect_data_error([&] { check_megatron_index("x.idx", idx.substr(0, 20), 6); }, {"x.idx", "truncated"});
}

TEST(Megatron, TokenIdAtOrAboveVocabularyNamesFileAndOffset) {
    const std::string prefix = temp_path("mega_vocab");
    auto writer = make_megatron_writer(prefix, 1000);
    const std::vector<int32_t> doc = {1, 2, 999};
    writer->add_document(doc.data(), doc.size());
    writer->finish();
    auto source = open_megatron(prefix, 500);
    std::vector<int32_t> out(3);
    expect_data_error([&] { source->read(0, 3, out.data()); }, {"mega_vocab.bin", "token id 999 at token offset 2"});
}

TEST(LlmC, Version1AndVersion7ShardsRoundTrip) {
    for (const uint64_t vocab : {50257ull, 200000ull}) {
        const std::string path = temp_path("llmc_" + std::to_string(vocab) + ".bin");
        auto writer = make_llmc_writer(path, vocab);
        const std::vector<int32_t> doc = {5, 6, static_cast<int32_t>(vocab - 1)};
        writer->add_document(doc.data(), doc.size());
        writer->finish();
        const std::string bytes = read_whole_file(path);
        int32_t header[3];
        std::memcpy(header, bytes.data(), sizeof header);
        EXPECT_EQ(header[0], vocab <= 65536 ? 20240520 : 20240801);
        EXPECT_EQ(header[1], vocab <= 65536 ? 1 : 7);
        EXPECT_EQ(header[2], 3);
        auto source = open_llmc(path, vocab);
        std::vector<int32_t> out(3);
        source->read(0, 3, out.data());
        EXPECT_EQ(out, doc);
    }
}

TEST(LlmC, WrongMagicAndWrongCountAreErrors) {
    std::vector<int32_t> header(256, 0);
    header[0] = 12345;
    const std::string path = temp_path("llmc_bad.bin");
    write_bytes(path, std::string(reinterpret_cast<const char*>(header.data()), 1024));
    expect_data_error([&] { open_llmc(path, 100); }, {"llmc_bad.bin", "magic 12345"});
    header[0] = 20240520;
    header[1] = 1;
    header[2] = 10;  // claims 10 tokens, holds 2
    write_bytes(path, std::string(reinterpret_cast<const char*>(header.data()), 1024) + std::string(4, '\0'));
    expect_data_error([&] { open_llmc(path, 100); }, {"llmc_bad.bin", "truncated or wrong count"});
}

TEST(NanoGpt, OddByteCountIsTruncation) {
    const std::string path = temp_path("nano.bin");
    write_bytes(path, std::string(7, '\1'));
    expect_data_error([&] { open_nanogpt(path, 1000); }, {"nano.bin", "not a whole number"});
    write_bytes(path, std::string("\x01\x00\x02\x00", 4));
    auto source = open_nanogpt(path, 1000);
    std::vector<int32_t> out(2);
    source->read(0, 2, out.data());
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2}));
}

// Found by fuzzing: an index of zero sequences (one document index, 0) is valid and must not
// hand memcpy the null data() of its empty arrays.
TEST(Megatron, IndexOfZeroSequencesIsValid) {
    std::string idx("MMIDIDX\0\0", 9);
    const uint64_t version = 1, sequences = 0, documents = 1, first = 0;
    idx.append(reinterpret_cast<const char*>(&version), 8);
    idx += static_cast<char>(8);
    idx.append(reinterpret_cast<const char*>(&sequences), 8);
    idx.append(reinterpret_cast<const char*>(&documents), 8);
    idx.append(reinterpret_cast<const char*>(&first), 8);
    EXPECT_NO_THROW(check_megatron_index("empty.idx", idx, 0));
}

// Token shards and the external formats: exact round trips, random access, and a clear
// error naming the file (and block / offset) for every kind of damage.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/dataset_verify.h"
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

namespace {

// A dataset directory of two training shards and one validation shard (blocks of 256
// tokens), the way prepare lays it out; returns its directory.
std::string write_dataset(const std::string& name, const std::vector<ShardContents>& train, const ShardContents& val) {
    const std::string dir = temp_path(name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::string manifest = R"({"format": "llmtrain-token-shards", "version": 1, "tokenizer": {"vocab_size": 1000}, "train": {"shards": [)";
    const auto add = [&](const std::string& file, const ShardContents& c, bool first) {
        const std::string bytes = encode_shard(c, kOptions);
        write_bytes(dir + "/" + file, bytes);
        manifest += cat(first ? "" : ", ", R"({"file": ")", file, R"(", "tokens": )", c.tokens.size(), R"(, "bytes": )", bytes.size(), "}");
    };
    for (size_t i = 0; i < train.size(); ++i) add(cat("train-0000", i, ".ltshard"), train[i], i == 0);
    manifest += R"(]}, "val": {"shards": [)";
    add("val-00000.ltshard", val, true);
    write_bytes(dir + "/dataset.json", manifest + "]}}");
    return dir;
}

// Flips a byte halfway through block `block`'s frame.
void flip_block(const std::string& path, uint32_t block) {
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const ShardReader reader("probe", bytes);
    uint64_t offset = bytes.size();
    for (uint32_t b = reader.block_count(); b-- > block;) offset -= reader.block_bytes(b);
    bytes[offset + reader.block_bytes(block) / 2] ^= 0x10;
    write_bytes(path, bytes);
}

}  // namespace

TEST(TokenShard, FlippedBitInABlockIsACorruptBlockErrorWithItsTokens) {
    std::string bytes = encode_shard(random_contents(2000, 1000, 5), kOptions);
    bytes[bytes.size() - 30] ^= 0x10;
    const ShardReader r("flipped.ltshard", bytes);
    std::vector<int32_t> tokens;
    try {
        r.decode_block(7, tokens);
        FAIL() << "expected a corrupt block";
    } catch (const CorruptBlockError& e) {
        EXPECT_EQ(e.shard(), "flipped.ltshard");
        EXPECT_EQ(e.block(), 7u);
        EXPECT_EQ(e.first_token(), 7u * 256);
        EXPECT_EQ(e.tokens(), 2000u - 7 * 256);
    }
    r.decode_block(6, tokens);  // the others read
    EXPECT_EQ(tokens.size(), 256u);
}

// Blocks 3 of train-00000 and 1 of val-00000 flipped: each reported once, in manifest order,
// whatever the number of ranks (their shares merged) and threads; every block counted once.
TEST(DatasetVerify, ReportsEachCorruptBlockOnceOnAnyRanksAndThreads) {
    const std::string dir = write_dataset("verify_dataset", {random_contents(3000, 1000, 7), random_contents(1000, 1000, 8)}, random_contents(600, 1000, 9));
    VerifyReport clean = verify_dataset(dir, {0, 1, 2});
    EXPECT_TRUE(clean.clean());
    EXPECT_EQ(clean.shards, 3u);
    EXPECT_EQ(clean.blocks, 12u + 4 + 3);
    EXPECT_EQ(clean.tokens, 4600u);
    flip_block(dir + "/train-00000.ltshard", 3);
    flip_block(dir + "/val-00000.ltshard", 1);
    for (int ranks : {1, 2, 3, 7})
        for (int threads : {1, 3}) {
            VerifyReport job;
            for (int rank = 0; rank < ranks; ++rank) job.merge(VerifyReport::from_json(verify_dataset(dir + "/dataset.json", {rank, ranks, threads}).to_json()));
            EXPECT_EQ(job.shards, 3u);
            EXPECT_EQ(job.blocks, 19u) << ranks << " ranks";
            ASSERT_EQ(job.corrupt.size(), 2u) << ranks << " ranks, " << threads << " threads";
            EXPECT_EQ(job.corrupt[0].block, 3);
            EXPECT_EQ(job.corrupt[0].first_token, 768u);
            EXPECT_NE(job.corrupt[0].message.find("train-00000.ltshard': block 3 at byte offset"), std::string::npos) << job.corrupt[0].message;
            EXPECT_EQ(job.corrupt[1].block, 1);
            EXPECT_NE(job.corrupt[1].shard.find("val-00000.ltshard"), std::string::npos);
        }
}

// A shard that is missing or whose index is damaged is one problem of the whole shard,
// reported by rank 0 alone; the other shards' blocks are still checked.
TEST(DatasetVerify, AShardThatCannotBeOpenedIsReportedOnce) {
    const std::string dir = write_dataset("verify_missing", {random_contents(3000, 1000, 10), random_contents(1000, 1000, 11)}, random_contents(600, 1000, 12));
    std::filesystem::remove(dir + "/train-00001.ltshard");
    VerifyReport job;
    for (int rank = 0; rank < 2; ++rank) job.merge(verify_dataset(dir, {rank, 2, 1}));
    ASSERT_EQ(job.corrupt.size(), 1u);
    EXPECT_EQ(job.corrupt[0].block, -1);
    EXPECT_NE(job.corrupt[0].message.find("train-00001.ltshard"), std::string::npos) << job.corrupt[0].message;
    EXPECT_EQ(job.blocks, 12u + 3);
}

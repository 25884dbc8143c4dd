// `prepare`: decoding every shard gives back every document byte for byte and in order
// (ASCII, multi-byte UTF-8, invalid UTF-8); the output does not depend on the thread count;
// bad inputs are clear errors.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/external_formats.h"
#include "data/input_files.h"
#include "data/prepare.h"
#include "data/token_shard.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
    const std::string dir = llmtrain::test::process_temp_path("prepare_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& bytes) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
}

const Tokenizer& tokenizer() {
    static const Tokenizer t = [] {
        BpeTrainer trainer({600, kGpt2Pattern, {"<|endoftext|>"}, 2});
        for (int i = 0; i < 30; ++i) trainer.add_text("Documents are joined by the end of text token. Ünïcödé テキスト 🙂 1234\n");
        return trainer.train("test");
    }();
    return t;
}

// Every document of the split, decoded, in shard order.
std::vector<std::string> decode_split(const std::string& dir, const std::string& split) {
    std::ifstream in(dir + "/dataset.json");
    const nlohmann::json manifest = nlohmann::json::parse(in);
    std::vector<std::string> docs;
    for (const auto& shard : manifest[split]["shards"]) {
        ShardReader reader(dir + "/" + shard["file"].get<std::string>());
        const std::vector<int32_t> tokens = reader.read_all();
        const auto& starts = reader.document_starts();
        for (size_t d = 0; d + 1 < starts.size(); ++d) {
            EXPECT_EQ(tokens[starts[d + 1] - 1], *tokenizer().end_of_text_id());
            docs.push_back(tokenizer().decode(tokens.data() + starts[d], starts[d + 1] - starts[d] - 1));
        }
    }
    return docs;
}

std::string long_document(char seed, size_t bytes) {
    std::string text;
    for (size_t i = 0; text.size() < bytes; ++i) text += std::string("Line ") + static_cast<char>('a' + (seed + i) % 26) + " of a longer document.\n";
    return text;
}

}  // namespace

TEST(Prepare, DecodedShardsGiveBackEveryDocumentExactlyAndInOrder) {
    const std::string in = temp_dir("roundtrip_in");
    const std::vector<std::string> docs = {
        "plain ASCII text\nwith two lines\n",
        "multi-byte UTF-8: Ünïcödé, 日本語のテキスト, emoji 🙂👍🏽 and 👨‍👩‍👧",
        std::string("invalid UTF-8: \xFF\xFE lone \xC3 continuation \x80 surrogate \xED\xA0\x80 end", 62),
        long_document('x', 5000),
        "<|endoftext|> inside a document stays text on decode",
    };
    PrepareOptions o;
    for (size_t i = 0; i < docs.size(); ++i) o.inputs.push_back(write_file(in, "doc" + std::to_string(i) + ".txt", docs[i]));
    o.output_dir = temp_dir("roundtrip_out");
    o.unit_bytes = 100;  // several units
    o.block_tokens = 256;
    const PrepareSummary s = prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    EXPECT_EQ(s.documents, docs.size());
    EXPECT_GT(s.units, 1u);
    EXPECT_EQ(decode_split(o.output_dir, "train"), docs);
}

TEST(Prepare, SeparatorAndJsonlSplitDocuments) {
    const std::string in = temp_dir("split_in");
    PrepareOptions o;
    o.separator = "\n%\n";
    EXPECT_EQ(split_documents("a\n%\nb\n%\n\n%\nc", o, "f", 0), (std::vector<std::string>{"a", "b", "c"}));
    o.input_format = InputFormat::jsonl;
    EXPECT_EQ(split_documents("{\"text\": \"x\\ny\"}\n{\"text\": \"z\", \"id\": 3}\n", o, "f", 0), (std::vector<std::string>{"x\ny", "z"}));
    try {
        split_documents("{\"text\": \"x\"}\n{\"body\": \"z\"}\n", o, "data.jsonl", 100);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'data.jsonl' byte offset 114: line has no string field \"text\""), std::string::npos) << e.what();
    }
}

TEST(Prepare, OutputIsByteIdenticalForAnyThreadCountAndUnitOwner) {
    const std::string in = temp_dir("threads_in");
    std::string corpus;
    for (int i = 0; i < 300; ++i) corpus += long_document(static_cast<char>(i), 100 + i % 37) + "\n%\n";
    PrepareOptions o;
    o.inputs = {write_file(in, "corpus.txt", corpus)};
    o.separator = "\n%\n";
    o.unit_bytes = 2000;
    o.val_fraction = 0.2;
    o.block_tokens = 256;
    std::vector<std::string> dirs;
    for (int threads : {1, 3}) {
        o.threads = threads;
        o.output_dir = temp_dir("threads_" + std::to_string(threads));
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
        dirs.push_back(o.output_dir);
    }
    // Two "ranks" run in turn, each doing its half of the units; the sum is the collective.
    o.threads = 1;
    o.output_dir = temp_dir("two_ranks");
    std::vector<uint64_t> partial;
    for (int rank : {1, 0}) {
        RankGroup g{rank, 2, [&](std::vector<uint64_t>& v) {
                        if (partial.empty()) { partial = v; return; }
                        for (size_t i = 0; i < v.size(); ++i) v[i] += partial[i];
                    }};
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, g);
    }
    dirs.push_back(o.output_dir);
    for (size_t d = 1; d < dirs.size(); ++d)
        for (const auto& entry : fs::directory_iterator(dirs[0]))
            EXPECT_EQ(read_whole_file(entry.path().string()), read_whole_file(dirs[d] + "/" + entry.path().filename().string())) << entry.path();
    EXPECT_FALSE(decode_split(dirs[0], "val").empty());
}

TEST(Prepare, EmptyInputIsAnError) {
    const std::string in = temp_dir("empty_in");
    PrepareOptions o;
    o.inputs = {write_file(in, "empty.txt", "")};
    o.output_dir = temp_dir("empty_out");
    try {
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("empty.txt') holds no document"), std::string::npos) << e.what();
    }
}

TEST(Prepare, MegatronLlmcAndNanoGptOutputsHoldTheSameTokensAsTheShards) {
    const std::string in = temp_dir("mega_in");
    std::string corpus;
    for (int i = 0; i < 50; ++i) corpus += long_document(static_cast<char>(i), 300) + "\n%\n";
    PrepareOptions o;
    o.inputs = {write_file(in, "corpus.txt", corpus)};
    o.separator = "\n%\n";
    o.unit_bytes = 3000;
    o.output_dir = temp_dir("mega_shards");
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    auto shards = open_shard_dataset(o.output_dir + "/dataset.json", "train", 600);
    o.output_dir = temp_dir("mega_out");
    o.output_format = OutputFormat::megatron;
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    auto mega = open_megatron(o.output_dir + "/train", 600);
    ASSERT_EQ(mega->token_count(), shards->token_count());
    std::vector<int32_t> a(shards->token_count()), b(a.size());
    shards->read(0, a.size(), a.data());
    mega->read(0, b.size(), b.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(megatron_document_starts(o.output_dir + "/train", 600).size(), 51u);
    EXPECT_FALSE(fs::exists(o.output_dir + "/train-00000.ltshard"));
    for (const OutputFormat format : {OutputFormat::llmc, OutputFormat::nanogpt}) {
        o.output_dir = temp_dir(format == OutputFormat::llmc ? "llmc_out" : "nanogpt_out");
        o.output_format = format;
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
        auto flat = format == OutputFormat::llmc ? open_llmc(o.output_dir + "/train.bin", 600) : open_nanogpt(o.output_dir + "/train.bin", 600);
        std::vector<int32_t> c(flat->token_count());
        flat->read(0, c.size(), c.data());
        EXPECT_EQ(c, a) << flat->describe();
    }
}

TEST(ShardDataset, ShardShorterThanTheManifestSaysIsAnError) {
    const std::string in = temp_dir("short_in");
    PrepareOptions o;
    o.inputs = {write_file(in, "a.txt", long_document('a', 2000))};
    o.output_dir = temp_dir("short_out");
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    const std::string shard = o.output_dir + "/train-00000.ltshard";
    const std::string bytes = read_whole_file(shard);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 1);
    try {
        open_shard_dataset(o.output_dir + "/dataset.json", "train", 600);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("train-00000.ltshard' has"), std::string::npos) << e.what();
    }
}

// `prepare`: decoding every shard gives back every document byte for byte and in order
// (ASCII, multi-byte UTF-8, invalid UTF-8); the output does not depend on the thread count;
// bad inputs are clear errors.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <barrier>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <zlib.h>
#include <zstd.h>

#include "config/config.h"
#include "core/error.h"
#include "data/batch_source.h"
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

// Ranks as threads of this process: sum_u64 is a real collective over them (every thread
// adds its vector, waits for the others, reads the total). Returns each rank's error.
std::vector<std::string> run_as_ranks(int ranks, const std::function<void(const RankGroup&)>& work) {
    std::mutex mutex;
    std::vector<uint64_t> total;
    std::barrier<> sync(ranks);
    const auto sum = [&](std::vector<uint64_t>& v) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            total.resize(v.size(), 0);
            for (size_t i = 0; i < v.size(); ++i) total[i] += v[i];
        }
        sync.arrive_and_wait();
        v = total;
        sync.arrive_and_wait();
        total.clear();  // every thread clears the same vector: harmless, and all are past reading it
        sync.arrive_and_wait();
    };
    std::vector<std::string> errors(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank)
        threads.emplace_back([&, rank] {
            try {
                work(RankGroup{rank, ranks, sum});
            } catch (const Error& e) {
                errors[static_cast<size_t>(rank)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

// Every file of a directory tree with its bytes.
std::map<std::string, std::string> tree(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) files[fs::relative(entry.path(), dir).string()] = entry.is_regular_file() ? read_whole_file(entry.path().string()) : "";
    return files;
}

// The directory's siblings: what a run left beside its output.
std::vector<std::string> siblings(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(fs::path(dir).parent_path()))
        if (entry.path().filename().string().starts_with(fs::path(dir).filename().string() + ".")) names.push_back(entry.path().filename().string());
    return names;
}

std::string corpus_of(int documents, char seed) {
    std::string corpus;
    for (int i = 0; i < documents; ++i) corpus += long_document(static_cast<char>(seed + i), 200) + "\n%\n";
    return corpus;
}

PrepareOptions small_dataset_options(const std::string& input, const std::string& output) {
    PrepareOptions o;
    o.inputs = {input};
    o.separator = "\n%\n";
    o.unit_bytes = 1000;
    o.block_tokens = 256;
    o.output_dir = output;
    return o;
}

std::string hex_hash(uint64_t hash) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
    return text;
}

template <class Work>
std::string error_of(Work&& work) {
    try {
        work();
    } catch (const Error& e) {
        return std::string(error_kind_name(e.kind())) + ": " + e.what();
    }
    return "";
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
    PrepareOptions o;
    o.separator = "\n%\n";
    EXPECT_EQ(split_documents("a\n%\nb\n%\n\n%\nc", o, "f", 1), (std::vector<std::string>{"a", "b", "c"}));
    o.input_format = InputFormat::jsonl;
    EXPECT_EQ(split_documents("{\"text\": \"x\\ny\"}\n{\"text\": \"z\", \"id\": 3}\n\n  \n", o, "f", 1), (std::vector<std::string>{"x\ny", "z"}));
    try {
        split_documents("{\"text\": \"x\"}\n{\"body\": \"z\"}\n", o, "data.jsonl", 41);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("data.jsonl:42: record has no string field \"text\""), std::string::npos) << e.what();
    }
}

TEST(Prepare, BadJsonlRecordsAreNamedByFileAndLineOrSkippedAndListed) {
    PrepareOptions o;
    o.input_format = InputFormat::jsonl;
    const std::string text = "{\"text\": \"one\"}\n{\"text\": null}\nnot json\n[1, 2]\n{\"text\": \"five\"}\n{\"text\": 6}\n";
    try {
        split_documents(text, o, "c.jsonl", 1);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("c.jsonl:2: record has no string field \"text\" (--json-key); it is null"), std::string::npos) << e.what();
    }
    o.on_bad_record = BadRecordPolicy::skip;
    std::vector<SkippedRecord> skipped;
    EXPECT_EQ(split_documents(text, o, "c.jsonl", 1, &skipped), (std::vector<std::string>{"one", "five"}));
    ASSERT_EQ(skipped.size(), 4u);
    EXPECT_EQ(skipped[0].line, 2u);
    EXPECT_EQ(skipped[1].line, 3u);
    EXPECT_NE(skipped[1].reason.find("line is not JSON"), std::string::npos);
    EXPECT_EQ(skipped[2].line, 4u);
    EXPECT_NE(skipped[2].reason.find("not an object (array)"), std::string::npos);
    EXPECT_EQ(skipped[3].line, 6u);
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
    // Two ranks, each doing its half of the units.
    o.threads = 1;
    o.output_dir = temp_dir("two_ranks");
    run_as_ranks(2, [&](const RankGroup& g) { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, g); });
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

TEST(Prepare, NonEmptyOutputIsRefusedWithoutReplaceAndLeftAsItWas) {
    const std::string in = temp_dir("refuse_in");
    const std::string out = temp_dir("refuse_out");
    PrepareOptions o = small_dataset_options(write_file(in, "a.txt", corpus_of(20, 'a')), out);
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    const auto before = tree(out);
    o.inputs = {write_file(in, "b.txt", corpus_of(3, 'b'))};
    const std::string error = error_of([&] { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{}); });
    EXPECT_NE(error.find("config error: output directory '" + out + "' is not empty"), std::string::npos) << error;
    EXPECT_NE(error.find("pass --force to replace it"), std::string::npos) << error;
    EXPECT_EQ(tree(out), before);
    EXPECT_TRUE(siblings(out).empty());
}

TEST(Prepare, ReplaceLeavesExactlyTheNewDatasetAndNothingBeside) {
    const std::string in = temp_dir("replace_in");
    const std::string out = temp_dir("replace_out");
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), small_dataset_options(write_file(in, "a.txt", corpus_of(40, 'a')), out), RankGroup{});
    // The small input prepared into an empty directory is what the replaced one must hold.
    PrepareOptions small = small_dataset_options(write_file(in, "b.txt", corpus_of(3, 'b')), temp_dir("replace_expected"));
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), small, RankGroup{});
    const auto expected = tree(small.output_dir);
    ASSERT_GT(tree(out).size(), expected.size());  // old shards that must go
    small.output_dir = out;
    small.replace = true;
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), small, RankGroup{});
    EXPECT_EQ(tree(out), expected);
    EXPECT_TRUE(siblings(out).empty()) << siblings(out).front();
}

TEST(Prepare, ErrorOnAnotherRankLeavesTheOldDatasetAndNoStagingDirectory) {
    const std::string in = temp_dir("rank_error_in");
    const std::string out = temp_dir("rank_error_out");
    std::string lines, bad_lines;
    for (int i = 0; i < 40; ++i) {
        lines += "{\"text\": \"document number " + std::to_string(1000 + i) + " of the corpus\"}\n";
        if (i == 12) bad_lines = lines + "not json\n";  // in unit 1 (about 400 bytes each)
    }
    const std::string good = write_file(in, "good.jsonl", lines);
    PrepareOptions o = small_dataset_options(good, out);
    o.input_format = InputFormat::jsonl;
    o.unit_bytes = 400;
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    const auto before = tree(out);
    // Unit 1 holds a line that is not JSON: rank 1 fails, rank 0 does its units.
    o.inputs = {write_file(in, "bad.jsonl", bad_lines)};
    o.replace = true;
    const std::vector<std::string> errors = run_as_ranks(2, [&](const RankGroup& g) { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, g); });
    EXPECT_NE(errors[0].find("failed on rank 1"), std::string::npos) << errors[0];
    EXPECT_NE(errors[1].find("line is not JSON"), std::string::npos) << errors[1];
    EXPECT_EQ(tree(out), before);
    EXPECT_TRUE(siblings(out).empty()) << siblings(out).front();
}

TEST(Prepare, ReplaceRefusesADirectoryThatHoldsNoDatasetOrHoldsAnInput) {
    const std::string out = temp_dir("not_a_dataset");
    const std::string input = write_file(out, "corpus.txt", corpus_of(3, 'c'));
    PrepareOptions o = small_dataset_options(input, out + "/");
    o.replace = true;
    std::string error = error_of([&] { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{}); });
    EXPECT_NE(error.find("input '" + input + "' lies inside the output directory"), std::string::npos) << error;
    o.inputs = {write_file(temp_dir("not_a_dataset_in"), "corpus.txt", corpus_of(3, 'c'))};
    o.output_dir = out;
    error = error_of([&] { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{}); });
    EXPECT_NE(error.find("config error: output directory '" + out + "' holds no tokenizer.json"), std::string::npos) << error;
    EXPECT_EQ(read_whole_file(input), corpus_of(3, 'c'));
}

// The dataset records the xxh3 of its tokenizer; a training run on it with another one is refused.
TEST(ShardDataset, TrainingWithAnotherTokenizerThanTheDatasetsIsRefused) {
    const std::string in = temp_dir("hash_in");
    const std::string out = temp_dir("hash_out");
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), small_dataset_options(write_file(in, "a.txt", corpus_of(30, 'a')), out), RankGroup{});
    BpeTrainer trainer({300, kGpt2Pattern, {"<|endoftext|>"}, 2});
    trainer.add_text("another corpus gives another vocabulary, another corpus");
    const Tokenizer other = trainer.train("other");
    const std::string other_path = write_file(in, "other.json", other.to_hf_json());
    const auto config = [&](const std::string& tokenizer_path) {
        std::vector<std::string> set = {"data.format=shards", "data.train_path=" + out + "/dataset.json", "model.vocab_size=600"};
        if (!tokenizer_path.empty()) set.push_back("data.tokenizer=" + tokenizer_path);
        return load_config("configs/tiny.toml", set);
    };
    EXPECT_NO_THROW(make_batch_source(config("")));
    const auto expect_refused = [&](const Config& c, const std::string& tokenizer_path) {
        const std::string error = error_of([&] { make_batch_source(c); });
        EXPECT_NE(error.find("data error: tokenizer '" + tokenizer_path + "' (xxh3 " + hex_hash(other.hash()) + ") is not the one '" + out +
                             "/dataset.json' was prepared with (xxh3 " + hex_hash(tokenizer().hash()) + ")"),
                  std::string::npos)
            << error;
    };
    expect_refused(config(other_path), other_path);
    // The dataset's own copy swapped for another tokenizer.
    write_file(out, "tokenizer.json", other.to_hf_json());
    expect_refused(config(""), out + "/tokenizer.json");
}

// A killed run leaves its staging directory (removed by the next run) or, killed between the
// two renames of a swap without exchange, the only copy of the old dataset (never removed).
TEST(Prepare, LeftoversOfAKilledRunAreClearedButAnOldDatasetAsideIsKept) {
    const std::string in = temp_dir("leftover_in");
    const std::string out = temp_dir("leftover_out");
    fs::remove(out);
    fs::create_directories(out + ".llmtrain-staging");
    write_file(out + ".llmtrain-staging", "train-00007.ltshard", "half a shard");
    const PrepareOptions o = small_dataset_options(write_file(in, "a.txt", corpus_of(3, 'a')), out);
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    EXPECT_TRUE(fs::exists(out + "/dataset.json"));
    EXPECT_TRUE(siblings(out).empty()) << siblings(out).front();
    fs::rename(out, out + ".llmtrain-old");
    const std::string error = error_of([&] { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{}); });
    EXPECT_NE(error.find("'" + fs::absolute(out).string() + ".llmtrain-old' holds the contents of '" + out + "' that an interrupted run was replacing"), std::string::npos) << error;
    EXPECT_TRUE(fs::exists(out + ".llmtrain-old/dataset.json"));
    fs::remove_all(out + ".llmtrain-old");
}

namespace {

// gzip (one member) and zstd (one frame) of bytes, made with the libraries.
std::string gzip_of(const std::string& bytes) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&z, bytes.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z.avail_in = static_cast<uInt>(bytes.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string zstd_of(const std::string& bytes) {
    std::string out(ZSTD_compressBound(bytes.size()), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3));
    return out;
}

std::string jsonl_corpus(int records) {
    std::string text;
    for (int i = 0; i < records; ++i) text += nlohmann::json{{"id", i}, {"text", long_document(static_cast<char>(i), 60 + i % 90)}}.dump() + "\n";
    return text;
}

}  // namespace

// Acceptance: .gz, .zst, .jsonl.gz, .jsonl.zst and a gzip file named .txt give the same
// dataset bytes as the same input uncompressed, on 1 rank and on 4 (several units per file,
// so the units of one compressed stream are read in turn).
TEST(Prepare, CompressedInputsGiveTheSameDatasetBytesAsPlainOnOneAndFourRanks) {
    const std::string in = temp_dir("compressed_in");
    std::string text_corpus;
    for (int i = 0; i < 120; ++i) text_corpus += long_document(static_cast<char>(i), 50 + i % 70) + "\n%\n";
    const std::string jsonl = jsonl_corpus(150);
    struct Case { std::string plain, compressed; bool jsonl; };
    const std::vector<Case> cases = {
        {write_file(in, "a.txt", text_corpus), write_file(in, "a.txt.gz", gzip_of(text_corpus)), false},
        {write_file(in, "b.txt", text_corpus), write_file(in, "b.txt.zst", zstd_of(text_corpus)), false},
        {write_file(in, "c.txt", text_corpus), write_file(in, "gzip-named-plain.txt", gzip_of(text_corpus)), false},
        {write_file(in, "d.jsonl", jsonl), write_file(in, "d.jsonl.gz", gzip_of(jsonl)), true},
        {write_file(in, "e.jsonl", jsonl), write_file(in, "e.jsonl.zst", zstd_of(jsonl)), true},
    };
    for (const Case& c : cases) {
        PrepareOptions o;
        o.input_format = InputFormat::automatic;
        o.separator = c.jsonl ? "" : "\n%\n";
        o.unit_bytes = 1500;
        o.val_fraction = 0.1;
        o.block_tokens = 256;
        o.inputs = {c.plain};
        o.output_dir = temp_dir("plain");
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
        const auto expected = tree(o.output_dir);
        ASSERT_GT(expected.size(), 4u) << "several shards";
        for (int ranks : {1, 4}) {
            o.inputs = {c.compressed};
            o.output_dir = temp_dir("compressed_" + std::to_string(ranks));
            o.threads = 2;
            const auto errors = run_as_ranks(ranks, [&](const RankGroup& g) { prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, g); });
            for (const std::string& e : errors) ASSERT_EQ(e, "") << c.compressed;
            EXPECT_EQ(tree(o.output_dir), expected) << c.compressed << " on " << ranks << " rank(s)";
        }
    }
}

TEST(Prepare, SkippedRecordsAreCountedListedAndLeaveTheTokensOfTheCleanFile) {
    const std::string in = temp_dir("skip_in");
    const std::string clean = jsonl_corpus(80);
    std::string dirty;
    std::vector<uint64_t> bad_lines;
    uint64_t line = 0;
    std::istringstream lines(clean);
    for (std::string record; std::getline(lines, record);) {
        dirty += record + "\n";
        ++line;
        if (line % 9 == 0) {
            dirty += line % 2 ? "{\"text\": null}\n" : "{broken json\n";
            bad_lines.push_back(++line);
        }
    }
    PrepareOptions o;
    o.input_format = InputFormat::jsonl;
    o.unit_bytes = 1200;
    o.block_tokens = 256;
    o.inputs = {write_file(in, "clean.jsonl", clean)};
    o.output_dir = temp_dir("skip_clean");
    prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
    const std::vector<std::string> clean_docs = decode_split(o.output_dir, "train");
    o.inputs = {write_file(in, "dirty.jsonl.zst", zstd_of(dirty))};
    o.output_dir = temp_dir("skip_abort");
    try {
        prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dirty.jsonl.zst:" + std::to_string(bad_lines[0]) + ": "), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.output_dir + "/dataset.json"));
    o.on_bad_record = BadRecordPolicy::skip;
    o.output_dir = temp_dir("skip_skip");
    const auto errors = run_as_ranks(2, [&](const RankGroup& g) {
        const PrepareSummary s = prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, g);
        EXPECT_EQ(s.skipped_records, bad_lines.size());
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    EXPECT_EQ(decode_split(o.output_dir, "train"), clean_docs);
    std::ifstream manifest_file(o.output_dir + "/dataset.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    EXPECT_EQ(manifest["skipped_records"].get<uint64_t>(), bad_lines.size());
    EXPECT_EQ(manifest["skipped_records_file"], "skipped-records.jsonl");
    std::ifstream listed(o.output_dir + "/skipped-records.jsonl");
    std::vector<uint64_t> listed_lines;
    for (std::string entry; std::getline(listed, entry);) {
        const nlohmann::json j = nlohmann::json::parse(entry);
        EXPECT_EQ(j["file"], o.inputs[0]);
        listed_lines.push_back(j["line"].get<uint64_t>());
    }
    EXPECT_EQ(listed_lines, bad_lines);
    for (const auto& entry : fs::directory_iterator(o.output_dir)) EXPECT_NE(entry.path().extension(), ".part") << "a unit's list was left behind";
}

TEST(Prepare, BinaryInputIsRefusedNamingTheFileBeforeAnyShard) {
    const std::string in = temp_dir("binary_in");
    std::string binary;
    for (int i = 0; i < 5000; ++i) binary += static_cast<char>((i * 131 + 7) % 256);
    for (const std::string& name : {"data.bin", "data.txt.gz"}) {
        PrepareOptions o;
        o.inputs = {write_file(in, name, name.ends_with(".gz") ? gzip_of(binary) : binary)};
        o.output_dir = temp_dir("binary_out");
        try {
            prepare_dataset(tokenizer(), tokenizer().to_hf_json(), o, RankGroup{});
            FAIL() << "expected an error for " << name;
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::data);
            EXPECT_NE(std::string(e.what()).find(name + "'"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("does not look like text"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(fs::is_empty(o.output_dir));
    }
}


TEST(PrepareInputs, ADirectoryStandsForItsInputFilesAtAnyDepthSortedWithoutHiddenOnes) {
    const fs::path dir = test::fresh_temp_dir("prepare_input_dir");
    fs::create_directories(dir / "sample" / "10BT");
    fs::create_directories(dir / ".cache" / "huggingface");
    for (const char* name : {"sample/10BT/001_00000.parquet", "sample/10BT/000_00000.parquet", "extra.jsonl.zst", "notes.txt", "README.md",
                             ".gitattributes", ".cache/huggingface/000_00000.parquet", "sample/.hidden.parquet"})
        std::ofstream(dir / name) << "x";
    const std::vector<std::string> files = expand_inputs({dir.string()});
    EXPECT_EQ(files, (std::vector<std::string>{(dir / "extra.jsonl.zst").string(), (dir / "notes.txt").string(), (dir / "sample/10BT/000_00000.parquet").string(),
                                               (dir / "sample/10BT/001_00000.parquet").string()}));
    fs::create_directories(dir / "empty");
    std::ofstream(dir / "empty" / "README.md") << "x";
    try {
        expand_inputs({(dir / "empty").string()});
        FAIL() << "a directory without an input file was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("holds no input file"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

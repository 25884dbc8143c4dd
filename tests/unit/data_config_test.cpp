// The [data] keys of the loader formats: blending sources, a sample tokenizer, the shard
// dataset's own validation split; each bad value is an error naming data.<key>.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <fstream>

#include "config/config.h"
#include "core/error.h"

using namespace llmtrain;
using llmtrain::test::write_temp_file;

namespace {

std::string config_text(const std::string& data_lines) {
    return "[model]\nfamily = \"gpt2\"\nn_layers = 1\nd_model = 8\nn_heads = 2\nvocab_size = 512\nmax_seq_len = 16\n"
           "[train]\nsteps = 1\nbatch_size = 1\nseq_len = 8\n[optimizer]\nlr = 0.001\n[data]\n" +
           data_lines;
}

void expect_config_error(const std::string& data_lines, const std::string& needle) {
    try {
        parse_config(config_text(data_lines), "test.toml");
        FAIL() << "expected an error containing " << needle;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(DataConfig, BlendListsEverySourceWithItsWeight) {
    const std::string a = write_temp_file("blend_a.bin", "x"), b = write_temp_file("blend_b.bin", "x"), c = write_temp_file("blend_c.bin", "x");
    const Config config = parse_config(config_text("format = \"nanogpt\"\ntrain_path = '" + a + "'\ntrain_weight = 2.0\nblend = '" + b + "=1, " + c + " = 0.5'\n"), "t.toml");
    const auto sources = training_sources(config.data);
    ASSERT_EQ(sources.size(), 3u);
    EXPECT_EQ(sources[0].path, a);
    EXPECT_EQ(sources[0].weight, 2.0);
    EXPECT_EQ(sources[2].path, c);
    EXPECT_EQ(sources[2].weight, 0.5);
}

TEST(DataConfig, MalformedBlendEntry_NamesTheKeyAndEntry) {
    const std::string a = write_temp_file("blend_a.bin", "x");
    expect_config_error("format = \"megatron\"\ntrain_path = '" + a + "'\nblend = '" + a + "=-1'\n", "test.toml: data.blend: entry");
    expect_config_error("format = \"megatron\"\ntrain_path = '" + a + "'\nblend = 'no-weight'\n", "is not PATH=WEIGHT");
    expect_config_error("format = \"llmc\"\ntrain_path = '" + a + "'\nblend = 'missing.bin=1'\n", "data.blend: no such file 'missing.bin'");
}

TEST(DataConfig, BlendNeedsALoaderFormat) {
    const std::string a = write_temp_file("blend_a.bin", "x");
    expect_config_error("format = \"text\"\ntrain_path = '" + a + "'\nblend = '" + a + "=1'\n", "data.blend: blending needs a loader format");
}

TEST(DataConfig, ShardsNeedNoValFractionAndDumpParsesBack) {
    const std::string a = write_temp_file("dataset.json", "x");
    const Config config = parse_config(config_text("format = \"shards\"\ntrain_path = '" + a + "'\nval_fraction = 0.0\nprefetch = 8\n"), "t.toml");
    EXPECT_EQ(config.data.format, DataFormat::shards);
    const Config again = parse_config(dump_config(config), "dump.toml");
    EXPECT_EQ(again.data.prefetch, 8);
    EXPECT_EQ(again.data.format, DataFormat::shards);
}

TEST(DataConfig, UnknownFormat_ListsTheAllowedOnes) {
    expect_config_error("format = \"parquet\"\ntrain_path = 'x'\n", "\"text\", \"tokens\", \"shards\", \"megatron\", \"llmc\", \"nanogpt\"");
}

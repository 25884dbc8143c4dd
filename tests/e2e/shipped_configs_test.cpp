// The configs we ship are valid. The GPU-sized ones point at token files that only exist
// on a prepared machine, so the bundled corpus stands in for them here.
#include <gtest/gtest.h>

#include <filesystem>

#include "config/config.h"
#include "core/error.h"

using namespace llmtrain;

TEST(ShippedConfigs, TinyIsValidAsShipped) {
    const Config c = load_config("configs/tiny.toml");
    EXPECT_EQ(c.model.family, ModelFamily::gpt2);
    EXPECT_EQ(c.model.vocab_size, 257);
}

TEST(ShippedConfigs, Gpt2_124mIsValidWithDataPresent) {
    const Config c = load_config("configs/gpt2-124m.toml", {"data.train_path=data/fortunes.txt", "data.val_path=data/fortunes.txt"});
    EXPECT_EQ(c.model.d_ff, 3072);
    EXPECT_TRUE(c.model.tied_embeddings);
    EXPECT_EQ(c.train.device, ComputeDevice::cuda);
    EXPECT_EQ(compute_dtype(c.train), DType::bf16);
    EXPECT_EQ(c.model.vocab_size % 128, 0);  // padded for the GEMMs by hand
    // ... so model.pad_vocab_to (default 1) adds no rows for any tp up to 128.
    EXPECT_EQ(c.model.pad_vocab_to, 1);
    for (int64_t tp = 1; tp <= 128; tp *= 2) EXPECT_EQ(c.model.padded_vocab_size(tp), c.model.vocab_size) << "tp " << tp;
}

TEST(ShippedConfigs, Llama1bIsValidWithDataPresent) {
    const Config c = load_config("configs/llama-1b.toml", {"data.train_path=data/fortunes.txt", "data.val_path=data/fortunes.txt"});
    EXPECT_EQ(c.model.n_kv_heads, 8);
    EXPECT_EQ(c.model.head_dim(), 64);
    EXPECT_EQ(c.train.device, ComputeDevice::cuda);
}

// The long-context config: the Llama-1B shape at 64k tokens, its sequences split over cp 8
// (2 x 8 equal chunks) on the native attention kernels, the ring's only ones.
TEST(ShippedConfigs, Llama1b64kIsValidWithDataPresent) {
    const Config c = load_config("configs/llama-1b-64k.toml", {"data.train_path=data/fortunes.txt", "data.val_path=data/fortunes.txt"});
    EXPECT_EQ(c.train.seq_len, 65536);
    EXPECT_EQ(c.model.max_seq_len, 65536);
    EXPECT_EQ(c.parallel.cp, 8);
    EXPECT_EQ(c.train.seq_len % (2 * c.parallel.cp), 0);
    EXPECT_EQ(c.model.attention, AttentionImpl::native);
    EXPECT_EQ(c.model.d_model, 2048);
    EXPECT_EQ(c.model.n_kv_heads, 8);
    EXPECT_TRUE(c.model.tied_embeddings);
    EXPECT_EQ(c.train.device, ComputeDevice::cuda);
}

TEST(ShippedConfigs, Gpt2_124mWithoutItsTokenFiles_NamesTheMissingFile) {
    try {
        load_config("configs/gpt2-124m.toml");
        FAIL() << "expected a data error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find("data/gpt2/train.bin"), std::string::npos) << e.what();
    }
}

// Every shipped config meant for GPUs (train.device = "cuda": run on many of them, dp derived
// from the world, or a layout of several) saves checkpoints: a month-long run's first failure
// must not lose it all. The 72B production config saves every 500 steps. configs/published
// only describes others' runs for `plan` (their data is not shipped) and configs/clusters are
// not run configs.
TEST(ShippedConfigs, EveryConfigForMoreThanOneGpu_SavesCheckpoints) {
    namespace fs = std::filesystem;
    int gpu_configs = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator("configs")) {
        if (entry.path().extension() != ".toml") continue;
        const Config c = load_config(entry.path().string(), {}, DataFiles::unchecked);
        if (c.train.device != ComputeDevice::cuda) continue;
        ++gpu_configs;
        EXPECT_GT(c.checkpoint.every_steps, 0) << entry.path() << " is for GPUs and saves no checkpoints";
        EXPECT_GE(c.checkpoint.keep_last, 2) << entry.path() << ": one kept checkpoint leaves nothing when it is damaged";
    }
    EXPECT_GE(gpu_configs, 4);
    EXPECT_EQ(load_config("configs/qwen2.5-72b.toml", {}, DataFiles::unchecked).checkpoint.every_steps, 500);
}

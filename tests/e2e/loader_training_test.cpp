// Training from a prepared shard dataset: a BPE tokenizer trained on the bundled corpus,
// `prepare` into shards, then the trainer reads them through the data loader. The run is
// bitwise reproducible and the validation loss falls.
#include <gtest/gtest.h>

#include "test_paths.h"

#include <filesystem>
#include <string>

#include "config/config.h"
#include "data/bpe_trainer.h"
#include "data/input_files.h"
#include "data/prepare.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// A directory of this process's own (CTest runs the tests of this file in parallel
// processes), removed when the process ends.
struct ScratchDir {
    std::string path = llmtrain::test::process_temp_path("loader_training_dataset");
    ScratchDir() { std::filesystem::remove_all(path); }
    ~ScratchDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

// Built once per process: tokenizer (vocab 512) + dataset of data/fortunes.txt with a 5% val split.
std::string shard_dataset() {
    static const ScratchDir scratch;
    static const std::string manifest = [] {
        const std::string dir = scratch.path;
        BpeTrainer trainer({512, kGpt2Pattern, {"<|endoftext|>"}, 2});
        trainer.add_text(read_whole_file("data/fortunes.txt"));
        const Tokenizer tokenizer = trainer.train("fortunes-512");
        PrepareOptions o;
        o.inputs = {"data/fortunes.txt"};
        o.separator = "\n%\n";
        o.output_dir = dir;
        o.val_fraction = 0.05;
        o.threads = 2;
        prepare_dataset(tokenizer, tokenizer.to_hf_json(), o, RankGroup{});
        return dir + "/dataset.json";
    }();
    return manifest;
}

Config shard_run(int64_t steps) {
    return load_config("configs/tiny.toml", {"data.format=shards", "data.train_path=" + shard_dataset(), "model.vocab_size=512", "model.n_layers=2",
                                             "model.d_model=64", "train.steps=" + std::to_string(steps), "optimizer.warmup_steps=2", "train.batch_size=8",
                                             "train.seq_len=64", "train.eval_every=0", "train.eval_sequences=128", "train.sample_tokens=24", "train.threads=2"});
}

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    return trainer.run();
}

}  // namespace

TEST(LoaderTraining, ShardRunsWithTheSameSeed_AreBitwiseIdentical) {
    const Config config = shard_run(4);
    const TrainResult a = train_quietly(config), b = train_quietly(config);
    for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(a.sample, b.sample);
}

TEST(LoaderTraining, ValidationLossFallsOnShards) {
    const TrainResult r = train_quietly(shard_run(60));
    ASSERT_EQ(r.evals.size(), 2u);
    EXPECT_GT(r.evals.front().val_loss, 5.5);  // ln(512) = 6.24 at initialization
    EXPECT_LT(r.evals.back().val_loss, r.evals.front().val_loss - 0.5);
    EXPECT_FALSE(r.sample.empty());
}

// The shard loader's validation sequences do not depend on the micro-batch size either:
// 8 at a time and 3 at a time (a last micro-batch of 2) give the same loss at step 0.
TEST(LoaderTraining, ValidationLossAtStepZero_IsTheSameForEveryMicroBatchSize) {
    std::vector<double> val_losses;
    for (const int64_t batch : {8, 3}) {
        Config config = shard_run(1);
        config.train.batch_size = batch;
        config.train.eval_sequences = 8;
        config.train.sample_tokens = 0;
        val_losses.push_back(Trainer(config, TrainerOptions{.dtype = DType::f64, .quiet = true}).run().evals.front().val_loss);
    }
    EXPECT_NEAR(val_losses[1], val_losses[0], 1e-9 * val_losses[0]);
}

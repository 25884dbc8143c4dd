// Training end to end on the bundled corpus: runs are bitwise reproducible, and the
// shipped tiny config learns (validation loss from ~5.5 to under 2.5 nats per byte).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true});
    return trainer.run();
}

Config small_run(const std::string& family) {
    return load_config("configs/tiny.toml", {"model.family=\"" + family + "\"", "model.n_layers=2", "model.d_model=32", "train.steps=6", "optimizer.warmup_steps=2",
                                             "train.batch_size=4", "train.seq_len=32", "train.grad_accum=2", "train.eval_sequences=8",
                                             "train.sample_tokens=16", "train.threads=2"});
}

void expect_bitwise_identical_runs(const Config& config) {
    const TrainResult a = train_quietly(config), b = train_quietly(config);
    test::expect_bitwise_identical(a, b);
    EXPECT_EQ(a.sample, b.sample);
}

}  // namespace

TEST(Training, Gpt2RunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_runs(small_run("gpt2")); }

TEST(Training, LlamaRunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_runs(small_run("llama")); }

TEST(Training, AnotherSeed_GivesAnotherRun) {
    Config other = small_run("gpt2");
    other.train.seed += 1;
    EXPECT_NE(train_quietly(small_run("gpt2")).steps[0].loss, train_quietly(other).steps[0].loss);
}

TEST(Training, TinyConfig_ValidationLossFallsFromAbout5p5ToUnder2p5) {
    const Config config = load_config("configs/tiny.toml", {"train.threads=2"});
    const TrainResult r = train_quietly(config);
    ASSERT_GE(r.evals.size(), 2u);
    EXPECT_GT(r.evals.front().val_loss, 5.0);   // ln(257) = 5.55 at initialization
    EXPECT_LT(r.evals.back().val_loss, 2.5);
    EXPECT_FALSE(r.sample.empty());
    std::printf("tiny: val loss %.4f -> %.4f, %.0f tokens/s, %.0f%% of step time in GEMMs\n", r.evals.front().val_loss,
                r.evals.back().val_loss, r.tokens_per_second, 100 * r.gemm_fraction);
}

// The validation set is train.eval_sequences sequences whatever the micro-batch size: 1, 2,
// 4 (a last micro-batch of 2) and 6 sequences at a time give the same loss at step 0, to
// f64's rounding.
TEST(Training, ValidationLossAtStepZero_IsTheSameForEveryMicroBatchSize) {
    double reference = 0;
    for (const int64_t batch : {6, 1, 2, 4}) {
        Config config = small_run("gpt2");
        config.train.steps = 1;
        config.train.grad_accum = 1;
        config.train.batch_size = batch;
        config.train.eval_sequences = 6;
        config.train.sample_tokens = 0;
        const double val_loss = Trainer(config, TrainerOptions{.dtype = DType::f64, .quiet = true}).run().evals.front().val_loss;
        if (batch == 6) reference = val_loss;
        EXPECT_NEAR(val_loss, reference, 1e-9 * reference) << "batch_size " << batch;
    }
}

// train.eval_every, as the key reference says: a fresh run evaluates before its first step and
// after its last, and with N > 0 after every N-th step too; 0 adds none in between.
TEST(Training, EvalEvery_EvaluatesAtStepZeroEveryNthStepAndTheLast) {
    const auto eval_steps = [](int64_t every) {
        Config config = small_run("gpt2");
        config.train.eval_every = every;
        config.train.sample_tokens = 0;
        std::vector<int64_t> steps;
        for (const EvalRecord& e : train_quietly(config).evals) steps.push_back(e.step);
        return steps;
    };
    EXPECT_EQ(eval_steps(0), (std::vector<int64_t>{0, 6}));
    EXPECT_EQ(eval_steps(4), (std::vector<int64_t>{0, 4, 6}));
    EXPECT_EQ(eval_steps(3), (std::vector<int64_t>{0, 3, 6}));
}

// A smoke run shorter than the config's warmup: the learning rate rises over the whole run
// to the peak at the last step instead of being refused.
TEST(Training, RunShorterThanWarmup_WarmsUpOverTheWholeRun) {
    Config config = small_run("gpt2");
    config.train.steps = 3;
    config.optimizer.warmup_steps = 30;
    config.train.sample_tokens = 0;
    const TrainResult r = train_quietly(config);
    ASSERT_EQ(r.steps.size(), 3u);
    EXPECT_DOUBLE_EQ(r.steps[0].lr, config.optimizer.lr / 3);
    EXPECT_DOUBLE_EQ(r.steps[2].lr, config.optimizer.lr);
}

// Recomputation rebuilds bitwise what the forward kept: the run does not change, for either
// family, while the planned activation memory shrinks.
TEST(Training, SelectiveAndFullRecompute_GiveBitwiseTheSameRunWithLessActivationMemory) {
    for (const std::string family : {"gpt2", "llama"}) {
        Config none = small_run(family);
        none.train.sample_tokens = 0;
        none.train.steps = 3;
        const TrainResult base = train_quietly(none);
        size_t previous_bytes = Trainer(none, TrainerOptions{.dtype = DType::f32, .quiet = true}).memory().activation_bytes;
        for (const Recompute mode : {Recompute::selective, Recompute::full}) {
            Config config = none;
            config.train.recompute = mode;
            test::expect_bitwise_identical(train_quietly(config), base, family + " " + recompute_name(mode));
            const size_t bytes = Trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true}).memory().activation_bytes;
            EXPECT_LT(bytes, previous_bytes) << family << " " << recompute_name(mode);
            previous_bytes = bytes;
        }
    }
}

// model.pad_vocab_to only adds masked rows: on one process, the tiny config's 257 classes
// padded to 320 rows train the same run as the unpadded 257 (losses, gradient norms,
// validation loss and the sample). 1e-6 relative is far below what an unmasked padding
// would move: 63 extra classes at logit 0 add about log(1 + 63/257) = 0.2 nats at the start.
TEST(Training, PaddedVocabulary_TrainsTheSameRunAsTheUnpaddedOne) {
    for (const std::string family : {"gpt2", "llama"}) {
        SCOPED_TRACE(family);
        const Config plain = small_run(family);
        Config padded = plain;
        padded.model.pad_vocab_to = 64;
        ASSERT_EQ(padded.model.padded_vocab_size(1), 320);
        const TrainResult a = train_quietly(plain), b = train_quietly(padded);
        ASSERT_EQ(a.steps.size(), b.steps.size());
        for (size_t i = 0; i < a.steps.size(); ++i) {
            EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 1e-6 * a.steps[i].loss) << "step " << i + 1;
            EXPECT_NEAR(b.steps[i].grad_norm, a.steps[i].grad_norm, 1e-6 * a.steps[i].grad_norm) << "step " << i + 1;
        }
        EXPECT_NEAR(b.evals.back().val_loss, a.evals.back().val_loss, 1e-6 * a.evals.back().val_loss);
        EXPECT_EQ(b.sample, a.sample);
    }
}

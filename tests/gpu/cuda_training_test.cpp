// Training on CUDA against the CPU: a tiny GPT-2 and a tiny Llama (GQA, RoPE, SwiGLU,
// QKV bias) take 10 steps on both backends from the same initial weights and data; the
// bf16 run's losses track the fp32 ones, and two CUDA runs are bitwise identical.
// Skipped (and counted skipped) without a GPU or a CUDA build.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// Head dimension 64: what the flash-attention kernels take.
Config tiny_run(const std::string& family, const std::string& device, const std::string& recompute = "none") {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=2", "model.d_model=128", "model.n_heads=2",
                                          "train.steps=10", "optimizer.warmup_steps=2", "train.batch_size=4", "train.seq_len=64",
                                          "train.grad_accum=2", "train.eval_batches=2", "train.sample_tokens=0", "train.threads=2",
                                          "train.device=\"" + device + "\"", "train.recompute=\"" + recompute + "\""};
    if (family == "llama") {
        overrides.push_back("model.n_kv_heads=1");
        overrides.push_back("model.qkv_bias=true");
    }
    return load_config("configs/tiny.toml", overrides);
}

// Constructing the CUDA backend is the test of whether this machine and build have one.
void skip_without_gpu() {
    try {
        make_cuda_backend(0);
    } catch (const Error& e) {
        GTEST_SKIP() << "no GPU: " << e.what();
    }
}

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{"", std::nullopt, true});
    return trainer.run();
}

// bf16 keeps 8 bits of mantissa: activations round at 2^-9 relative, and over 10 steps the
// runs drift apart a little. 2% of the loss (about 0.1 nats at 5.5) bounds that drift while
// any real error (a wrong gradient, a missed accumulation) moves the loss by far more.
void expect_cuda_tracks_cpu(const std::string& family) {
    skip_without_gpu();
    if (testing::Test::IsSkipped()) return;
    const TrainResult cpu = train_quietly(tiny_run(family, "cpu")), gpu = train_quietly(tiny_run(family, "cuda"));
    ASSERT_EQ(cpu.steps.size(), gpu.steps.size());
    for (size_t i = 0; i < cpu.steps.size(); ++i) {
        EXPECT_TRUE(std::isfinite(gpu.steps[i].loss)) << "step " << i + 1;
        EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 0.02 * cpu.steps[i].loss) << "step " << i + 1;
        EXPECT_NEAR(gpu.steps[i].grad_norm, cpu.steps[i].grad_norm, 0.05 * cpu.steps[i].grad_norm + 0.01) << "step " << i + 1;
    }
    EXPECT_LT(gpu.steps.back().loss, gpu.steps.front().loss);
}

void expect_bitwise_identical_cuda_runs(const Config& config) {
    skip_without_gpu();
    if (testing::Test::IsSkipped()) return;
    const TrainResult a = train_quietly(config), b = train_quietly(config);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
        EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
        EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
    }
    EXPECT_EQ(a.evals.back().val_loss, b.evals.back().val_loss);
}

}  // namespace

TEST(CudaTraining, Gpt2Bf16Losses_TrackCpuFp32For10Steps) { expect_cuda_tracks_cpu("gpt2"); }

TEST(CudaTraining, LlamaBf16Losses_TrackCpuFp32For10Steps) { expect_cuda_tracks_cpu("llama"); }

TEST(CudaTraining, Gpt2RunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_cuda_runs(tiny_run("gpt2", "cuda")); }

TEST(CudaTraining, LlamaRunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_cuda_runs(tiny_run("llama", "cuda")); }

TEST(CudaTraining, FullRecompute_GivesBitwiseTheSameLosses) {
    skip_without_gpu();
    if (IsSkipped()) return;
    const TrainResult none = train_quietly(tiny_run("llama", "cuda")), full = train_quietly(tiny_run("llama", "cuda", "full"));
    for (size_t i = 0; i < none.steps.size(); ++i) EXPECT_EQ(none.steps[i].loss, full.steps[i].loss) << "step " << i + 1;
}

TEST(CudaTraining, Fp16WithLossScaling_TracksCpu) {
    skip_without_gpu();
    if (IsSkipped()) return;
    Config fp16 = tiny_run("gpt2", "cuda");
    fp16.train.precision = Precision::fp16;
    const TrainResult cpu = train_quietly(tiny_run("gpt2", "cpu")), gpu = train_quietly(fp16);
    for (size_t i = 0; i < cpu.steps.size(); ++i) {
        if (gpu.steps[i].skipped) continue;  // a loss-scale overflow
        EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 0.02 * cpu.steps[i].loss) << "step " << i + 1;
    }
}

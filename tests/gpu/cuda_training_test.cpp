// Training on CUDA against the CPU: a tiny GPT-2 and a tiny Llama (GQA, RoPE, SwiGLU,
// QKV bias) take 10 steps on both backends from the same initial weights and data; the
// bf16 run's losses track the fp32 ones, and two CUDA runs are bitwise identical.
// Skipped (and counted skipped) without a GPU or a CUDA build.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "gpu/gpu_test_util.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

Config tiny_run(const std::string& family, const std::string& device, const std::string& recompute = "none") {
    return test::tiny_cuda_shaped_run(family, device, 4, 64, {"train.recompute=\"" + recompute + "\""});
}

// Constructing the CUDA backend is the test of whether this machine and build have one:
// skipped without a visible GPU, failed when one is visible but refused.
void skip_without_gpu() {
    std::unique_ptr<Backend> probe;
    gpu_test::make_cuda_backend_or_skip(probe);
}

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = std::nullopt, .quiet = true});
    return trainer.run();
}

void expect_cuda_tracks_cpu(const std::string& family) {
    skip_without_gpu();
    if (testing::Test::IsSkipped() || testing::Test::HasFatalFailure()) return;
    test::expect_tracks_cpu(train_quietly(tiny_run(family, "cuda")), train_quietly(tiny_run(family, "cpu")));
}

void expect_bitwise_identical_cuda_runs(const Config& config) {
    skip_without_gpu();
    if (testing::Test::IsSkipped() || testing::Test::HasFatalFailure()) return;
    test::expect_bitwise_identical(train_quietly(config), train_quietly(config));
}

}  // namespace

TEST(CudaTraining, Gpt2Bf16Losses_TrackCpuFp32For10Steps) { expect_cuda_tracks_cpu("gpt2"); }

TEST(CudaTraining, LlamaBf16Losses_TrackCpuFp32For10Steps) { expect_cuda_tracks_cpu("llama"); }

TEST(CudaTraining, Gpt2RunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_cuda_runs(tiny_run("gpt2", "cuda")); }

TEST(CudaTraining, LlamaRunsWithTheSameSeed_AreBitwiseIdentical) { expect_bitwise_identical_cuda_runs(tiny_run("llama", "cuda")); }

TEST(CudaTraining, FullRecompute_GivesBitwiseTheSameLosses) {
    skip_without_gpu();
    if (IsSkipped() || HasFatalFailure()) return;
    test::expect_bitwise_identical(train_quietly(tiny_run("llama", "cuda", "full")), train_quietly(tiny_run("llama", "cuda")), "full recompute");
}

TEST(CudaTraining, Fp16WithLossScaling_TracksCpu) {
    skip_without_gpu();
    if (IsSkipped() || HasFatalFailure()) return;
    Config fp16 = tiny_run("gpt2", "cuda");
    fp16.train.precision = Precision::fp16;
    test::expect_tracks_cpu(train_quietly(fp16), train_quietly(tiny_run("gpt2", "cpu")));
}

// Training on CUDA against the CPU: a tiny GPT-2 and a tiny Llama (GQA, RoPE, SwiGLU,
// QKV bias) take 10 steps on both backends from the same initial weights and data; the
// bf16 run's losses track the fp32 ones, and two CUDA runs are bitwise identical. Each
// test runs with cuDNN's fused attention and with the native kernels (Attention/...).
// Skipped (and counted skipped) without a GPU or a CUDA build, the cuDNN runs without libcudnn.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "gpu/gpu_test_util.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// The runs under test take the attention kernels of the test's parameter (cudnn or native).
Config tiny_run(const std::string& family, const std::string& device, const std::string& attention, const std::string& recompute = "none") {
    return test::tiny_cuda_shaped_run(family, device, 4, 64, {"train.recompute=\"" + recompute + "\"", "model.attention=\"" + attention + "\""});
}

TrainResult train_quietly(const Config& config) {
    Trainer trainer(config, TrainerOptions{.dtype = std::nullopt, .quiet = true});
    return trainer.run();
}

// Constructing the CUDA backend is the test of whether this machine and build have one (and
// libcudnn, for the cudnn runs): skipped without, failed when a GPU is visible but refused.
class CudaTraining : public testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        std::unique_ptr<Backend> probe;
        gpu_test::make_cuda_backend_or_skip(probe, GetParam() == "cudnn" ? AttentionImpl::cudnn : AttentionImpl::native);
    }
    Config run(const std::string& family, const std::string& recompute = "none") const { return tiny_run(family, "cuda", GetParam(), recompute); }
    static Config cpu_run(const std::string& family) { return tiny_run(family, "cpu", "auto"); }
};

}  // namespace

TEST_P(CudaTraining, Gpt2Bf16Losses_TrackCpuFp32For10Steps) { test::expect_tracks_cpu(train_quietly(run("gpt2")), train_quietly(cpu_run("gpt2"))); }

TEST_P(CudaTraining, LlamaBf16Losses_TrackCpuFp32For10Steps) { test::expect_tracks_cpu(train_quietly(run("llama")), train_quietly(cpu_run("llama"))); }

TEST_P(CudaTraining, Gpt2RunsWithTheSameSeed_AreBitwiseIdentical) { test::expect_bitwise_identical(train_quietly(run("gpt2")), train_quietly(run("gpt2"))); }

TEST_P(CudaTraining, LlamaRunsWithTheSameSeed_AreBitwiseIdentical) {
    test::expect_bitwise_identical(train_quietly(run("llama")), train_quietly(run("llama")));
}

TEST_P(CudaTraining, FullRecompute_GivesBitwiseTheSameLosses) {
    test::expect_bitwise_identical(train_quietly(run("llama", "full")), train_quietly(run("llama")), "full recompute");
}

TEST_P(CudaTraining, Fp16WithLossScaling_TracksCpu) {
    Config fp16 = run("gpt2");
    fp16.train.precision = Precision::fp16;
    test::expect_tracks_cpu(train_quietly(fp16), train_quietly(cpu_run("gpt2")));
}

INSTANTIATE_TEST_SUITE_P(Attention, CudaTraining, testing::Values("cudnn", "native"), [](const testing::TestParamInfo<std::string>& attention) { return attention.param; });

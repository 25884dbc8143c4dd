// The CUDA path's host side, on every machine: training runs on a CPU stand-in of the CUDA
// backend (tests/support/emulated_cuda_backend.h) that keeps its memory and dtype contract.
// bf16 mixed precision must track the fp32 CPU run, fp16 loss scaling must train, and
// recomputation must not change the run. What this cannot show is the kernels' own
// correctness and speed: tests/gpu does that on a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "support/emulated_cuda_backend.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// Head dimension 64, as the flash kernels take; the same run as tests/gpu's.
Config tiny_run(const std::string& family, const std::string& device, const std::string& precision = "auto",
                const std::string& recompute = "none") {
    std::vector<std::string> overrides = {"model.family=\"" + family + "\"", "model.n_layers=2", "model.d_model=128", "model.n_heads=2",
                                          "train.steps=10", "optimizer.warmup_steps=2", "train.batch_size=2", "train.seq_len=32",
                                          "train.grad_accum=2", "train.eval_batches=1", "train.sample_tokens=8", "train.threads=1",
                                          "train.device=\"" + device + "\"", "train.precision=\"" + precision + "\"",
                                          "train.recompute=\"" + recompute + "\""};
    if (family == "llama") {
        overrides.push_back("model.n_kv_heads=1");
        overrides.push_back("model.qkv_bias=true");
    }
    return load_config("configs/tiny.toml", overrides);
}

TrainerOptions quiet_options(bool emulated) {
    TrainerOptions options{"", std::nullopt, true};
    if (emulated) options.make_backend = [](int) { return test::make_emulated_cuda_backend(); };
    return options;
}

TrainResult train(const Config& config) {
    Trainer trainer(config, quiet_options(config.train.device == ComputeDevice::cuda));
    return trainer.run();
}

// bf16 rounds activations at 2^-8 relative; 2% of the loss bounds the drift over 10 steps,
// while a wrong gradient or a stale compute copy moves it by far more.
void expect_tracks_cpu(const TrainResult& cuda, const TrainResult& cpu) {
    ASSERT_EQ(cuda.steps.size(), cpu.steps.size());
    for (size_t i = 0; i < cpu.steps.size(); ++i) {
        if (cuda.steps[i].skipped) continue;  // an fp16 overflow
        EXPECT_NEAR(cuda.steps[i].loss, cpu.steps[i].loss, 0.02 * cpu.steps[i].loss) << "step " << i + 1;
        EXPECT_NEAR(cuda.steps[i].grad_norm, cpu.steps[i].grad_norm, 0.05 * cpu.steps[i].grad_norm + 0.01) << "step " << i + 1;
    }
    EXPECT_LT(cuda.steps.back().loss, cuda.steps.front().loss);
    EXPECT_NEAR(cuda.evals.back().val_loss, cpu.evals.back().val_loss, 0.02 * cpu.evals.back().val_loss);
}

}  // namespace

TEST(EmulatedCudaTraining, Gpt2Bf16_TracksCpuFp32AndKeepsF32MasterWeights) {
    const Config config = tiny_run("gpt2", "cuda");
    Trainer trainer(config, quiet_options(true));
    const Parameters& p = trainer.model().parameters();
    EXPECT_EQ(trainer.compute_dtype(), DType::bf16);
    EXPECT_EQ(p.dtype(), DType::f32);
    EXPECT_EQ(p.compute_dtype(), DType::bf16);
    EXPECT_EQ(p.device(), Device::cuda);
    const TrainResult cuda = trainer.run();
    expect_tracks_cpu(cuda, train(tiny_run("gpt2", "cpu")));
    EXPECT_FALSE(cuda.sample.empty());  // sampling reads 16-bit device logits
}

TEST(EmulatedCudaTraining, LlamaBf16_TracksCpuFp32) { expect_tracks_cpu(train(tiny_run("llama", "cuda")), train(tiny_run("llama", "cpu"))); }

TEST(EmulatedCudaTraining, Fp16WithDynamicLossScaling_TracksCpuFp32) {
    const TrainResult fp16 = train(tiny_run("gpt2", "cuda", "fp16"));
    EXPECT_EQ(fp16.steps.front().loss_scale, 65536);
    expect_tracks_cpu(fp16, train(tiny_run("gpt2", "cpu")));
}

TEST(EmulatedCudaTraining, SelectiveAndFullRecompute_GiveBitwiseTheSameRun) {
    const TrainResult none = train(tiny_run("llama", "cuda"));
    for (const std::string mode : {"selective", "full"}) {
        const TrainResult r = train(tiny_run("llama", "cuda", "auto", mode));
        for (size_t i = 0; i < none.steps.size(); ++i) {
            EXPECT_EQ(r.steps[i].loss, none.steps[i].loss) << mode << " step " << i + 1;
            EXPECT_EQ(r.steps[i].grad_norm, none.steps[i].grad_norm) << mode << " step " << i + 1;
        }
    }
}

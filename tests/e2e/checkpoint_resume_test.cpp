// Bit-exact resume in process, on the CUDA path's host side (the CPU stand-in of the CUDA
// backend): a bf16 run's compute copy is rebuilt from the f32 master weights, and an fp16
// run's dynamic loss scale is restored; on the CPU, a run with packed documents (their
// starts come from each micro-batch's tokens: nothing to save). A run abandoned after step 12 without a final save
// (as a killed one is) and resumed from its latest checkpoint must give the uninterrupted
// run's losses, gradient norms and final master weights, bit for bit.
#include <gtest/gtest.h>

#include <csignal>
#include <deque>
#include <filesystem>
#include <optional>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "support/stand_in_cuda_backend.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

struct Outcome {
    std::deque<StepRecord> steps;
    std::vector<EvalRecord> evals;
    std::vector<float> master_weights;
};

class StepCounter : public StepObserver {
public:
    void after_step(const StepRecord& s) override { last = s.step; }
    int64_t last = 0;
};

// Trains with a synchronous checkpoint every 5 steps into dir, from dir's latest checkpoint
// when resume is set, and gives up after step abandon_after (0: never) without saving.
Outcome train_checkpointed(Config config, const std::string& dir, bool resume, int64_t abandon_after) {
    config.checkpoint.dir = dir;
    config.checkpoint.every_steps = 5;
    config.checkpoint.async = false;
    StepCounter counter;
    TrainerOptions options{.dtype = std::nullopt, .quiet = true};
    const bool cpu = config.train.device == ComputeDevice::cpu;
    options.make_backend = [cpu](int) { return cpu ? make_cpu_backend(1) : test::make_stand_in_cuda_backend(); };
    options.stop_signal = [&] { return abandon_after > 0 && counter.last >= abandon_after ? SIGKILL : 0; };
    Trainer trainer(config, options);
    if (resume) {
        const std::optional<std::string> latest = latest_checkpoint(dir);
        EXPECT_TRUE(latest.has_value());
        trainer.restore(*latest, read_checkpoint_manifest(*latest));
    }
    const ParallelContext& ctx = trainer.context();
    CheckpointerHooks hooks;
    hooks.capture = [&](int64_t step, RankSnapshot& out) { capture_snapshot(trainer.snapshot_source(), step, out); };
    hooks.manifest = [&](int64_t step) { return trainer.manifest_at(step); };
    Checkpointer checkpointer(config.checkpoint, *ctx.world, FileAttributes{0, 0, 1, 1, 1, 1}, hooks);
    trainer.observe(checkpointer);
    trainer.observe(counter);
    Outcome outcome;
    const TrainResult result = trainer.run();
    outcome.steps = result.steps;
    outcome.evals = result.evals;
    const Tensor master = trainer.model().parameters().all_values();
    outcome.master_weights.resize(static_cast<size_t>(master.numel()));
    trainer.backend().copy_to_host(outcome.master_weights.data(), master);
    return outcome;
}

void expect_resume_is_bitwise_uninterrupted(const Config& config, const std::string& name) {
    const std::string root = testing::TempDir() + "checkpoint_resume_" + name + "_" + std::to_string(::getpid());
    std::filesystem::remove_all(root);
    const Outcome uninterrupted = train_checkpointed(config, root + "/a", false, 0);
    const Outcome abandoned = train_checkpointed(config, root + "/b", false, 12);
    ASSERT_EQ(abandoned.steps.size(), 12u);
    const Outcome resumed = train_checkpointed(config, root + "/b", true, 0);
    ASSERT_EQ(resumed.steps.size(), 10u);  // steps 11..20, from the checkpoint of step 10
    for (size_t i = 0; i < resumed.steps.size(); ++i) {
        const StepRecord& want = uninterrupted.steps[10 + i];
        EXPECT_EQ(resumed.steps[i].step, want.step);
        EXPECT_EQ(resumed.steps[i].loss, want.loss) << name << " step " << want.step;
        EXPECT_EQ(resumed.steps[i].grad_norm, want.grad_norm) << name << " step " << want.step;
        EXPECT_EQ(resumed.steps[i].loss_scale, want.loss_scale) << name << " step " << want.step;
    }
    EXPECT_EQ(resumed.master_weights, uninterrupted.master_weights) << name;
    // No evaluation falls between (train.eval_every 100 > 20 steps): the resumed run evaluates
    // after its last step only (step 0 was the first attempt's), to the uninterrupted value.
    ASSERT_EQ(resumed.evals.size(), 1u) << name;
    EXPECT_EQ(resumed.evals[0].step, 20) << name;
    ASSERT_EQ(uninterrupted.evals.size(), 2u) << name;
    EXPECT_EQ(resumed.evals[0].val_loss, uninterrupted.evals[1].val_loss) << name;
    std::filesystem::remove_all(root);
}

}  // namespace

TEST(CheckpointResume, StandInCudaGpt2Bf16_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(test::tiny_cuda_shaped_run("gpt2", "cuda", 2, 32, {"train.steps=20", "train.sample_tokens=0"}), "gpt2_bf16");
}

TEST(CheckpointResume, StandInCudaLlamaFp16_RestoresTheLossScaleBitwise) {
    expect_resume_is_bitwise_uninterrupted(
        test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, {"train.steps=20", "train.sample_tokens=0", "train.precision=\"fp16\"", "train.loss_scale_window=3"}),
        "llama_fp16");
}

// FP8 under current scaling keeps no state across steps but the weights' casts, which a
// resumed run makes again from the restored weights at their first use: on the CPU's
// emulation in f32 and on the CUDA path's host side in bf16 (FP8 GEMMs into bf16 and f32).
TEST(CheckpointResume, CpuGpt2Fp8CurrentScaling_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, {"train.steps=20", "train.sample_tokens=0", "train.precision=\"fp8\"",
                                                                                             "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"}),
                                           "gpt2_fp8");
}

TEST(CheckpointResume, StandInCudaLlamaFp8CurrentScaling_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, {"train.steps=20", "train.sample_tokens=0", "train.precision=\"fp8\"",
                                                                                               "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"}),
                                           "llama_fp8_bf16");
}

TEST(CheckpointResume, CpuLlamaDocumentMask_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(
        test::tiny_cuda_shaped_run("llama", "cpu", 2, 32, {"train.steps=20", "train.sample_tokens=0", "data.attention_mask=\"document\"",
                                                           "data.reset_position_ids=true", "data.document_separator=\" \""}),
        "llama_document_mask");
}

// Mixture of experts with DeepSeek-V3's expert bias: the biases (moved after every step)
// are saved in the manifest and restored exactly, so the resumed run routes as the
// uninterrupted one did; on the CPU in f32 and on the CUDA path's host side in bf16.
TEST(CheckpointResume, CpuMoeWithExpertBias_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(
        test::tiny_cuda_shaped_run("llama", "cpu", 2, 32, {"train.steps=20", "train.sample_tokens=0", "model.moe.n_experts=4", "model.moe.top_k=2",
                                                           "model.moe.d_ff_expert=64", "model.moe.router=\"sigmoid\"",
                                                           "model.moe.load_balancing=\"expert_bias\"", "model.moe.bias_update_rate=0.01"}),
        "moe_expert_bias");
}

TEST(CheckpointResume, StandInCudaMoeBf16_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(
        test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, {"train.steps=20", "train.sample_tokens=0", "model.moe.n_experts=4", "model.moe.top_k=2",
                                                            "model.moe.d_ff_expert=64", "model.moe.load_balancing=\"expert_bias\"",
                                                            "model.moe.z_loss_coeff=0.001"}),
        "moe_bf16");
}

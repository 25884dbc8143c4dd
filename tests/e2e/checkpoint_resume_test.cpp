// Bit-exact resume in process, on the CUDA path's host side (the CPU stand-in of the CUDA
// backend): a bf16 run's compute copy is rebuilt from the f32 master weights, and an fp16
// run's dynamic loss scale is restored; on the CPU, a run with packed documents (their
// starts come from each micro-batch's tokens: nothing to save). A run abandoned after step 12 without a final save
// (as a killed one is) and resumed from its latest checkpoint must give the uninterrupted
// run's losses, gradient norms and final master weights, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
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

// The delayed recipe's amax histories and scales are training state: saved with the
// checkpoint and restored bit-exact, so the resumed run's first step casts with the scales of
// the uninterrupted run's step 11 (a history of 4 steps: the window rolls within the run).
std::vector<std::string> fp8_delayed(std::vector<std::string> more = {}) {
    for (const char* key : {"train.steps=20", "train.sample_tokens=0", "train.precision=\"fp8\"", "fp8.recipe=\"delayed\"", "fp8.amax_history_len=4",
                            "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0"})
        more.emplace_back(key);
    return more;
}

TEST(CheckpointResume, CpuGpt2Fp8DelayedScaling_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, fp8_delayed()), "gpt2_fp8_delayed");
}

TEST(CheckpointResume, StandInCudaLlamaFp8DelayedMostRecent_IsBitwiseIdenticalToUninterrupted) {
    expect_resume_is_bitwise_uninterrupted(test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, fp8_delayed({"fp8.amax_compute=\"most_recent\""})),
                                           "llama_fp8_delayed_bf16");
}

namespace {
// A copy of the checkpoints in `from` resumed under `config` (each resume saves into its own copy).
Outcome resume_copy(const Config& config, const std::string& from, const std::string& to) {
    std::filesystem::remove_all(to);
    std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
    return train_checkpointed(config, to, true, 0);
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }
}  // namespace

// A checkpoint of a run without FP8 resumes in FP8: the delayed recipe finds no histories
// and scales its first step from each tensor's own amax, which is what current scaling does,
// bit for bit; the casts change the losses (FP8 is on) by well under 1%.
TEST(CheckpointResume, PlainCheckpointIntoFp8Delayed_StartsItsHistoriesAsANewRunDoes) {
    const Config plain = test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, {"train.steps=20", "train.sample_tokens=0"});
    Config delayed = test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, fp8_delayed());
    Config current = delayed;
    current.fp8.recipe = Fp8Recipe::current;
    const std::string root = testing::TempDir() + "checkpoint_plain_into_fp8_" + std::to_string(::getpid());
    std::filesystem::remove_all(root);
    train_checkpointed(plain, root + "/saved", false, 12);
    const Outcome as_plain = resume_copy(plain, root + "/saved", root + "/plain");
    const Outcome as_delayed = resume_copy(delayed, root + "/saved", root + "/delayed");
    const Outcome as_current = resume_copy(current, root + "/saved", root + "/current");
    ASSERT_EQ(as_delayed.steps.size(), 10u);
    ASSERT_EQ(as_plain.steps.size(), 10u);
    EXPECT_EQ(as_delayed.steps[0].loss, as_current.steps[0].loss);
    EXPECT_EQ(as_delayed.steps[0].grad_norm, as_current.steps[0].grad_norm);
    EXPECT_NE(as_delayed.steps[0].loss, as_plain.steps[0].loss) << "the resumed run does not cast to FP8";
    for (size_t i = 0; i < as_delayed.steps.size(); ++i) EXPECT_LT(relative(as_delayed.steps[i].loss, as_plain.steps[i].loss), 0.01) << "step " << i + 11;
    std::filesystem::remove_all(root);
}

// And back: an FP8 checkpoint (delayed, its histories saved) resumes without FP8, from the
// weights the FP8 run reached (its first loss within 1% of the FP8 run's step 11, far below
// a new run's), leaving the scaling state unread.
TEST(CheckpointResume, Fp8DelayedCheckpointIntoPlainPrecision_TrainsOnFromItsWeights) {
    const Config delayed = test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, fp8_delayed());
    const Config plain = test::tiny_cuda_shaped_run("gpt2", "cpu", 2, 32, {"train.steps=20", "train.sample_tokens=0"});
    const std::string root = testing::TempDir() + "checkpoint_fp8_into_plain_" + std::to_string(::getpid());
    std::filesystem::remove_all(root);
    const Outcome fp8 = train_checkpointed(delayed, root + "/saved", false, 12);
    const Outcome as_plain = resume_copy(plain, root + "/saved", root + "/plain");
    const Outcome fp8_again = resume_copy(delayed, root + "/saved", root + "/fp8");
    ASSERT_EQ(as_plain.steps.size(), 10u);
    EXPECT_EQ(fp8_again.steps[0].loss, fp8.steps[10].loss);
    EXPECT_NE(as_plain.steps[0].loss, fp8.steps[10].loss) << "the resumed run still casts to FP8";
    EXPECT_LT(relative(as_plain.steps[0].loss, fp8.steps[10].loss), 0.01);
    EXPECT_LT(as_plain.steps[0].loss, 0.9 * fp8.steps[0].loss) << "the resumed run did not start from the checkpoint's weights";
    EXPECT_LT(as_plain.steps.back().loss, as_plain.steps[0].loss);
    std::filesystem::remove_all(root);
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

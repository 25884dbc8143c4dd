// The CUDA path's host side, on every machine: training runs on a CPU stand-in of the CUDA
// backend (tests/support/stand_in_cuda_backend.h) that keeps its memory and dtype contract.
// bf16 mixed precision must track the fp32 CPU run, fp16 loss scaling must train, and
// recomputation must not change the run. What this cannot show is the kernels' own
// correctness and speed: tests/gpu does that on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "core/exit_code.h"
#include "support/stand_in_cuda_backend.h"
#include "support/run_comparisons.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

Config tiny_run(const std::string& family, const std::string& device, const std::string& precision = "auto",
                const std::string& recompute = "none") {
    return test::tiny_cuda_shaped_run(family, device, 2, 32, {"train.precision=\"" + precision + "\"", "train.recompute=\"" + recompute + "\""});
}

TrainerOptions quiet_options(bool on_stand_in) {
    TrainerOptions options{.dtype = std::nullopt, .quiet = true};
    if (on_stand_in) options.make_backend = [](int) { return test::make_stand_in_cuda_backend(); };
    return options;
}

TrainResult train(const Config& config) {
    Trainer trainer(config, quiet_options(config.train.device == ComputeDevice::cuda));
    return trainer.run();
}

}  // namespace

TEST(StandInCudaTraining, Gpt2Bf16_TracksCpuFp32AndKeepsF32MasterWeights) {
    const Config config = tiny_run("gpt2", "cuda");
    Trainer trainer(config, quiet_options(true));
    const Parameters& p = trainer.model().parameters();
    EXPECT_EQ(trainer.compute_dtype(), DType::bf16);
    EXPECT_EQ(p.dtype(), DType::f32);
    EXPECT_EQ(p.compute_dtype(), DType::bf16);
    EXPECT_EQ(p.device(), Device::cuda);
    const TrainResult cuda = trainer.run();
    test::expect_tracks_cpu(cuda, train(tiny_run("gpt2", "cpu")));
    EXPECT_FALSE(cuda.sample.empty());  // sampling reads 16-bit device logits
}

TEST(StandInCudaTraining, LlamaBf16_TracksCpuFp32) { test::expect_tracks_cpu(train(tiny_run("llama", "cuda")), train(tiny_run("llama", "cpu"))); }

TEST(StandInCudaTraining, Fp16WithDynamicLossScaling_TracksCpuFp32) {
    const TrainResult fp16 = train(tiny_run("gpt2", "cuda", "fp16"));
    EXPECT_EQ(fp16.steps.front().loss_scale, 65536);
    test::expect_tracks_cpu(fp16, train(tiny_run("gpt2", "cpu")));
}

TEST(StandInCudaTraining, SelectiveAndFullRecompute_GiveBitwiseTheSameRun) {
    const TrainResult none = train(tiny_run("llama", "cuda"));
    for (const std::string mode : {"selective", "full"}) {
        test::expect_bitwise_identical(train(tiny_run("llama", "cuda", "auto", mode)), none, mode);
    }
}

// The step waits for the device twice: once to read its closing scalars (loss sum, gradient
// norm), once at its end for the step time; never per micro-batch or per parameter. Counted
// by the stand-in as the CUDA backend counts them (copy_to_host, synchronize), over steps
// without a checkpoint; two micro-batches per step, the norm over every parameter.
TEST(StandInCudaTraining, HostSynchronizationsPerStep_AreAtMostTwo) {
    for (const std::string family : {"gpt2", "llama"}) {
        SCOPED_TRACE(family);
        Config config = tiny_run(family, "cuda");
        config.train.steps = 4;
        ASSERT_GE(config.train.grad_accum, 2);
        const TrainResult r = train(config);
        ASSERT_EQ(r.steps.size(), 4u);
        for (const StepRecord& s : r.steps) {
            EXPECT_LE(s.rank.host_syncs, 2) << "step " << s.step;
            EXPECT_GE(s.rank.host_syncs, 1) << "step " << s.step << ": the step's scalars were never read";
            EXPECT_TRUE(std::isfinite(s.loss) && s.loss > 0);
        }
    }
}

// Packed documents on the CUDA path's host side: the document starts reach every op on the
// device, and the bf16 run tracks the fp32 CPU run with the same mask.
TEST(StandInCudaTraining, LlamaBf16DocumentMask_TracksCpuFp32) {
    const std::vector<std::string> documents = {"data.attention_mask=\"document\"", "data.reset_position_ids=true", "data.document_separator=\" \""};
    test::expect_tracks_cpu(train(test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, documents)),
                            train(test::tiny_cuda_shaped_run("llama", "cpu", 2, 32, documents)));
}

namespace {
Config tiny_moe_run(const std::string& device, const std::vector<std::string>& more = {}) {
    std::vector<std::string> overrides = {"model.moe.n_experts=4", "model.moe.top_k=2", "model.moe.d_ff_expert=64", "model.moe.z_loss_coeff=0.001"};
    overrides.insert(overrides.end(), more.begin(), more.end());
    return test::tiny_cuda_shaped_run("llama", device, 2, 32, overrides);
}
}  // namespace

// A mixture-of-experts model on the CUDA path's host side: the router's fp32 logits from bf16
// operands, the permutation and the experts' GEMMs in bf16. The bf16 run tracks the fp32 CPU
// run (the routing may choose differently where two scores are within bf16's rounding) and
// two runs are bitwise alike.
TEST(StandInCudaTraining, MoeBf16_TracksCpuFp32AndTwoRunsAreBitwiseAlike) {
    const TrainResult bf16 = train(tiny_moe_run("cuda"));
    test::expect_tracks_cpu(bf16, train(tiny_moe_run("cpu")));
    test::expect_bitwise_identical(bf16, train(tiny_moe_run("cuda")), "moe bf16");
}

// Dropless routing reads each MoE layer's counts once per micro-batch (the experts' GEMMs are
// sized by them); the step reads its balancing losses once more: 2 + layers x micro-batches + 1.
// A capacity needs no counts for its GEMMs; its load tally reads as many.
TEST(StandInCudaTraining, MoeHostSynchronizations_AreOnePerMoeLayerPerMicroBatchMore) {
    for (const std::string capacity : {"0", "1.0"}) {
        SCOPED_TRACE("capacity_factor " + capacity);
        Config config = tiny_moe_run("cuda", {"model.moe.capacity_factor=" + capacity});
        config.train.steps = 3;
        const TrainResult r = train(config);
        const int64_t expected = 2 + config.model.n_layers * config.train.grad_accum + 1;
        for (const StepRecord& s : r.steps) EXPECT_LE(s.rank.host_syncs, expected) << "step " << s.step;
        for (const StepRecord& s : r.steps) EXPECT_GE(s.rank.host_syncs, expected - 1) << "step " << s.step;
    }
}

// Full and selective recomputation re-run the routing bitwise as the forward ran it.
TEST(StandInCudaTraining, MoeSelectiveAndFullRecompute_GiveBitwiseTheSameRun) {
    const TrainResult none = train(tiny_moe_run("cuda"));
    for (const std::string mode : {"selective", "full"}) test::expect_bitwise_identical(train(tiny_moe_run("cuda", {"train.recompute=\"" + mode + "\""})), none, mode);
}

namespace {
Config tiny_fp8_run() { return test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, {"train.precision=\"fp8\"", "fp8.bf16_first_layers=0", "fp8.bf16_last_layers=0", "train.steps=2"}); }
Config tiny_bf16_run() { return test::tiny_cuda_shaped_run("llama", "cuda", 2, 32, {"train.precision=\"bf16\"", "train.steps=2"}); }

TrainerOptions on_gpu(const GpuDevice& gpu) {
    TrainerOptions options{.dtype = std::nullopt, .quiet = true};
    options.make_backend = [gpu](int) { return test::make_stand_in_cuda_backend(1, gpu); };
    return options;
}
}  // namespace

// FP8 tensor cores start at sm_89: on an A100 (sm_80) train.precision = "fp8" is refused as
// the trainer opens the device, before the model, its state or the data are set up, as a
// config error (exit code 2) naming the key, the GPU and what FP8 needs. bf16 still trains there.
TEST(StandInCudaTraining, Fp8OnAGpuBeforeSm89_IsRefusedNamingThePrecisionTheGpuAndSm89) {
    const GpuDevice a100{"NVIDIA A100-SXM4-80GB", 8, 0};
    try {
        Trainer trainer(tiny_fp8_run(), on_gpu(a100));
        FAIL() << "FP8 on sm_80 was not refused";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_EQ(exit_code_for(e.kind()), exit_bad_input);
        const std::string message = e.what();
        for (const std::string part : {"train.precision = \"fp8\"", "NVIDIA A100-SXM4-80GB (sm_80)", "sm_89 or later"})
            EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
    }
    EXPECT_EQ(Trainer(tiny_bf16_run(), on_gpu(a100)).run().steps.size(), 2u);
}

// Ada (sm_89), Hopper (sm_90) and Blackwell (sm_100) have FP8 tensor cores: the run trains.
TEST(StandInCudaTraining, Fp8OnSm89AndLater_Trains) {
    for (const GpuDevice& gpu : {GpuDevice{"NVIDIA L40S", 8, 9}, GpuDevice{"NVIDIA H100 80GB HBM3", 9, 0}, GpuDevice{"NVIDIA B200", 10, 0}}) {
        SCOPED_TRACE(gpu.name);
        const TrainResult r = Trainer(tiny_fp8_run(), on_gpu(gpu)).run();
        ASSERT_EQ(r.steps.size(), 2u);
        EXPECT_TRUE(std::isfinite(r.steps.back().loss));
    }
}

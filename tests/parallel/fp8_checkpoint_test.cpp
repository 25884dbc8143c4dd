// The FP8 delayed recipe's scaling state is training state on every layout (train/fp8_state.h):
// a tp2 run resumed on tp2 from its step-3 checkpoint is the uninterrupted run bit for bit,
// and a checkpoint resumes on another layout (one process's on tp2, pp2's, whose two stages
// each wrote their layers' histories, on one process) within 1e-5 of one process running
// uninterrupted, as the FP8 layouts match one process (fp8_layout_test.cpp). A history of 2
// steps: the window rolls between the save and the end. In f64, as fp8_layout_test.cpp says why.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/parallel_test.h"
#include "support/shared_scratch.h"
#include "train/trainer.h"

using namespace llmtrain;

namespace {

// 4 layers, every one in FP8 under the delayed recipe; a checkpoint every 3 steps into dir.
Config tiny_delayed(const std::string& dir, const std::vector<std::string>& layout) {
    std::vector<std::string> overrides = {"model.family=\"llama\"", "model.n_layers=4", "model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2",
                                          "model.max_seq_len=32", "train.steps=6", "optimizer.warmup_steps=2", "train.batch_size=2", "train.seq_len=16",
                                          "train.grad_accum=2", "train.eval_every=3", "train.eval_sequences=4", "train.sample_tokens=0", "train.threads=1",
                                          "train.precision=\"fp8\"", "fp8.recipe=\"delayed\"", "fp8.amax_history_len=2", "fp8.bf16_first_layers=0",
                                          "fp8.bf16_last_layers=0", "checkpoint.dir=\"" + dir + "\"", "checkpoint.every_steps=3", "checkpoint.async=false"};
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides);
}

const TrainerOptions kOptions{.dtype = DType::f64, .quiet = true};

// Trains the whole run, saving every 3 steps (in one process of its own when ctx is null).
TrainResult train_saving(const Config& config, ParallelContext* ctx) {
    Trainer trainer = ctx ? Trainer(config, kOptions, *ctx) : Trainer(config, kOptions);
    const ParallelContext& c = trainer.context();
    CheckpointerHooks hooks;
    hooks.capture = [&trainer](int64_t step, RankSnapshot& out) { capture_snapshot(trainer.snapshot_source(), step, out); };
    hooks.manifest = [&trainer](int64_t step) { return trainer.manifest_at(step); };
    Checkpointer checkpointer(config.checkpoint, *c.world, FileAttributes{0, c.world_rank, c.mesh.world_size(), c.mesh.tp(), c.mesh.dp(), c.mesh.pp()},
                              std::move(hooks));
    trainer.observe(checkpointer);
    return trainer.run();
}

// Steps 4..6 from the step-3 checkpoint in dir.
TrainResult resume_from_step_3(Config config, const std::string& dir, ParallelContext* ctx) {
    config.checkpoint.dir = "";
    const std::string path = dir + "/step_00000003";
    Trainer trainer = ctx ? Trainer(config, kOptions, *ctx) : Trainer(config, kOptions);
    trainer.restore(path, read_checkpoint_manifest(path));
    return trainer.run();
}

Config one_process(Config config, int64_t dp) {
    config.train.grad_accum *= dp;
    config.parallel = ParallelConfig{};
    return config;
}

// The resumed steps against the uninterrupted run's last three.
void expect_resumed_within(const TrainResult& resumed, const TrainResult& uninterrupted, double relative, const std::string& what) {
    ASSERT_EQ(resumed.steps.size(), 3u) << what;
    ASSERT_EQ(uninterrupted.steps.size(), 6u) << what;
    for (size_t i = 0; i < 3; ++i) {
        const StepRecord &got = resumed.steps[i], &want = uninterrupted.steps[3 + i];
        EXPECT_EQ(got.step, want.step) << what;
        EXPECT_LE(std::abs(got.loss - want.loss), relative * std::abs(want.loss)) << what << " loss at step " << want.step << ": " << got.loss << " vs " << want.loss;
        EXPECT_LE(std::abs(got.grad_norm - want.grad_norm), relative * std::abs(want.grad_norm))
            << what << " grad norm at step " << want.step << ": " << got.grad_norm << " vs " << want.grad_norm;
    }
    EXPECT_LE(std::abs(resumed.evals.back().val_loss - uninterrupted.evals.back().val_loss), relative * std::abs(uninterrupted.evals.back().val_loss)) << what;
}

}  // namespace

namespace {
// Saves at step 3 on `layout`, resumes there on the same layout: bitwise the uninterrupted run.
void expect_same_layout_resume_bitwise(const std::string& scratch, const std::vector<std::string>& layout, const std::string& label) {
    const std::string dir = test::shared_scratch(scratch);
    const Config config = tiny_delayed(dir, layout);
    ParallelContext ctx = make_mpi_context(config.parallel);
    const TrainResult uninterrupted = train_saving(config, &ctx);
    const TrainResult resumed = resume_from_step_3(config, dir, &ctx);
    expect_resumed_within(resumed, uninterrupted, 0.0, label);
    test::remove_shared_scratch(dir);
}
}  // namespace

PARALLEL_TEST(Fp8Checkpoints, TensorParallelDelayedScaling_ResumeIsBitwiseIdenticalToUninterrupted, 2) {
    expect_same_layout_resume_bitwise("llmtrain_fp8_checkpoint_tp2", {"parallel.tp=2"}, "tp2 resumed on tp2");
}

// fp8.param_gather under ZeRO-3: a resume loads the master shards and casts each rank's FP8
// shard again at its first gather, as the uninterrupted run did after its update.
PARALLEL_TEST(Fp8Checkpoints, Zero3Fp8ParamGatherDelayedScaling_ResumeIsBitwiseIdenticalToUninterrupted, 2) {
    expect_same_layout_resume_bitwise("llmtrain_fp8_checkpoint_zero3_param_gather", {"parallel.dp=2", "parallel.zero_stage=3", "fp8.param_gather=true"},
                                      "dp2 ZeRO-3 fp8.param_gather resumed on the same layout");
}

// One process saves (each rank its own copy, rank 0's is resumed); the resumed layouts
// compare with that process's uninterrupted run.
PARALLEL_TEST(Fp8Checkpoints, DelayedScalingStateOnAnotherLayout_ResumesWithinOneInAHundredThousand, 2) {
    const std::string dir = test::shared_scratch("llmtrain_fp8_checkpoint_layouts");
    MpiSession mpi;
    const Config tp2 = tiny_delayed(dir + "/one", {"parallel.tp=2"});
    const TrainResult one = train_saving(one_process(tiny_delayed(dir + "/one_" + std::to_string(mpi.world_rank()), {}), 1), nullptr);
    mpi.first_failing_rank(false);  // every rank's save is done
    {
        ParallelContext ctx = make_mpi_context(tp2.parallel);
        expect_resumed_within(resume_from_step_3(tp2, dir + "/one_0", &ctx), one, 1e-5, "one process's checkpoint resumed on tp2");
    }
    const Config pp2 = tiny_delayed(dir + "/pp2", {"parallel.pp=2"});
    {
        ParallelContext ctx = make_mpi_context(pp2.parallel);
        train_saving(pp2, &ctx);
    }
    expect_resumed_within(resume_from_step_3(one_process(pp2, 1), dir + "/pp2", nullptr), one, 1e-5, "pp2's checkpoint resumed on one process");
    test::remove_shared_scratch(dir);
}

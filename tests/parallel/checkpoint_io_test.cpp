// Checkpoint I/O by placement on 8 ranks, counted by the kernel rather than by the code under
// test: the bytes each rank's thread read (/proc/thread-self/io, rchar: every read and pread,
// file data and HDF5 metadata alike) around what a resume does (the verification every rank
// shares, then the load). For dp8 under ZeRO-1, dp8 under ZeRO-3, and a tp2 x pp2 x dp2
// checkpoint resumed as tp2 x dp4:
//   - summed over the ranks a resume reads at most 2.2x the checkpoint (one verification pass
//     plus one load), and no rank more than 2.5x its share (checkpoint / world);
//   - no rank file is larger than 1.5x the mean (replicated tensors are written once, split
//     over their replicas);
//   - the resumed run trains on, its first loss equal to the uninterrupted run's within 1e-5.
// Each case prints its figures.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

namespace fs = std::filesystem;

uint64_t thread_rchar() {
    std::ifstream io("/proc/thread-self/io");
    std::string key;
    uint64_t value = 0;
    while (io >> key >> value)
        if (key == "rchar:") return value;
    ADD_FAILURE() << "/proc/thread-self/io has no rchar";
    return 0;
}

// About 6.4M parameters (an 80 MB checkpoint): large enough that what HDF5 reads besides the
// values (superblocks, object headers, chunk indexes) is a small part of a rank's share. The
// tokens are synthetic: a resume then reads nothing but the checkpoint (a corpus would be
// read again by the restored data loader, and counted).
Config io_config(const std::string& dir, const std::vector<std::string>& layout, int64_t steps) {
    std::vector<std::string> overrides = {"model.n_layers=8", "model.d_model=256", "model.n_heads=4", "model.max_seq_len=32", "train.seq_len=16",
                                          "train.batch_size=1", "train.grad_accum=0", "train.global_batch_size=8", "train.steps=" + std::to_string(steps),
                                          "train.eval_every=0", "train.eval_sequences=1", "train.sample_tokens=0", "train.threads=1",
                                          "optimizer.warmup_steps=1", "checkpoint.dir=\"" + dir + "\""};
    overrides.insert(overrides.end(), layout.begin(), layout.end());
    return load_config("configs/tiny.toml", overrides);
}

// A fresh directory, the same on every rank (rank 0 makes it).
std::string scratch(const std::string& name) { return test::shared_scratch("llmtrain_checkpoint_io_" + name); }

void remove_scratch(const std::string& dir) { test::remove_shared_scratch(dir); }

// Trains `steps` steps on the layout and saves the state after them, as the train command does.
TrainResult train_and_save(const Config& config) {
    ParallelContext ctx = make_mpi_context(config.parallel);
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true, .synthetic_data = true}, ctx);
    const TrainResult result = trainer.run();
    CheckpointerHooks hooks;
    hooks.capture = [&trainer](int64_t step, RankSnapshot& out) { capture_snapshot(trainer.snapshot_source(), step, out); };
    hooks.manifest = [&trainer](int64_t step) { return trainer.manifest_at(step); };
    const FileAttributes file{0, ctx.world_rank, ctx.mesh.world_size(), ctx.mesh.tp(), ctx.mesh.dp(), ctx.mesh.pp()};
    Checkpointer checkpointer(config.checkpoint, *ctx.world, file, std::move(hooks));
    checkpointer.save_and_wait(config.train.steps);
    return result;
}

struct ResumeFigures {
    double read_total = 0, read_max = 0;
    double checkpoint = 0, file_max = 0, file_mean = 0;
    double first_loss = 0;
};

// What every rank reads to resume (the shared verification, the manifest, the load), summed
// and at most over the ranks; and the first step after it.
ResumeFigures resume_and_count(const Config& config, const std::string& path) {
    ParallelContext ctx = make_mpi_context(config.parallel);
    Trainer trainer(config, TrainerOptions{.dtype = DType::f32, .quiet = true, .synthetic_data = true}, ctx);
    ctx.world->barrier();
    const uint64_t before = thread_rchar();
    const std::optional<std::string> problem = shared_problem_check(*ctx.world)(path);
    const Manifest manifest = read_checkpoint_manifest(path);
    trainer.restore(path, manifest);
    const auto read = static_cast<double>(thread_rchar() - before);
    EXPECT_FALSE(problem.has_value()) << *problem;
    ResumeFigures f;
    f.read_total = ctx.world->all_reduce_scalar(read, ReduceOp::sum);
    f.read_max = ctx.world->all_reduce_scalar(read, ReduceOp::max);
    for (const CheckpointFile& file : manifest.files) {
        f.checkpoint += static_cast<double>(file.bytes);
        f.file_max = std::max(f.file_max, static_cast<double>(file.bytes));
    }
    f.file_mean = f.checkpoint / static_cast<double>(manifest.files.size());
    f.first_loss = trainer.run().steps.front().loss;
    ctx.world->barrier();
    return f;
}

void expect_resume_reads_once(const std::string& name, const std::vector<std::string>& saved_layout, const std::vector<std::string>& resumed_layout) {
    const std::string dir = scratch(name);
    const TrainResult uninterrupted = [&] {
        ParallelContext ctx = make_mpi_context(io_config(dir, resumed_layout, 3).parallel);
        return Trainer(io_config(dir, resumed_layout, 3), TrainerOptions{.dtype = DType::f32, .quiet = true, .synthetic_data = true}, ctx).run();
    }();
    train_and_save(io_config(dir, saved_layout, 2));
    const ResumeFigures f = resume_and_count(io_config(dir, resumed_layout, 3), dir + "/step_00000002");
    const double world = 8, share = f.checkpoint / world;
    EXPECT_LE(f.read_total, 2.2 * f.checkpoint) << name << ": the ranks read " << f.read_total / f.checkpoint << "x the checkpoint";
    EXPECT_LE(f.read_max, 2.5 * share) << name << ": the busiest rank read " << f.read_max / share << "x its share";
    EXPECT_LE(f.file_max, 1.5 * f.file_mean) << name << ": the largest rank file is " << f.file_max / f.file_mean << "x the mean";
    const double expected = uninterrupted.steps.back().loss;
    EXPECT_LE(std::abs(f.first_loss - expected), 1e-5 * std::abs(expected)) << name << ": step 3 after the resume " << f.first_loss << ", uninterrupted " << expected;
    if (MpiSession().world_rank() == 0)
        std::printf("[ checkpoint io ] %-32s checkpoint %6.1f MB; largest file %.2fx the mean; resume read %.2fx the checkpoint in all, the busiest rank %.2fx its share\n",
                    name.c_str(), f.checkpoint / 1e6, f.file_max / f.file_mean, f.read_total / f.checkpoint, f.read_max / share);
    remove_scratch(dir);
}

}  // namespace

PARALLEL_TEST(CheckpointIo, DataParallelZero1_ResumeReadsEveryByteOnceAndRankFilesAreEven, 8) {
    expect_resume_reads_once("dp8_zero1", {"parallel.zero_stage=1"}, {"parallel.zero_stage=1"});
}

PARALLEL_TEST(CheckpointIo, DataParallelZero3_ResumeReadsEveryByteOnceAndRankFilesAreEven, 8) {
    expect_resume_reads_once("dp8_zero3", {"parallel.zero_stage=3"}, {"parallel.zero_stage=3"});
}

PARALLEL_TEST(CheckpointIo, TensorPipelineDataResumedAsTensorData_ReadsEveryByteOnceAndRankFilesAreEven, 8) {
    expect_resume_reads_once("tp2_pp2_dp2_as_tp2_dp4", {"parallel.tp=2", "parallel.pp=2"}, {"parallel.tp=2"});
}

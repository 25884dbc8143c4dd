// Every rank records the same outcome of every save. On 2 ranks, a Checkpointer saving every
// 2 steps whose commit fails on rank 0 (an Error, and a std::filesystem::filesystem_error,
// injected through the commit probe):
//   - with on_save_error = "warn" every rank sees the same outcomes at the same step (the
//     failures, then the following save committed), and the run goes on on every rank;
//   - with "abort" every rank stops with Error(storage) at the same step;
//   - checkpoint.max_failed_saves failures in a row stop every rank alike under "warn".
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>


#include "checkpoint/checkpoint_store.h"
#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/parallel_test.h"
#include "support/shared_scratch.h"

using namespace llmtrain;

namespace {

namespace fs = std::filesystem;

std::string shared_scratch(const std::string& name) { return test::shared_scratch("llmtrain_agreement_" + name); }

// A commit probe that fails the commits of the steps given: an Error(io) before the manifest
// is written for the first kind, a filesystem_error before the rename for the second.
CommitProbe failing_commits(std::vector<int64_t> error_steps, std::vector<int64_t> filesystem_steps) {
    return [=](int64_t step, std::string_view point) {
        const auto listed = [&](const std::vector<int64_t>& steps) { return std::find(steps.begin(), steps.end(), step) != steps.end(); };
        if (point == "write manifest" && listed(error_steps)) fail(ErrorKind::io, "injected commit failure at step ", step);
        if (point == "rename" && listed(filesystem_steps))
            throw fs::filesystem_error("injected rename failure", std::make_error_code(std::errc::io_error));
    };
}

struct Saver {
    ParallelContext ctx;
    std::unique_ptr<Checkpointer> checkpointer;
    std::vector<std::string> outcomes;  // "STEP committed" / "STEP failed (rank R, N in a row)", in the order agreed
};

void make_saver(Saver& s, const CheckpointConfig& config, CommitProbe probe) {
    const int rank = s.ctx.world_rank, world = s.ctx.mesh.world_size();
    CheckpointerHooks hooks;
    hooks.capture = [rank](int64_t step, RankSnapshot& out) {
        out.step = step;
        out.world_rank = rank;
    };
    hooks.manifest = [world](int64_t step) {
        Manifest m;
        m.run_id = "dddddddddddddddd";
        m.step = step;
        m.world_size = world;
        m.dp = world;
        return m;
    };
    if (rank == 0) hooks.commit_probe = std::move(probe);
    const FileAttributes file{0, rank, world, 1, world, 1};
    s.checkpointer = std::make_unique<Checkpointer>(config, *s.ctx.world, file, std::move(hooks));
    s.checkpointer->on_outcome([&s](const SaveOutcome& o) {
        s.outcomes.push_back(o.committed ? cat(o.step, " committed") : cat(o.step, " failed (rank ", o.failed_rank, ", ", o.failures_in_a_row, " in a row)"));
    });
}

CheckpointConfig saving_every_2(const std::string& dir, SaveErrorPolicy policy, int64_t max_failed) {
    CheckpointConfig c;
    c.dir = dir;
    c.every_steps = 2;
    c.async = true;
    c.on_save_error = policy;
    c.max_failed_saves = max_failed;
    return c;
}

// Steps 1..steps through the checkpointer, then the final wait: 0, or -1 when an
// Error(storage) stopped this rank.
int64_t run_steps(Saver& s, int64_t steps) {
    try {
        for (int64_t step = 1; step <= steps; ++step) {
            StepRecord record;
            record.step = step;
            s.checkpointer->after_step(record);
        }
        s.checkpointer->finish();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::storage) << e.what();
        return -1;
    }
    return 0;
}

// The same value on every rank: its minimum (-max(-value)) equals its maximum.
void expect_same_on_every_rank(Comm& world, double value, const std::string& what) {
    EXPECT_EQ(-world.all_reduce_scalar(-value, ReduceOp::max), world.all_reduce_scalar(value, ReduceOp::max)) << what << " differs between ranks";
}

// The checkpointer stopped on every rank, rank 0 removes the shared directory.
void remove_when_every_rank_is_done(Saver& s, const std::string& dir) {
    s.checkpointer.reset();
    test::remove_shared_scratch(dir);
}

std::string joined(const std::vector<std::string>& items) {
    std::string text;
    for (const std::string& item : items) text += item + "; ";
    return text;
}

}  // namespace

PARALLEL_TEST(CheckpointAgreement, CommitFailingOnRankZero_WarnPolicy_EveryRankRecordsTheSameOutcomes_AndTheNextSaveCommits, 2) {
    const std::string dir = shared_scratch("warn");
    Saver s{make_mpi_context(ParallelConfig{}), nullptr, {}};
    make_saver(s, saving_every_2(dir, SaveErrorPolicy::warn, 3), failing_commits({2}, {4}));
    EXPECT_EQ(run_steps(s, 6), 0);
    EXPECT_EQ(joined(s.outcomes), "2 failed (rank 0, 1 in a row); 4 failed (rank 0, 2 in a row); 6 committed; ");
    EXPECT_EQ(s.checkpointer->failed_saves(), 2);
    EXPECT_TRUE(s.checkpointer->saved(6));
    expect_same_on_every_rank(*s.ctx.world, static_cast<double>(s.outcomes.size()), "the number of outcomes");
    const std::optional<std::string> latest = latest_checkpoint(dir);
    EXPECT_TRUE(latest && latest->ends_with("step_00000006"));
    remove_when_every_rank_is_done(s, dir);
}

PARALLEL_TEST(CheckpointAgreement, CommitFailingOnRankZero_AbortPolicy_StopsEveryRankAtTheSameSave, 2) {
    const std::string dir = shared_scratch("abort");
    Saver s{make_mpi_context(ParallelConfig{}), nullptr, {}};
    make_saver(s, saving_every_2(dir, SaveErrorPolicy::abort, 3), failing_commits({}, {4}));
    EXPECT_EQ(run_steps(s, 8), -1);
    // Step 2 committed; step 4's filesystem_error stopped every rank, and nothing after it ran.
    EXPECT_EQ(joined(s.outcomes), "2 committed; 4 failed (rank 0, 1 in a row); ");
    expect_same_on_every_rank(*s.ctx.world, static_cast<double>(s.outcomes.size()), "the number of outcomes");
    remove_when_every_rank_is_done(s, dir);
}

PARALLEL_TEST(CheckpointAgreement, MaxFailedSavesInARow_StopsEveryRankUnderWarn, 2) {
    const std::string dir = shared_scratch("max_failed");
    Saver s{make_mpi_context(ParallelConfig{}), nullptr, {}};
    make_saver(s, saving_every_2(dir, SaveErrorPolicy::warn, 2), failing_commits({4, 6, 8}, {}));
    EXPECT_EQ(run_steps(s, 10), -1);
    EXPECT_EQ(joined(s.outcomes), "2 committed; 4 failed (rank 0, 1 in a row); 6 failed (rank 0, 2 in a row); ");
    expect_same_on_every_rank(*s.ctx.world, static_cast<double>(s.outcomes.size()), "the number of outcomes");
    remove_when_every_rank_is_done(s, dir);
}

// The commit of a checkpoint and the lock of a directory, on hand-made saves (one small rank
// file and its record each, as a rank leaves them):
//   - a process killed just before each filesystem step of a commit, a re-save of the same
//     step included, leaves `latest` naming a checkpoint that loads (the old save or the new
//     one), and the next commit succeeds;
//   - a failing filesystem step is an Error(io) naming the path, never a
//     std::filesystem::filesystem_error escaping the save's error handling;
//   - one process per directory: a second lock is refused naming the holder, a lock left by a
//     process that is gone is taken over, a released lock names no holder.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "core/directory_lock.h"
#include "core/error.h"
#include "support/file_bytes.h"
#include "test_paths.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_temp_dir(name); }

const std::string kRun = "cccccccccccccccc";

// A pending save of `step` whose one rank file holds `weights`, as every rank leaves it before
// rank 0 commits.
void write_pending(const std::string& root, int64_t step, const std::string& weights) {
    const std::string dir = pending_dir(root, step);
    fs::create_directories(dir);
    const std::string file = dir + "/" + rank_file_name(0);
    test::write_bytes(file, weights);
    write_rank_record(dir, 0, file);
}

Manifest manifest_at(int64_t step) {
    Manifest m;
    m.run_id = kRun;
    m.step = step;
    m.world_size = 1;
    return m;
}

// The weights of the checkpoint `latest` names, which must load.
std::string latest_weights(const std::string& root) {
    const std::optional<std::string> latest = latest_checkpoint(root);
    if (!latest) return "(no latest)";
    if (const std::optional<std::string> problem = checkpoint_problem(*latest)) return "(latest does not load: " + *problem + ")";
    return test::read_bytes(*latest + "/" + rank_file_name(0));
}

// Commits in a child process that dies (_exit: no destructor, no clean-up, as a crash) just
// before the commit's filesystem step number `kill_at`. Returns the step's name, or "" when
// the commit finished before reaching it.
std::string commit_killed_before(const std::string& root, int64_t step, int kill_at) {
    int pipe_fds[2];
    EXPECT_EQ(pipe(pipe_fds), 0);
    const pid_t child = fork();
    if (child == 0) {
        close(pipe_fds[0]);
        int seen = 0;
        try {
            commit_checkpoint(root, manifest_at(step), [&](int64_t, std::string_view point) {
                if (seen++ != kill_at) return;
                [[maybe_unused]] const ssize_t n = write(pipe_fds[1], point.data(), point.size());
                _exit(42);
            });
        } catch (...) {
            _exit(1);
        }
        _exit(0);
    }
    close(pipe_fds[1]);
    int status = 0;
    waitpid(child, &status, 0);
    char name[64] = {};
    [[maybe_unused]] const ssize_t n = read(pipe_fds[0], name, sizeof name - 1);
    close(pipe_fds[0]);
    EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == 42 || WEXITSTATUS(status) == 0)) << "the commit failed in the child";
    return WEXITSTATUS(status) == 42 ? std::string(name) : "";
}

// Walks every filesystem step of the commit of step 10 over `prepare`'s directory: a crash
// before it leaves `latest` loading the old or the new weights, and a new commit then installs
// newer ones. Returns the steps walked.
std::vector<std::string> walk_crashes(const std::string& name, bool resave) {
    std::vector<std::string> walked;
    for (int kill_at = 0; kill_at < 32; ++kill_at) {
        const std::string root = fresh_dir(name);
        write_pending(root, 5, "weights at step 5");
        commit_checkpoint(root, manifest_at(5));
        if (resave) {
            write_pending(root, 10, "old weights at step 10");
            commit_checkpoint(root, manifest_at(10));
        }
        const std::string before = resave ? "old weights at step 10" : "weights at step 5";
        write_pending(root, 10, "new weights at step 10");
        const std::string point = commit_killed_before(root, 10, kill_at);
        const std::string after = latest_weights(root);
        EXPECT_TRUE(after == before || after == "new weights at step 10") << "killed before '" << point << "': latest has " << after;
        // The run resumes and saves step 10 again: the commit goes through.
        write_pending(root, 10, "newer weights at step 10");
        EXPECT_NO_THROW(commit_checkpoint(root, manifest_at(10))) << "after a crash before '" << point << "'";
        EXPECT_EQ(latest_weights(root), "newer weights at step 10") << "after a crash before '" << point << "'";
        fs::remove_all(root);
        if (point.empty()) break;
        walked.push_back(point);
    }
    return walked;
}

}  // namespace

TEST(CheckpointCommit, ReSaveOfTheSameStep_KilledBeforeEveryFilesystemStep_LeavesALoadableLatest) {
    const std::vector<std::string> walked = walk_crashes("commit-resave", true);
    // The exchange of the two directories is among the steps walked (the file system of the
    // test's temporary directory has it; a fallback would walk "move old aside" instead).
    const bool exchanged = std::find(walked.begin(), walked.end(), "exchange") != walked.end();
    const bool fallback = std::find(walked.begin(), walked.end(), "move old aside") != walked.end();
    EXPECT_TRUE(exchanged || fallback);
    EXPECT_GE(walked.size(), 7u);
    std::string listed;
    for (const std::string& w : walked) listed += w + "; ";
    std::printf("re-save killed before each of: %s\n", listed.c_str());
}

// Where the file system has no RENAME_EXCHANGE (forced by the test hook), `latest` names the
// new save's pending directory while the old one is moved aside and the new one renamed.
TEST(CheckpointCommit, ReSaveWithoutAnAtomicExchange_KilledBeforeEveryFilesystemStep_LeavesALoadableLatest) {
    const pid_t child = fork();
    if (child == 0) {
        setenv("LLMTRAIN_CHECKPOINT_NO_RENAME_EXCHANGE", "1", 1);
        const std::vector<std::string> walked = walk_crashes("commit-resave-no-exchange", true);
        const bool fallback = std::find(walked.begin(), walked.end(), "move old aside") != walked.end();
        _exit(!testing::Test::HasFailure() && fallback ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the walk without an exchange failed (its output above says where)";
}

TEST(CheckpointCommit, FirstSave_KilledBeforeEveryFilesystemStep_LeavesALoadableLatest) {
    const std::vector<std::string> walked = walk_crashes("commit-first", false);
    EXPECT_NE(std::find(walked.begin(), walked.end(), "rename"), walked.end());
}

TEST(CheckpointCommit, AMissingRankRecord_IsAnIoErrorNamingTheRecord) {
    const std::string root = fresh_dir("commit-missing-record");
    write_pending(root, 3, "weights");
    fs::remove(pending_dir(root, 3) + "/" + rank_record_name(0));
    try {
        commit_checkpoint(root, manifest_at(3));
        FAIL() << "a commit without the rank's record went through";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        EXPECT_NE(std::string(e.what()).find(rank_record_name(0)), std::string::npos) << e.what();
    }
    EXPECT_FALSE(latest_checkpoint(root));
}

TEST(CheckpointCommit, AFilesystemFailure_IsAnErrorNamingThePath_NotAFilesystemError) {
    const std::string root = fresh_dir("commit-unwritable");
    write_pending(root, 4, "weights");
    // A directory where `latest`'s temporary file must go: its creation fails.
    fs::create_directories(root + "/latest.tmp/blocker");
    EXPECT_THROW(
        {
            try {
                commit_checkpoint(root, manifest_at(4));
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("latest"), std::string::npos) << e.what();
                throw;
            }
        },
        Error);
}

TEST(DirectoryLock, ASecondHolder_IsRefusedNamingTheFirst_AndARelease_LeavesNoHolder) {
    const std::string dir = fresh_dir("lock-second");
    std::string path;
    {
        const DirectoryLock first(dir, "run directory");
        path = first.path();
        EXPECT_NE(test::read_bytes(path).find("pid " + std::to_string(getpid())), std::string::npos);
        try {
            const DirectoryLock second(dir, "run directory");
            FAIL() << "a second lock of one directory was taken";
        } catch (const Error& e) {
            const std::string message = e.what();
            EXPECT_EQ(e.kind(), ErrorKind::config);
            EXPECT_NE(message.find("run directory '" + dir + "' is in use by another llmtrain (host "), std::string::npos) << message;
            EXPECT_NE(message.find("pid " + std::to_string(getpid())), std::string::npos) << message;
            EXPECT_NE(message.find(path), std::string::npos) << message;
        }
    }
    EXPECT_EQ(test::read_bytes(path), "");
    const DirectoryLock again(dir, "run directory");  // free once released
}

TEST(DirectoryLock, ALockLeftByAProcessThatIsGone_IsTakenOver) {
    const std::string dir = fresh_dir("lock-stale");
    const pid_t child = fork();
    if (child == 0) {
        const DirectoryLock held(dir, "checkpoint.dir");
        _exit(0);  // dies holding it: no destructor empties the file
    }
    int status = 0;
    waitpid(child, &status, 0);
    const std::string left = test::read_bytes(dir + "/.llmtrain.lock");
    ASSERT_NE(left.find("pid " + std::to_string(child)), std::string::npos) << left;
    const DirectoryLock taken(dir, "checkpoint.dir");
    EXPECT_NE(test::read_bytes(taken.path()).find("pid " + std::to_string(getpid())), std::string::npos);
}

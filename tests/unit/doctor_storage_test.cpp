// doctor's checkpoint storage checks leave the filesystem as they found it: a checkpoint.dir
// that did not exist (the default "checkpoints" of a doctor run without a config) is made for
// the checks and removed again, down to the outermost directory they made; one that existed
// stays, holding nothing new.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "doctor/doctor.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
    const fs::path dir = fs::path(testing::TempDir()) / ("doctor_storage_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

constexpr uint64_t kMiB = uint64_t{1} << 20;

}  // namespace

TEST(DoctorStorage, MissingCheckpointDir_IsMadeForTheChecksAndRemovedAgain) {
    const fs::path root = scratch("missing");
    const std::vector<CheckResult> checks = check_checkpoint_storage((root / "made/nested/checkpoints").string(), kMiB, 1, kMiB);
    ASSERT_FALSE(checks.empty());
    EXPECT_EQ(checks.front().status, CheckStatus::pass) << checks.front().detail;
    EXPECT_NE(checks.front().detail.find("made for the checks and removed again"), std::string::npos) << checks.front().detail;
    EXPECT_FALSE(fs::exists(root / "made")) << "the checks left " << (root / "made");
    EXPECT_TRUE(fs::is_empty(root));
    fs::remove_all(root);
}

TEST(DoctorStorage, ExistingCheckpointDir_StaysWithNothingNewInIt) {
    const fs::path root = scratch("existing");
    const fs::path dir = root / "checkpoints";
    fs::create_directories(dir / "step_00000010");
    const std::vector<CheckResult> checks = check_checkpoint_storage(dir.string(), kMiB, 1, kMiB);
    ASSERT_FALSE(checks.empty());
    EXPECT_EQ(checks.front().status, CheckStatus::pass) << checks.front().detail;
    std::vector<std::string> left;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
    EXPECT_EQ(left, std::vector<std::string>{"step_00000010"});
    fs::remove_all(root);
}

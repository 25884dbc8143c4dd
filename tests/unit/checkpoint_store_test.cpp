// The checkpoint directory's bookkeeping on hand-made checkpoints (a manifest and one small
// rank file each): a chain belongs to its run (retention, `latest`, --resume auto and the
// start-up refusal count only the run's own checkpoints), and the manifest checks itself.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "core/error.h"
#include "support/file_bytes.h"
#include "test_paths.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_temp_dir(name); }

std::string read_text(const std::string& path) { return test::read_bytes(path); }
void write_text(const std::string& path, const std::string& text) { test::write_bytes(path, text); }

// A committed checkpoint of `run_id` at `step` under root, the sequence-th save of its chain,
// whose one rank file checks; `latest` is moved to it, as a commit does.
std::string save(const std::string& root, const std::string& run_id, int64_t step, int64_t sequence) {
    const std::string dir = (fs::path(root) / checkpoint_name(step)).string();
    fs::create_directories(dir);
    const std::string bytes = "weights of " + run_id + " at step " + std::to_string(step);
    write_text(dir + "/rank_00000.h5", bytes);
    Manifest m;
    m.run_id = run_id;
    m.sequence = sequence;
    m.step = step;
    m.files = {{"rank_00000.h5", bytes.size(), XXH64(bytes.data(), bytes.size(), 0)}};
    write_text(dir + "/manifest.json", manifest_to_json(m));
    write_text(root + "/latest", checkpoint_name(step) + "\n");
    return dir;
}

std::vector<std::string> names_under(const std::string& root) {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

const std::string run_a = "aaaaaaaaaaaaaaaa", run_b = "bbbbbbbbbbbbbbbb";

}  // namespace

// The case: run A left steps 50, 55 and 60; run B, fresh in the same directory, saves
// step 5. Retention counting every checkpoint by step deleted B's save at once and left
// `latest` on it; counting only B's chain, it keeps B's save and touches none of A's.
TEST(CheckpointRetention, CountsOnlyItsOwnRunsChain_AndKeepsItsNewestSave) {
    const std::string root = fresh_dir("retention-two-runs");
    for (int64_t i = 0; i < 3; ++i) save(root, run_a, 50 + 5 * i, i + 1);
    const std::string b5 = save(root, run_b, 5, 1);
    EXPECT_TRUE(apply_retention(root, 3, 0, run_b).empty());
    EXPECT_EQ(names_under(root), (std::vector<std::string>{"latest", "step_00000005", "step_00000050", "step_00000055", "step_00000060"}));
    EXPECT_EQ(*latest_checkpoint(root), b5);
    // B's chain grows past keep_last: only B's oldest goes.
    for (int64_t i = 1; i <= 3; ++i) save(root, run_b, 5 + 5 * i, i + 1);
    EXPECT_EQ(apply_retention(root, 3, 0, run_b), (std::vector<std::string>{b5}));
    EXPECT_EQ(names_under(root), (std::vector<std::string>{"latest", "step_00000010", "step_00000015", "step_00000020", "step_00000050",
                                                           "step_00000055", "step_00000060"}));
}

// A run resumed from an older checkpoint of its chain saves steps below the abandoned ones:
// its newest save is the newest by commit (sequence), not by step, and it is never deleted.
TEST(CheckpointRetention, ResumedFromAnOlderCheckpoint_KeepsTheNewSavesOverTheAbandonedOnes) {
    const std::string root = fresh_dir("retention-branch");
    save(root, run_a, 20, 1);
    save(root, run_a, 25, 2);
    save(root, run_a, 30, 3);
    const std::string resumed = save(root, run_a, 22, 4);  // resumed from step 20, saving every 2
    EXPECT_EQ(apply_retention(root, 2, 0, run_a), (std::vector<std::string>{root + "/step_00000020", root + "/step_00000025"}));
    EXPECT_EQ(names_under(root), (std::vector<std::string>{"latest", "step_00000022", "step_00000030"}));
    // --resume auto continues the newest save, the branch that was resumed.
    EXPECT_EQ(*find_resume_checkpoint(root, "auto", [](const std::string&) {}), resumed);
}

// keep_last = 0 (or a pointer moved by hand) never costs the checkpoint `latest` names.
TEST(CheckpointRetention, NeverDeletesTheNewestSaveOrWhatLatestNames) {
    const std::string root = fresh_dir("retention-latest");
    save(root, run_a, 5, 1);
    save(root, run_a, 10, 2);
    write_text(root + "/latest", "step_00000005\n");
    save(root, run_a, 15, 3);
    write_text(root + "/latest", "step_00000005\n");
    EXPECT_EQ(apply_retention(root, 0, 0, run_a), (std::vector<std::string>{root + "/step_00000010"}));
    EXPECT_EQ(names_under(root), (std::vector<std::string>{"latest", "step_00000005", "step_00000015"}));
}

TEST(CheckpointOwnership, AnotherRunsCheckpoints_RefuseTheRunNamingTheDirectoryTheRunAndTheFlags) {
    const std::string root = fresh_dir("ownership");
    EXPECT_NO_THROW(check_checkpoint_dir_is_free_for(root, run_b)) << "an empty directory takes any run";
    save(root, run_a, 50, 1);
    save(root, run_a, 60, 2);
    EXPECT_NO_THROW(check_checkpoint_dir_is_free_for(root, run_a)) << "a run continues its own chain";
    try {
        check_checkpoint_dir_is_free_for(root, run_b);
        FAIL() << "a fresh run was let into another run's checkpoint.dir";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::config);
        for (const std::string& part : std::vector<std::string>{"checkpoint.dir '" + root + "'", "run " + run_a + ": steps 50 to 60", "this run " + run_b,
                                                                "--resume auto", "--resume " + root + "/step_00000060", "--set checkpoint.dir=DIR"})
            EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
    }
}

TEST(ResumeAuto, TakesOnlyTheGivenRunsChain_AndRefusesToGuessBetweenTwoRuns) {
    const std::string root = fresh_dir("resume-auto");
    const std::string a60 = save(root, run_a, 60, 1);
    const std::string b12 = save(root, run_b, 12, 1);
    const auto quiet = [](const std::string&) {};
    EXPECT_EQ(*find_resume_checkpoint(root, "auto", quiet, {}, run_b), b12);
    EXPECT_EQ(*find_resume_checkpoint(root, "auto", quiet, {}, run_a), a60);
    EXPECT_FALSE(find_resume_checkpoint(root, "auto", quiet, {}, std::string("cccccccccccccccc")).has_value());
    try {
        find_resume_checkpoint(root, "auto", quiet);
        FAIL() << "--resume auto picked one of two runs";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("holds the checkpoints of 2 runs"), std::string::npos) << e.what();
    }
}

// An edited step is found by the manifest's own checksum, by every reader: the manifest
// reader, the verification every command runs, and --resume.
TEST(ManifestChecksum, AnEditedStep_IsFoundBeforeAnythingReadsIt) {
    const std::string root = fresh_dir("manifest-edit");
    const std::string dir = save(root, run_a, 60, 1);
    EXPECT_NO_THROW(verify_checkpoint(dir));
    const std::string text = read_text(dir + "/manifest.json");
    const std::string edited = std::regex_replace(text, std::regex("\"step\": 60,"), "\"step\": 70,");
    ASSERT_NE(edited, text);
    write_text(dir + "/manifest.json", edited);
    EXPECT_THROW(read_checkpoint_manifest(dir), Error);
    try {
        verify_checkpoint(dir);
        FAIL() << "the edited manifest verified";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fails its own checksum"), std::string::npos) << e.what();
    }
    EXPECT_THROW(find_resume_checkpoint(root, dir, [](const std::string&) {}), Error);
}

TEST(ManifestChecksum, RunIdSequenceAndGlobalBatch_RoundTrip_AndFormats1And2StillRead) {
    Manifest m;
    m.run_id = run_a;
    m.sequence = 7;
    m.global_batch = 32;
    m.run_directory = "runs/x";
    m.zero_stage = 3;
    m.files = {{"rank_00000.h5", 1, 2}};
    const std::string current = manifest_to_json(m);
    const Manifest back = manifest_from_json(current, "m.json");
    EXPECT_EQ(back.run_id, run_a);
    EXPECT_EQ(back.sequence, 7);
    EXPECT_EQ(back.global_batch, 32);
    EXPECT_EQ(back.run_directory, "runs/x");
    EXPECT_EQ(back.zero_stage, 3);
    const std::regex checksum(",\\s*\"manifest_xxh64\": \"[0-9a-f]+\"");
    // A manifest of format 2 (the mesh's zero1, rank files of tp parts): its own checksum
    // (XXH64 of the compact JSON without the key) recomputed over the edited document.
    std::string format2 = std::regex_replace(current, checksum, "");
    format2 = std::regex_replace(format2, std::regex("\"version\": 3"), "\"version\": 2");
    format2 = std::regex_replace(format2, std::regex("\"zero_stage\": 3"), "\"zero1\": true");
    const std::string compact = nlohmann::ordered_json::parse(format2).dump();
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(XXH64(compact.data(), compact.size(), 0)));
    nlohmann::ordered_json with_checksum = nlohmann::ordered_json::parse(format2);
    with_checksum["manifest_xxh64"] = digest;
    const Manifest second = manifest_from_json(with_checksum.dump(2), "m.json");
    EXPECT_EQ(second.run_id, run_a);
    EXPECT_EQ(second.zero_stage, 1) << "zero1 = true is stage 1";
    // A manifest of format 1 (earlier llmtrains): no run id, no checksum of its own.
    std::string older = std::regex_replace(current, checksum, "");
    older = std::regex_replace(older, std::regex("\"version\": 3"), "\"version\": 1");
    const Manifest legacy = manifest_from_json(older, "m.json");
    EXPECT_EQ(legacy.run_id, "");
    EXPECT_EQ(legacy.global_batch, 0);
    // Format 3 without its checksum is refused: the key cannot be dropped to pass an edit.
    EXPECT_THROW(manifest_from_json(std::regex_replace(manifest_to_json(m), std::regex(",\\s*\"manifest_xxh64\": \"[0-9a-f]+\""), ""), "m.json"), Error);
}

TEST(RunId, NewIdsAreSixteenHexDigitsAndDiffer) {
    const std::string a = new_run_id(), b = new_run_id();
    EXPECT_TRUE(std::regex_match(a, std::regex("[0-9a-f]{16}"))) << a;
    EXPECT_NE(a, b);
}

// The fault drills' plan: parsed once from LLMTRAIN_INJECT_FAULT's syntax, then asked by the
// trainer at every step.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "train/fault_injection.h"

using namespace llmtrain;

TEST(FaultPlan, Parsed_AnswersForItsRankAndStepOnly) {
    FaultPlan plan = FaultPlan::parse("nan:1:3,bitflip:0:2,spike:4:10,lr:5:0.5", "LLMTRAIN_INJECT_FAULT");
    EXPECT_FALSE(plan.empty());
    EXPECT_TRUE(plan.nonfinite_gradients(1, 3));
    EXPECT_FALSE(plan.nonfinite_gradients(0, 3));
    EXPECT_FALSE(plan.nonfinite_gradients(1, 4));
    EXPECT_DOUBLE_EQ(plan.spike_factor(4), 10);
    EXPECT_DOUBLE_EQ(plan.spike_factor(3), 1);
    EXPECT_DOUBLE_EQ(plan.lr_factor(4), 1);
    EXPECT_DOUBLE_EQ(plan.lr_factor(9), 0.5);
}

TEST(FaultPlan, BitFlip_HappensOnceSoThatARerunComputesCorrectly) {
    FaultPlan plan = FaultPlan::parse("bitflip:0:2", "LLMTRAIN_INJECT_FAULT");
    EXPECT_FALSE(plan.bit_flip(0, 1));
    EXPECT_TRUE(plan.bit_flip(0, 2));
    EXPECT_FALSE(plan.bit_flip(0, 2));
}

TEST(FaultPlan, Empty_InjectsNothing) {
    FaultPlan plan;
    EXPECT_TRUE(plan.empty());
    EXPECT_FALSE(plan.nonfinite_gradients(0, 1));
    EXPECT_FALSE(plan.bit_flip(0, 1));
    EXPECT_DOUBLE_EQ(plan.lr_factor(100), 1);
    plan.strike_if_due(0, 1);  // returns: nothing to strike
}

TEST(FaultPlan, MalformedItem_IsAConfigErrorNamingTheVariableAndTheForms) {
    try {
        FaultPlan::parse("nan:1:3,crash:2", "LLMTRAIN_INJECT_FAULT");
        ADD_FAILURE() << "expected a config error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        const std::string message = e.what();
        EXPECT_NE(message.find("LLMTRAIN_INJECT_FAULT=\"nan:1:3,crash:2\": 'crash:2'"), std::string::npos) << message;
        EXPECT_NE(message.find("expected KIND:RANK:STEP"), std::string::npos) << message;
    }
}

// The commit drills act in the commit of their own checkpoint, at their own filesystem step:
// an Error before the manifest, a std::filesystem::filesystem_error before the rename.
TEST(FaultPlan, CommitFaults_StrikeTheirCheckpointsCommitAtTheirStepOnly) {
    const FaultPlan plan = FaultPlan::parse("commitfail:10:error,commitfail:15:filesystem,slowcommit:20:0.01", "LLMTRAIN_INJECT_FAULT");
    EXPECT_NO_THROW(plan.strike_commit(10, "read rank records"));
    EXPECT_THROW(plan.strike_commit(10, "write manifest"), Error);
    EXPECT_NO_THROW(plan.strike_commit(5, "write manifest"));
    EXPECT_NO_THROW(plan.strike_commit(15, "write manifest"));
    EXPECT_THROW(plan.strike_commit(15, "rename"), std::filesystem::filesystem_error);
    EXPECT_NO_THROW(plan.strike_commit(20, "read rank records"));
    EXPECT_THROW(FaultPlan::parse("commitfail:10:maybe", "LLMTRAIN_INJECT_FAULT"), Error);
}

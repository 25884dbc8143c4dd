// The LR schedule's shape, the clipping factor and the dynamic loss scale.
#include <gtest/gtest.h>

#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/lr_schedule.h"

using namespace llmtrain;

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
    OptimizerConfig o;
    o.lr = 1.0;
    o.warmup_steps = 10;
    o.min_lr_ratio = 0.1;
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 0, 110), 0.1);
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 9, 110), 1.0);
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 10, 110), 1.0);
    EXPECT_NEAR(learning_rate_at(o, 60, 110), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
    EXPECT_NEAR(learning_rate_at(o, 110, 110), 0.1, 1e-12);
    EXPECT_NEAR(learning_rate_at(o, 500, 110), 0.1, 1e-12);
}

TEST(LrSchedule, WarmupLongerThanTheRun_WarmsUpOverTheRunToThePeak) {
    OptimizerConfig o;
    o.lr = 1.0;
    o.warmup_steps = 30;
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 0, 5), 0.2);
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 2, 5), 0.6);
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 4, 5), 1.0);
}

TEST(LrSchedule, LinearAndConstantDecays) {
    OptimizerConfig o;
    o.lr = 2.0;
    o.min_lr_ratio = 0.0;
    o.decay = LrDecay::linear;
    EXPECT_NEAR(learning_rate_at(o, 25, 100), 1.5, 1e-12);
    o.decay = LrDecay::constant;
    EXPECT_DOUBLE_EQ(learning_rate_at(o, 99, 100), 2.0);
}

TEST(GradClip, ScalesOnlyAboveTheLimit) {
    EXPECT_DOUBLE_EQ(clip_scale(0.5, 1.0), 1.0);
    EXPECT_NEAR(clip_scale(4.0, 1.0), 0.25, 1e-6);
    EXPECT_DOUBLE_EQ(clip_scale(4.0, 0.0), 1.0);  // clipping off
}

TEST(DynamicLossScale, HalvesOnOverflowAndDoublesAfterAWindowOfGoodSteps) {
    DynamicLossScale s(1024, 3);
    s.update(true);
    EXPECT_EQ(s.scale(), 512);
    s.update(false), s.update(false);
    EXPECT_EQ(s.scale(), 512);
    s.update(false);
    EXPECT_EQ(s.scale(), 1024);
    s.update(false), s.update(true), s.update(false), s.update(false);  // an overflow restarts the window
    EXPECT_EQ(s.scale(), 512);
}

TEST(DynamicLossScale, StaysWithin1AndTwoToThe24AndIsFixedAt1WithoutFp16) {
    DynamicLossScale low(2, 1);
    for (int i = 0; i < 5; ++i) low.update(true);
    EXPECT_EQ(low.scale(), 1);
    DynamicLossScale high(DynamicLossScale::max_scale, 1);
    high.update(false);
    EXPECT_EQ(high.scale(), DynamicLossScale::max_scale);
    DynamicLossScale fixed;
    fixed.update(true);
    EXPECT_EQ(fixed.scale(), 1);
    EXPECT_FALSE(fixed.dynamic());
}

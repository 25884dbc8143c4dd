// The LR schedule's shape and the clipping factor.
#include <gtest/gtest.h>

#include "optim/adamw.h"
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

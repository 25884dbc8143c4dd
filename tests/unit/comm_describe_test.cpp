// A group is named in every failure message; at 128 ranks a list of every rank is a wall of
// numbers, so runs at one stride are written as their ends.
#include <gtest/gtest.h>

#include <numeric>

#include "parallel/comm.h"

using namespace llmtrain;

TEST(CommDescribe, ShortGroupsListEveryRank) {
    EXPECT_EQ(describe_world_ranks({0, 1, 2}), "0, 1, 2");
    EXPECT_EQ(describe_world_ranks({5}), "5");
    EXPECT_EQ(describe_world_ranks({2, 9}), "2, 9");
}

TEST(CommDescribe, ConsecutiveRanksAreARange) {
    std::vector<int> ranks(128);
    std::iota(ranks.begin(), ranks.end(), 0);
    EXPECT_EQ(describe_world_ranks(ranks), "0-127");
    EXPECT_EQ(describe_world_ranks({0, 1, 2, 3, 10, 20}), "0-3, 10, 20");
}

TEST(CommDescribe, StridedRanksNameTheirStride) {
    std::vector<int> dp;
    for (int r = 0; r < 128; r += 8) dp.push_back(r);
    EXPECT_EQ(describe_world_ranks(dp), "0, 8, ..., 120 (stride 8)");
}

TEST(CommDescribe, TheGroupIsDescribedOnceAndNamesItsRanks) {
    const std::unique_ptr<Comm> self = make_self_comm("tp");
    const std::string& first = self->describe();
    EXPECT_EQ(first, "tp group (world ranks 0)");
    EXPECT_EQ(&self->describe(), &first);
}

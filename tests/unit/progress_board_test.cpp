// What a channel publishes is what a reader of the board gets back: the collectives entered
// and the last one's op, the last transfer, what the host waits on, the process's state.
#include <gtest/gtest.h>

#include <cstring>

#include "parallel/progress_board.h"

using namespace llmtrain;

namespace {

std::shared_ptr<ProgressBoard> board_of_rank(int rank) {
    return ProgressBoard::private_board(rank, "n7", [](const std::string&, int r) { return std::vector<int>{r}; });
}

}  // namespace

TEST(ProgressBoard, PublishedCollectivesTransfersAndWaits_ReadBackAsPublished) {
    auto board = board_of_rank(3);
    ProgressChannel tp = board->channel("tp", CommLane::host);
    ProgressChannel dp = board->channel("dp", CommLane::device);
    for (int i = 0; i < 5; ++i) tp.arrived(CommOp::all_reduce, tp.next_collective());
    dp.arrived(CommOp::reduce_scatter, dp.next_collective());
    dp.point_to_point(CommOp::send, 6);
    tp.waiting(Waiter::host, CommOp::all_reduce, 5);

    const RankProgress p = board->read_local(3);
    EXPECT_EQ(p.world_rank, 3);
    EXPECT_EQ(p.process, ProcessState::running);
    ASSERT_EQ(p.channels, 2);
    const ChannelProgress* read_tp = p.find("tp", CommLane::host);
    ASSERT_NE(read_tp, nullptr);
    EXPECT_EQ(read_tp->collectives, 5u);
    EXPECT_EQ(read_tp->collective_op, CommOp::all_reduce);
    EXPECT_FALSE(read_tp->any_p2p);
    EXPECT_GE(read_tp->collective_age_s, 0.0);
    EXPECT_LT(read_tp->collective_age_s, 60.0);
    EXPECT_EQ(p.find("tp", CommLane::device), nullptr);
    const ChannelProgress* read_dp = p.find("dp", CommLane::device);
    ASSERT_NE(read_dp, nullptr);
    EXPECT_EQ(read_dp->collectives, 1u);
    EXPECT_EQ(read_dp->collective_op, CommOp::reduce_scatter);
    EXPECT_TRUE(read_dp->any_p2p);
    EXPECT_EQ(read_dp->p2p_op, CommOp::send);
    EXPECT_EQ(read_dp->p2p_peer, 6);
    EXPECT_EQ(p.host_wait.channel, 0);
    EXPECT_EQ(p.host_wait.op, CommOp::all_reduce);
    EXPECT_EQ(p.host_wait.value, 5u);
    EXPECT_EQ(p.device_wait.channel, -1);

    tp.done_waiting(Waiter::host);
    EXPECT_EQ(board->read_local(3).host_wait.channel, -1);
    EXPECT_EQ(board->node_name_of(3), "n7");
}

TEST(ProgressBoard, MoreChannelsThanARecordHolds_AreRefused) {
    auto board = board_of_rank(0);
    for (int c = 0; c < kMaxChannels; ++c) board->channel(cat("group ", c), CommLane::host);
    EXPECT_THROW(board->channel("one too many", CommLane::host), Error);
}

TEST(ProgressBoard, GroupsCommunicatorMadeAgain_CountsAfreshInItsOldChannel) {
    auto board = board_of_rank(0);
    ProgressChannel first = board->channel("dp", CommLane::device);
    first.arrived(CommOp::all_reduce, first.next_collective());
    ProgressChannel again = board->channel("dp", CommLane::device);
    EXPECT_EQ(again.index(), first.index());
    EXPECT_EQ(board->read_local(0).channels, 1);
    EXPECT_EQ(board->read_local(0).channel[0].collectives, 0u);
    again.arrived(CommOp::all_gather, again.next_collective());
    EXPECT_EQ(board->read_local(0).channel[0].collectives, 1u);
    EXPECT_EQ(board->channel("dp", CommLane::host).index(), 1) << "another lane of the group is another channel";
}


// The comparison behind a timeout's message: from the progress each rank published, which
// members of the hung group never arrived, and, for a member that waits in another group's
// collective, which rank held that one up.
#include <gtest/gtest.h>

#include <map>

#include "parallel/hang_diagnosis.h"

using namespace llmtrain;

namespace {

// One rank's published progress, built channel by channel.
struct Record {
    explicit Record(int rank) {
        p.world_rank = rank;
        p.process = ProcessState::running;
    }
    Record& channel(const std::string& group, uint64_t collectives, double age_s, CommOp op = CommOp::all_reduce, CommLane lane = CommLane::host) {
        ChannelProgress& c = p.channel[p.channels++];
        std::snprintf(c.group, sizeof c.group, "%s", group.c_str());
        c.lane = lane;
        c.collectives = collectives;
        c.collective_op = op;
        c.collective_age_s = age_s;
        return *this;
    }
    Record& sent(int peer, double age_s) {
        ChannelProgress& c = p.channel[p.channels - 1];
        c.any_p2p = true;
        c.p2p_op = CommOp::send;
        c.p2p_peer = peer;
        c.p2p_age_s = age_s;
        return *this;
    }
    // Waits (on the host) in operation seq_or_peer of its channel `index`.
    Record& waits(int index, CommOp op, uint64_t seq_or_peer, double age_s) {
        p.host_wait = {index, op, seq_or_peer, age_s};
        return *this;
    }
    Record& in_state(ProcessState state) {
        p.process = state;
        return *this;
    }
    RankProgress p;
};

// tp pairs {0, 1}, {2, 3}; dp pairs {0, 2}, {1, 3}.
std::vector<int> groups_of_four(const std::string& group, int rank) {
    if (group == "tp") return {rank / 2 * 2, rank / 2 * 2 + 1};
    if (group == "dp") return {rank % 2, rank % 2 + 2};
    return {0, 1, 2, 3};
}

struct Board {
    std::map<int, RankProgress> records;
    void add(const Record& r) { records[r.p.world_rank] = r.p; }
    ProgressLookup lookup() const {
        return [this](int rank) -> const RankProgress* {
            const auto found = records.find(rank);
            return found == records.end() ? nullptr : &found->second;
        };
    }
    HangExplanation explain(const HungOperation& hung) const {
        return explain_hang(hung, lookup(), groups_of_four, [](int rank) { return cat("n", rank / 2); });
    }
};

HungOperation collective(const std::string& group, uint64_t seq, std::vector<int> members, int self) {
    return {group, CommLane::host, CommOp::reduce_scatter, seq, -1, std::move(members), self};
}

}  // namespace

TEST(HangDiagnosis, RanksNotArrived_AreTheMembersBehindTheHungCollective) {
    Board board;
    board.add(Record(0).channel("dp", 7, 0.1));
    board.add(Record(1).channel("dp", 6, 9.0));
    board.add(Record(2).channel("dp", 7, 0.2));
    board.add(Record(3).channel("dp", 9, 0.0));  // ran ahead: arrived
    EXPECT_EQ(ranks_not_arrived(collective("dp", 7, {0, 1, 2, 3}, 0), board.lookup()), (std::vector<int>{1}));
    // The same counts on the device lane say nothing about the host's.
    board.add(Record(1).channel("dp", 6, 9.0).channel("dp", 7, 0.1, CommOp::all_reduce, CommLane::device));
    EXPECT_EQ(ranks_not_arrived(collective("dp", 7, {0, 1, 2, 3}, 0), board.lookup()), (std::vector<int>{1}));
}

TEST(HangDiagnosis, StoppedRank_IsNamedWithItsHostItsLastCollectiveAndItsState) {
    Board board;
    board.add(Record(0).channel("dp", 1234, 0.0).channel("tp", 40, 0.5));
    board.add(Record(1).channel("dp", 1233, 12.0).channel("tp", 41, 10.2).in_state(ProcessState::stopped));
    const HangExplanation e = board.explain(collective("dp", 1234, {0, 1}, 0));
    EXPECT_EQ(e.text, "world rank 1 on host n0 never arrived (its last collective: all_reduce #41 in the tp group, 10.2 s ago; "
                      "its process is stopped (SIGSTOP, or a debugger))");
    EXPECT_TRUE(e.unread.empty());
}

TEST(HangDiagnosis, RankWaitingElsewhere_IsHeldUpAndTheRankItWaitsOnIsNamed) {
    // Rank 1 is stopped; rank 0 waits for it in tp #9; rank 2's dp #5 waits for rank 0.
    Board board;
    board.add(Record(0).channel("dp", 4, 4.5).channel("tp", 9, 4.0).waits(1, CommOp::all_reduce, 9, 4.0));
    board.add(Record(1).channel("dp", 4, 5.0).channel("tp", 8, 4.8).in_state(ProcessState::stopped));
    board.add(Record(2).channel("dp", 5, 0.0));
    board.add(Record(3).channel("dp", 5, 0.0).channel("tp", 9, 1.0).waits(0, CommOp::reduce_scatter, 5, 0.0));
    const HangExplanation e = board.explain(collective("dp", 5, {0, 2}, 2));
    EXPECT_EQ(e.text, "world rank 0 on host n0 is held up: it waits in all_reduce #9 in the tp group (for 4.0 s), where world rank 1 on host n0 "
                      "never arrived (its last collective: all_reduce #8 in the tp group, 4.8 s ago; its process is stopped (SIGSTOP, or a debugger))");
    EXPECT_EQ(e.text.find("world rank 0 on host n0 never arrived"), std::string::npos);
}

TEST(HangDiagnosis, RanksWaitingOnEachOther_EndTheChain) {
    // A cycle (ranks 0 and 1 each wait in a transfer from the other) is told once.
    Board board;
    board.add(Record(0).channel("pp", 0, 0.0).waits(0, CommOp::recv, 1, 6.0));
    board.add(Record(1).channel("pp", 0, 0.0).waits(0, CommOp::recv, 0, 6.0));
    HungOperation hung{"pp", CommLane::host, CommOp::recv, 0, 1, {0, 1}, 0};
    const HangExplanation e = board.explain(hung);
    EXPECT_EQ(e.text, "world rank 1 on host n0 is held up: it waits in recv from world rank 0 in the pp group (for 6.0 s)");
}

TEST(HangDiagnosis, PeerOfATransfer_IsNamedWithItsLastOperation) {
    Board board;
    board.add(Record(2).channel("pp", 3, 8.0).sent(3, 7.5).in_state(ProcessState::gone));
    HungOperation hung{"pp", CommLane::host, CommOp::recv, 0, 2, {0, 2}, 0};
    EXPECT_EQ(board.explain(hung).text, "world rank 2 on host n1 never arrived (its last operation: send to world rank 3 in the pp group, 7.5 s ago; "
                                        "its process has exited)");
}

TEST(HangDiagnosis, RanksWithoutARecord_AreReturnedToBeAskedFor) {
    Board board;
    board.add(Record(0).channel("dp", 3, 0.0));
    board.add(Record(2).channel("dp", 2, 0.0, CommOp::all_gather, CommLane::device));
    HungOperation hung = collective("dp", 3, {0, 2, 3}, 0);
    hung.lane = CommLane::device;
    const HangExplanation e = board.explain(hung);
    EXPECT_EQ(e.text, "world rank 2 on host n1 never arrived (its last collective: all_gather #2 in the dp group on the device, 0.0 s ago); "
                      "no record of world rank 3 could be read (no rank of its node answered)");
    EXPECT_EQ(e.unread, (std::vector<int>{3}));
}

TEST(HangDiagnosis, EveryMemberArrived_BlamesTheTransferItself) {
    Board board;
    for (int r = 0; r < 4; ++r) board.add(Record(r).channel("world", 11, 0.0));
    EXPECT_EQ(board.explain(collective("world", 11, {0, 1, 2, 3}, 3)).text,
              "every rank of the group arrived at it: the transfer itself is stuck (the network, or a device that does not progress)");
}

TEST(HangDiagnosis, ManyMissingRanks_NameEightAndCountTheRest) {
    Board board;
    std::vector<int> members;
    for (int r = 0; r < 20; ++r) {
        members.push_back(r);
        board.add(Record(r).channel("world", r == 0 ? 2 : 1, 1.0));
    }
    const std::string text = board.explain(collective("world", 2, members, 0)).text;
    EXPECT_NE(text.find("world rank 8 on host n4 never arrived"), std::string::npos) << text;
    EXPECT_EQ(text.find("world rank 9 on host"), std::string::npos) << text;
    EXPECT_NE(text.find("; and 11 more"), std::string::npos) << text;
}

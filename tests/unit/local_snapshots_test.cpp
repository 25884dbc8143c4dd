// Node-local snapshots' placement: which ranks keep copies of a rank's piece, and where a
// node's snapshots live (checkpoint/local_snapshots.h). The snapshots themselves, their
// copies and the restarts from them run in CTest parallel.local_snapshots.*.
#include <gtest/gtest.h>

#include "checkpoint/local_snapshots.h"

using namespace llmtrain;

namespace {
// `per_node` ranks on each of `nodes` nodes, in blocks (node 0: ranks 0 .. per_node - 1).
NodeMap blocks(int nodes, int per_node) {
    NodeMap map;
    for (int n = 0; n < nodes; ++n) {
        map.names.push_back("node" + std::to_string(n));
        for (int i = 0; i < per_node; ++i) map.node_of_rank.push_back(n);
    }
    return map;
}
}  // namespace

TEST(LocalSnapshots, EachPieceIsCopiedToTheSameLocalRankOnTheNextNodes) {
    const NodeMap map = blocks(3, 2);
    EXPECT_EQ(replica_holders(map, 0, 1), (std::vector<int>{2}));
    EXPECT_EQ(replica_holders(map, 3, 1), (std::vector<int>{5}));
    EXPECT_EQ(replica_holders(map, 5, 2), (std::vector<int>{1, 3}));  // the ring wraps round
}

TEST(LocalSnapshots, NoCopyLandsOnTheRanksOwnNodeWhateverTheReplicaCount) {
    const NodeMap map = blocks(2, 4);
    for (int rank = 0; rank < 8; ++rank) {
        const std::vector<int> holders = replica_holders(map, rank, 3);
        ASSERT_EQ(holders.size(), 1u) << "two nodes hold two copies at most";
        EXPECT_NE(map.node_of_rank[static_cast<size_t>(holders[0])], map.node_of_rank[static_cast<size_t>(rank)]);
    }
    EXPECT_TRUE(replica_holders(blocks(1, 4), 2, 1).empty());
}

TEST(LocalSnapshots, UnevenNodesSpreadCopiesOverTheSmallerNodesRanks) {
    NodeMap map;
    map.names = {"big", "small"};
    map.node_of_rank = {0, 0, 0, 1};  // three ranks, then one
    EXPECT_EQ(map.local_index(2), 2);
    EXPECT_EQ(replica_holders(map, 2, 1), (std::vector<int>{3}));  // local index 2 modulo one rank
    EXPECT_EQ(replica_holders(map, 3, 1), (std::vector<int>{0}));
}

TEST(LocalSnapshots, RootNamesTheNodeWhereAskedAndAlwaysTheRun) {
    LocalSnapshotConfig config;
    EXPECT_EQ(local_snapshot_root(config, "gpu17", "3f9c0a1b2c3d4e5f"), "/dev/shm/llmtrain/3f9c0a1b2c3d4e5f");
    config.dir = "/scratch/{node}/snap";
    EXPECT_EQ(local_snapshot_root(config, "gpu17", "3f9c0a1b2c3d4e5f"), "/scratch/gpu17/snap/3f9c0a1b2c3d4e5f");
}

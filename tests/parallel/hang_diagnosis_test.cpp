// A timeout names the rank that never arrived: through MpiComm on one node (the records read
// from the node's shared memory), and between nodes (each rank made a node of its own, so
// that every other rank's record must be asked for over MPI and answered by a rank that is
// itself waiting).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "core/error.h"
#include "parallel/context.h"
#include "parallel/launch_env.h"
#include "support/parallel_test.h"

using namespace llmtrain;

namespace {

std::vector<int> world_of_three(const std::string&, int) { return {0, 1, 2}; }

// Answers questions on `board` until every rank has come here.
void answer_until_all_arrive(ProgressBoard& board) {
    MPI_Request everyone;
    MPI_Ibarrier(MPI_COMM_WORLD, &everyone);
    for (int done = 0; !done;) {
        board.answer_questions();
        MPI_Test(&everyone, &done, MPI_STATUS_IGNORE);
    }
}

}  // namespace

PARALLEL_TEST(HangDiagnosis, CollectiveOneRankNeverEnters_TimesOutNamingThatRankAndItsHost, 3) {
    ParallelConfig config;
    config.timeout_seconds = 1.0;
    ParallelContext ctx = make_mpi_context(config);
    Comm& world = *ctx.world;
    world.all_reduce_scalar(1.0, ReduceOp::sum);  // collective #1, on every rank
    if (world.rank() != 1) {
        try {
            world.barrier();  // #2, which rank 1 never enters
            ADD_FAILURE() << "a barrier without rank 1 completed";
        } catch (const Error& e) {
            const std::string message = e.what();
            EXPECT_NE(message.find(cat("barrier #2 in the world group (world ranks 0, 1, 2) did not complete within 1 s (parallel.timeout_seconds): "
                                       "world rank 1 on host ",
                                       this_node_name(), " never arrived (its last collective: all_reduce #1 in the world group, ")),
                      std::string::npos)
                << message;
            EXPECT_EQ(message.find("world rank 0 on host"), std::string::npos) << message;
            EXPECT_EQ(message.find("world rank 2 on host"), std::string::npos) << message;
        }
    }
    // The abandoned barrier must not match a later one: every rank meets on the world
    // communicator of the next context.
    ParallelContext next = make_mpi_context(ParallelConfig{});
    next.world->barrier();
}

PARALLEL_TEST(HangDiagnosis, RecordsOfRanksOnOtherNodes_AreAskedForAndAnswered, 3) {
    std::shared_ptr<ProgressBoard> board = make_mpi_progress_board(world_of_three, NodeScope::each_rank);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ProgressChannel world = board->channel("world", CommLane::host);
    // Ranks 0 and 2 enter collective #3; rank 1 stops at #2 and waits in a transfer from rank 0.
    for (int i = 0, reached = rank == 1 ? 2 : 3; i < reached; ++i) world.arrived(CommOp::all_gather, world.next_collective());
    if (rank == 1) world.waiting(Waiter::host, CommOp::recv, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        EXPECT_FALSE(board->on_this_node(1));
        const std::string why = board->diagnose_hang({"world", CommLane::host, CommOp::all_gather, 3, -1, {0, 1, 2}, 0}, 30.0);
        EXPECT_EQ(why.rfind(cat("world rank 1 on host ", this_node_name(), " is held up: it waits in recv from world rank 0 in the world group (for "), 0), 0u)
            << why;
        EXPECT_EQ(why.find("world rank 2"), std::string::npos) << why;  // arrived
    }
    answer_until_all_arrive(*board);
}

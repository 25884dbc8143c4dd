// MpiComm's collectives and transfers on small integers (exact in f32), and its bounded
// waits: run under `mpirun -np 3` (an odd size) as the World3 suite.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "core/error.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"

using namespace llmtrain;

namespace {

ParallelContext world_context(double timeout_seconds = 60) {
    ParallelConfig config;
    config.timeout_seconds = timeout_seconds;
    return make_mpi_context(config);
}

Tensor view(std::vector<float>& v) { return Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}); }

}  // namespace

TEST(World3, AllReduceSumAndMax_GiveEveryRankTheSameResult) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    ASSERT_EQ(world.size(), 3);
    const float r = static_cast<float>(world.rank());
    std::vector<float> sum = {r, 10 * r, 1}, max = {r, -r, 5};
    world.all_reduce(view(sum), ReduceOp::sum);
    world.all_reduce(view(max), ReduceOp::max);
    EXPECT_EQ(sum, (std::vector<float>{3, 30, 3}));
    EXPECT_EQ(max, (std::vector<float>{2, 0, 5}));
    EXPECT_EQ(world.all_reduce_scalar(r + 1, ReduceOp::sum), 6.0);
}

TEST(World3, ReduceScatter_GivesRankItsPieceOfTheSum) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const float r = static_cast<float>(world.rank());
    std::vector<float> in = {r, r + 1, 2 * r, 3, 4, r * r}, out(2);
    world.reduce_scatter(view(out), view(in));
    const std::vector<std::vector<float>> expected = {{3, 6}, {6, 9}, {12, 5}};
    EXPECT_EQ(out, expected[static_cast<size_t>(world.rank())]);
}

TEST(World3, AllGatherInPlace_CollectsEveryRanksChunk) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const int r = world.rank();
    std::vector<float> data(6, -1);
    data[static_cast<size_t>(2 * r)] = static_cast<float>(10 * r);
    data[static_cast<size_t>(2 * r + 1)] = static_cast<float>(10 * r + 1);
    world.all_gather(view(data));
    EXPECT_EQ(data, (std::vector<float>{0, 1, 10, 11, 20, 21}));
}

TEST(World3, SendRecvRingAndBroadcast_DeliverExactly) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const int r = world.rank(), n = world.size();
    std::vector<float> mine = {static_cast<float>(r), static_cast<float>(100 + r)}, theirs(2);
    CommHandle sent = world.send_async(view(mine), (r + 1) % n);
    world.recv(view(theirs), (r + n - 1) % n);
    sent.wait();
    const float left = static_cast<float>((r + n - 1) % n);
    EXPECT_EQ(theirs, (std::vector<float>{left, 100 + left}));
    std::vector<float> value = {r == 2 ? 7.0f : 0.0f};
    world.broadcast(view(value), 2);
    EXPECT_EQ(value[0], 7.0f);
}

TEST(World3, RecvFromAPeerThatNeverSends_TimesOutNamingTheRankAndTheGroup) {
    ParallelContext ctx = world_context(1.0);
    Comm& world = *ctx.world;
    if (world.rank() == 0) {
        std::vector<float> never(1);
        const auto start = std::chrono::steady_clock::now();
        try {
            world.recv(view(never), 1);
            ADD_FAILURE() << "recv returned without a sender";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("recv from world rank 1 in the world group (world ranks 0, 1, 2) did not complete within 1 s"),
                      std::string::npos)
                << e.what();
        }
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
    }
    // The abandoned receive must not match a later message: this test's communicator is
    // freed with its context; every rank meets here on the world communicator of the next.
    ParallelContext next = world_context();
    next.world->barrier();
}

TEST(World3, MeshGroupsSplitTheWorldAsTheMeshSays) {
    ParallelConfig config;
    config.dp = 0;
    ParallelContext ctx = make_mpi_context(config);
    EXPECT_EQ(ctx.mesh.dp(), 3);
    EXPECT_EQ(ctx.dp->size(), 3);
    EXPECT_EQ(ctx.tp->size(), 1);
    EXPECT_EQ(ctx.dp->describe(), "dp group (world ranks 0, 1, 2)");
    EXPECT_EQ(ctx.embedding, nullptr);  // pp = 1: no stage holds a second embedding
}

// MpiComm's collectives and transfers on small integers (exact in f32), and its bounded
// waits: run under `mpirun -np 3` (an odd size).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/host_staging.h"
#include "support/parallel_test.h"

using namespace llmtrain;

namespace {

ParallelContext world_context(double timeout_seconds = 60) {
    ParallelConfig config;
    config.timeout_seconds = timeout_seconds;
    return make_mpi_context(config);
}

Tensor view(std::vector<float>& v) { return Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}); }

// A group that has only point-to-point transfers of its own: its all_to_all_v is Comm's default.
class PointToPointOnly final : public Comm {
public:
    explicit PointToPointOnly(Comm& inner) : inner_(inner) {}
    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    int world_rank(int rank) const override { return inner_.world_rank(rank); }
    const std::string& name() const override { return inner_.name(); }
    CommHandle all_reduce_async(const Tensor& data, ReduceOp op) override { return inner_.all_reduce_async(data, op); }
    CommHandle reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override { return inner_.reduce_scatter_async(out, in, op); }
    CommHandle all_gather_async(const Tensor& data) override { return inner_.all_gather_async(data); }
    CommHandle all_to_all_async(const Tensor& out, const Tensor& in) override { return inner_.all_to_all_async(out, in); }
    CommHandle send_async(const Tensor& data, int peer) override { return inner_.send_async(data, peer); }
    void recv(const Tensor& data, int peer) override { inner_.recv(data, peer); }
    CommHandle recv_async(const Tensor& data, int peer) override { return inner_.recv_async(data, peer); }
    void broadcast(const Tensor& data, int root) override { inner_.broadcast(data, root); }
    void barrier() override { inner_.barrier(); }

private:
    Comm& inner_;
};

// Rank s sends rank d (s + d) % 3 elements (none from 0 to 0, two from 1 to 1, ...), each
// naming its sender, its receiver and its place: every receiver finds them in rank order.
void expect_chunks_routed(Comm& group) {
    const int me = group.rank();
    const auto count = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<float> in, expected;
    for (int r = 0; r < group.size(); ++r) {
        send_counts.push_back(count(me, r));
        for (int64_t i = 0; i < count(me, r); ++i) in.push_back(static_cast<float>(100 * me + 10 * r + i));
        recv_counts.push_back(count(r, me));
        for (int64_t i = 0; i < count(r, me); ++i) expected.push_back(static_cast<float>(100 * r + 10 * me + i));
    }
    std::vector<float> out(expected.size(), -1);
    group.all_to_all_v(view(out), recv_counts, view(in), send_counts);
    EXPECT_EQ(out, expected);
}

}  // namespace

PARALLEL_TEST(MpiCollectives, AllToAllV_ChunksOfTheirOwnSizesIncludingNone_ArriveInRankOrder, 3) {
    ParallelContext ctx = world_context();
    expect_chunks_routed(*ctx.world);
    PointToPointOnly by_transfers(*ctx.world);
    expect_chunks_routed(by_transfers);
}

PARALLEL_TEST(MpiCollectives, AllToAllV_CountsThatDoNotAddUp_AreRefusedNamingTheGroupAndTheSide, 3) {
    ParallelContext ctx = world_context();
    std::vector<float> in(3, 0), out(3, 0);
    const std::vector<int64_t> ones{1, 1, 1}, short_by_one{1, 1, 0}, negative{2, 2, -1};
    const auto refusal = [&](std::span<const int64_t> recv_counts, std::span<const int64_t> send_counts) {
        try {
            ctx.world->all_to_all_v(view(out), recv_counts, view(in), send_counts);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    EXPECT_NE(refusal(ones, short_by_one).find("all_to_all_v in the world group (world ranks 0, 1, 2): the send counts sum to 2 elements, the send tensor holds 3"),
              std::string::npos);
    EXPECT_NE(refusal(negative, ones).find("receive count -1 for rank 2 is negative"), std::string::npos);
    EXPECT_NE(refusal(std::span<const int64_t>(ones).first(2), ones).find("2 receive counts for 3 ranks"), std::string::npos);
    ctx.world->barrier();  // nothing was sent: the group is still in step
}

PARALLEL_TEST(MpiCollectives, AllReduceSumAndMax_GiveEveryRankTheSameResult, 3) {
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

PARALLEL_TEST(MpiCollectives, ReduceScatter_GivesRankItsPieceOfTheSum, 3) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const float r = static_cast<float>(world.rank());
    std::vector<float> in = {r, r + 1, 2 * r, 3, 4, r * r}, out(2);
    world.reduce_scatter(view(out), view(in));
    const std::vector<std::vector<float>> expected = {{3, 6}, {6, 9}, {12, 5}};
    EXPECT_EQ(out, expected[static_cast<size_t>(world.rank())]);
}

PARALLEL_TEST(MpiCollectives, AllGatherInPlace_CollectsEveryRanksChunk, 3) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const int r = world.rank();
    std::vector<float> data(6, -1);
    data[static_cast<size_t>(2 * r)] = static_cast<float>(10 * r);
    data[static_cast<size_t>(2 * r + 1)] = static_cast<float>(10 * r + 1);
    world.all_gather(view(data));
    EXPECT_EQ(data, (std::vector<float>{0, 1, 10, 11, 20, 21}));
}

// MPI counts are ints: a chunk of 2^31 elements is refused as the other collectives refuse
// one, before a byte is staged (the tensor is address space alone: reading it would fault).
PARALLEL_TEST(MpiCollectives, AllGatherOfAChunkBeyondIntRange_IsRefusedBeforeAnyByteMoves, 3) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const int64_t chunk = int64_t{std::numeric_limits<int>::max()} + 1, numel = chunk * world.size();
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(DType::u16);
    void* memory = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(memory, MAP_FAILED);
    try {
        world.all_gather(Tensor(memory, DType::u16, {numel}));
        ADD_FAILURE() << "an all-gather chunk of 2^31 elements was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::unsupported);
        EXPECT_NE(std::string(e.what()).find("MPI all_gather chunk of 2147483648 elements exceeds 2^31 - 1"), std::string::npos) << e.what();
    }
    munmap(memory, bytes);
    world.barrier();
}

PARALLEL_TEST(MpiCollectives, SendRecvRingAndBroadcast_DeliverExactly, 3) {
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

PARALLEL_TEST(MpiCollectives, RecvFromAPeerThatNeverSends_TimesOutNamingTheRankAndTheGroup, 3) {
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

PARALLEL_TEST(MpiCollectives, MeshGroupsSplitTheWorldAsTheMeshSays, 3) {
    ParallelConfig config;
    config.dp = 0;
    ParallelContext ctx = make_mpi_context(config);
    EXPECT_EQ(ctx.mesh.dp(), 3);
    EXPECT_EQ(ctx.dp->size(), 3);
    EXPECT_EQ(ctx.tp->size(), 1);
    EXPECT_EQ(ctx.dp->describe(), "dp group (world ranks 0, 1, 2)");
    EXPECT_EQ(ctx.embedding, nullptr);  // pp = 1: no stage holds a second embedding
}

// parallel.ep = 2 on tp 2 x dp 2: the expert groups are ranks {0, 1} and {2, 3}, the
// expert-data groups {0, 2} and {1, 3}; each communicator sums the world ranks of those
// members. ep = 1 makes neither.
PARALLEL_TEST(MpiCollectives, ExpertGroupsSplitTheWorldAsTheFoldingSays_OnlyWithEp, 4) {
    ParallelConfig config;
    config.tp = 2;
    ParallelContext dense = make_mpi_context(config);
    EXPECT_EQ(dense.ep, nullptr);
    EXPECT_EQ(dense.edp, nullptr);
    config.ep = 2;
    ParallelContext ctx = make_mpi_context(config);
    ASSERT_NE(ctx.ep, nullptr);
    ASSERT_NE(ctx.edp, nullptr);
    const int me = ctx.world_rank;
    EXPECT_EQ(ctx.ep_rank(), me % 2);
    EXPECT_EQ(ctx.edp_rank(), me / 2);
    EXPECT_EQ(ctx.ep->rank(), me % 2);
    EXPECT_EQ(ctx.edp->rank(), me / 2);
    EXPECT_EQ(ctx.ep->describe(), me < 2 ? "ep group (world ranks 0, 1)" : "ep group (world ranks 2, 3)");
    EXPECT_EQ(ctx.edp->describe(), me % 2 == 0 ? "edp group (world ranks 0, 2)" : "edp group (world ranks 1, 3)");
    EXPECT_EQ(ctx.ep->all_reduce_scalar(me, ReduceOp::sum), me < 2 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(ctx.edp->all_reduce_scalar(me, ReduceOp::sum), me % 2 == 0 ? 0 + 2 : 1 + 3);
}

namespace {

Tensor view(std::vector<uint16_t>& v, DType dtype, Device device = Device::cpu) {
    return Tensor(v.data(), dtype, {static_cast<int64_t>(v.size())}, device);
}

std::vector<uint16_t> rounded(DType dtype, const std::vector<float>& values) {
    std::vector<uint16_t> out;
    for (float v : values) out.push_back(dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v));
    return out;
}

}  // namespace

// 1 + e + e with e half a unit in the last place of 1: adding in 16 bits rounds 1 + e to 1
// (a tie, to even) and again, while the f32 sum 1 + 2e rounded once is the next number up.
PARALLEL_TEST(MpiCollectives, Bf16AndF16Sums_AreTheF32SumRoundedOnce, 3) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const float r = static_cast<float>(world.rank());
    for (const auto& [dtype, half_ulp] : {std::pair{DType::bf16, std::ldexp(1.0f, -8)}, std::pair{DType::f16, std::ldexp(1.0f, -11)}}) {
        std::vector<uint16_t> sum = rounded(dtype, {r == 0 ? 1.0f : half_ulp, r + 1, -r});
        std::vector<uint16_t> max = rounded(dtype, {r, -r - 1, 0.5f});
        world.all_reduce(view(sum, dtype), ReduceOp::sum);
        world.all_reduce(view(max, dtype), ReduceOp::max);
        EXPECT_EQ(sum, rounded(dtype, {1 + 2 * half_ulp, 6, -3})) << dtype_name(dtype);
        EXPECT_EQ(max, rounded(dtype, {2, -1, 0.5f})) << dtype_name(dtype);

        std::vector<uint16_t> in = rounded(dtype, {r == 0 ? 1.0f : half_ulp, r, 2 * r, 3, 4, r * r}), out(2);
        world.reduce_scatter(view(out, dtype), view(in, dtype));
        const std::vector<std::vector<float>> expected = {{1 + 2 * half_ulp, 3}, {6, 9}, {12, 5}};
        EXPECT_EQ(out, rounded(dtype, expected[static_cast<size_t>(world.rank())])) << dtype_name(dtype);
    }
}

// ReduceOp::sum_in_dtype (the bf16 gradient reduction) travels as 16-bit words and rounds
// every partial sum: 1 + e + e is 1 or 1 + 2e depending on the order MPI adds in, where
// ReduceOp::sum above is always 1 + 2e. Small integers stay exact, and every rank of an
// all-reduce ends with the same bits (replicas that disagreed would drift apart).
PARALLEL_TEST(MpiCollectives, Bf16AndF16SumsInDtype_RoundEachPartialSumAndAgreeOnEveryRank, 3) {
    ParallelContext ctx = world_context();
    Comm& world = *ctx.world;
    const float r = static_cast<float>(world.rank());
    for (const auto& [dtype, half_ulp] : {std::pair{DType::bf16, std::ldexp(1.0f, -8)}, std::pair{DType::f16, std::ldexp(1.0f, -11)}}) {
        const std::vector<uint16_t> either = rounded(dtype, {1, 1 + 2 * half_ulp});
        std::vector<uint16_t> sum = rounded(dtype, {r == 0 ? 1.0f : half_ulp, r + 1, -r, 0.25f * (r + 1)});
        world.all_reduce(view(sum, dtype), ReduceOp::sum_in_dtype);
        EXPECT_TRUE(sum[0] == either[0] || sum[0] == either[1]) << dtype_name(dtype) << ": " << sum[0];
        EXPECT_EQ(std::vector<uint16_t>(sum.begin() + 1, sum.end()), rounded(dtype, {6, -3, 1.5f})) << dtype_name(dtype);
        std::vector<uint16_t> everyone(sum.size() * 3);
        std::copy(sum.begin(), sum.end(), everyone.begin() + static_cast<std::ptrdiff_t>(sum.size()) * world.rank());
        world.all_gather(view(everyone, DType::u16));
        for (int other = 0; other < 3; ++other)
            EXPECT_TRUE(std::equal(sum.begin(), sum.end(), everyone.begin() + static_cast<std::ptrdiff_t>(sum.size()) * other))
                << dtype_name(dtype) << ": rank " << other << " ended with other bits";

        std::vector<uint16_t> in = rounded(dtype, {r == 0 ? 1.0f : half_ulp, r, 2 * r, 3, 4, r * r}), out(2);
        world.reduce_scatter(view(out, dtype), view(in, dtype), ReduceOp::sum_in_dtype);
        const std::vector<std::vector<float>> expected = {{1, 3}, {6, 9}, {12, 5}};
        std::vector<uint16_t> want = rounded(dtype, expected[static_cast<size_t>(world.rank())]);
        if (world.rank() == 0) EXPECT_TRUE(out[0] == either[0] || out[0] == either[1]) << dtype_name(dtype) << ": " << out[0];
        else EXPECT_EQ(out[0], want[0]) << dtype_name(dtype);
        EXPECT_EQ(out[1], want[1]) << dtype_name(dtype);
    }
}

PARALLEL_TEST(MpiCollectives, GpuTensors_AreStagedThroughBuffersReusedFromOperationToOperation, 3) {
    auto staging = std::make_shared<test::HostStaging>();
    ParallelConfig config;
    ParallelContext ctx = make_mpi_context(config, staging);
    Comm& world = *ctx.world;
    const float r = static_cast<float>(world.rank());
    int allocations_after_first = 0;
    for (int round = 0; round < 4; ++round) {
        std::vector<uint16_t> activations = rounded(DType::bf16, std::vector<float>(96, r + 1));
        std::vector<float> grads(96, r), piece(32);
        world.all_reduce(view(activations, DType::bf16, Device::cuda), ReduceOp::sum);
        world.reduce_scatter(Tensor(piece.data(), DType::f32, {32}, Device::cuda), Tensor(grads.data(), DType::f32, {96}, Device::cuda));
        CommHandle pending = world.all_gather_async(Tensor(grads.data(), DType::f32, {96}, Device::cuda));
        world.all_reduce(view(activations, DType::bf16, Device::cuda), ReduceOp::max);  // while the gather is in flight
        pending.wait();
        EXPECT_EQ(activations, rounded(DType::bf16, std::vector<float>(96, 6)));
        EXPECT_EQ(piece, std::vector<float>(32, 3));
        if (round == 0) allocations_after_first = staging->allocations();
    }
    EXPECT_GT(allocations_after_first, 0);
    EXPECT_EQ(staging->allocations(), allocations_after_first) << "later rounds must reuse the first round's staging buffers";
}

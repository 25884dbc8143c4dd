// The ordering of the event-ordered (NCCL) path, checked on the graph of streams, events and
// waits that a recording stand-in of the device builds: every collective waits for the
// event of the work that produced its input, and nothing on the compute stream reads (or
// overwrites) a collective's buffer before that collective's completion event. Data
// parallel buckets, ZeRO-1's reduce-scatter and all-gathers, a tensor-parallel all-reduce
// and the pipeline's transfers are driven as the trainer drives them, with the compute
// stream's kernels recorded by hand around them. Removing any one wait from
// EventOrderedComm, or a handle's wait from GradBuckets, makes these tests report a race.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "parallel/event_ordered_comm.h"
#include "parallel/grad_buckets.h"
#include "parallel/parameter_store.h"
#include "support/stream_graph.h"

using namespace llmtrain;

namespace {

OwnedTensor device_tensor(DType dtype, int64_t n) { return OwnedTensor(dtype, {n}, Device::cuda, allocate_host_memory); }
Tensor part(const Tensor& flat, int64_t begin, int64_t end) { return flat.slice_rows(begin, end - begin); }

std::vector<int> first_ranks(int size) {
    std::vector<int> ranks(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
    return ranks;
}

// One group's EventOrderedComm over recorded collectives of an idle group, publishing on a
// progress board of this process alone.
struct Rig {
    explicit Rig(const std::string& name, int rank = 0, int size = 2, double timeout_seconds = 300, bool point_to_point = false)
        : host(test::make_idle_group(name, rank, size)),
          board(ProgressBoard::private_board(rank, "test-node", [size](const std::string&, int) { return first_ranks(size); })),
          watchdog(order, timeout_seconds, rank, board.get()) {
        auto main = std::make_unique<test::RecordedCollectives>(*host, order);
        collectives = main.get();
        std::unique_ptr<StreamCollectives> reverse;
        if (point_to_point) reverse = std::make_unique<test::RecordedCollectives>(*host, order);
        comm = std::make_unique<EventOrderedComm>(*host, std::move(main), std::move(reverse), order, watchdog);
    }
    StreamId compute() const { return order.compute_stream(); }
    void kernel(const std::string& name, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes) { order.work(compute(), name, reads, writes); }

    test::RecordingStreamOrder order;
    std::unique_ptr<Comm> host;
    std::shared_ptr<ProgressBoard> board;
    CommWatchdog watchdog;
    test::RecordedCollectives* collectives = nullptr;
    std::unique_ptr<EventOrderedComm> comm;
};

constexpr int64_t kParams = 4, kParamNumel = 8, kNumel = kParams * kParamNumel;

FlatParameters flat_of(const OwnedTensor& values, const OwnedTensor& grads, const OwnedTensor* compute) {
    FlatParameters flat{DType::f32, values.view(), grads.view(), compute ? compute->view() : Tensor(), {},
                        [](DType dtype, Shape shape) { return OwnedTensor(dtype, shape, Device::cuda, allocate_host_memory); }};
    for (int64_t i = 0; i < kParams; ++i) flat.ranges.push_back({i * kParamNumel, (i + 1) * kParamNumel});
    return flat;
}

// Backward writes the parameters' gradients last to first and reports each ready, as the
// model does; then the buckets finish.
void backward(Rig& rig, GradBuckets& buckets, const FlatParameters& flat) {
    rig.kernel("zero gradients", {}, {flat.grads});
    buckets.begin_step(true);
    for (size_t i = flat.ranges.size(); i-- > 0;) {
        rig.kernel(cat("backward of parameter ", i), {}, {part(flat.grads, flat.ranges[i].begin, flat.ranges[i].end)});
        buckets.mark_ready(i, i + 1);
    }
    buckets.finish();
}

void expect_no_races(const Rig& rig) {
    for (const std::string& race : rig.order.races()) ADD_FAILURE() << race;
}

size_t count(const std::vector<std::string>& names, const std::string& name) { return static_cast<size_t>(std::count(names.begin(), names.end(), name)); }

}  // namespace

TEST(EventOrdering, MissingWaits_AreReportedAsRaces) {
    test::RecordingStreamOrder order;
    const StreamId comm = order.new_stream("dp");
    OwnedTensor buffer = device_tensor(DType::f32, 4);
    order.work(order.compute_stream(), "backward", {}, {buffer.view()});
    order.work(comm, "all_reduce", {buffer.view()}, {buffer.view()});
    EXPECT_EQ(order.races().size(), 1u) << "a collective that does not wait for its producer";

    test::RecordingStreamOrder ordered;
    const StreamId stream = ordered.new_stream("dp");
    ordered.work(ordered.compute_stream(), "backward", {}, {buffer.view()});
    ordered.wait(stream, ordered.record(ordered.compute_stream()));
    ordered.work(stream, "all_reduce", {buffer.view()}, {buffer.view()});
    EXPECT_TRUE(ordered.races().empty());
    ordered.work(ordered.compute_stream(), "adamw", {buffer.view()}, {});
    EXPECT_EQ(ordered.races().size(), 1u) << "a consumer that does not wait for the collective";
}

TEST(EventOrdering, DataParallelBuckets_WaitForBackwardAndTheOptimizerWaitsForThem) {
    Rig rig("dp");
    OwnedTensor values = device_tensor(DType::f32, kNumel), grads = device_tensor(DType::f32, kNumel);
    const FlatParameters flat = flat_of(values, grads, nullptr);
    GradBuckets buckets(flat, bucket_cuts(kNumel, 4, 2, 2 * kParamNumel * 4), false, *rig.comm, DType::f32, {});
    ASSERT_EQ(buckets.bucket_count(), 2u);
    for (int step = 0; step < 2; ++step) {
        rig.kernel("forward", {flat.values}, {});
        backward(rig, buckets, flat);
        rig.kernel("adamw", {flat.grads}, {flat.values});
    }
    expect_no_races(rig);
    EXPECT_EQ(count(rig.order.work_on(1), "all_reduce (dp)"), 4u);
}

TEST(EventOrdering, Zero1_ReduceScatterWaitsForBackwardAndTheAllGatherOfTheComputeCopyWaitsForTheOptimizer) {
    Rig rig("dp");
    OwnedTensor values = device_tensor(DType::f32, kNumel), grads = device_tensor(DType::f32, kNumel);
    OwnedTensor compute = device_tensor(DType::bf16, kNumel);
    const FlatParameters flat = flat_of(values, grads, &compute);
    GradBuckets buckets(flat, bucket_cuts(kNumel, 4, 2, 2 * kParamNumel * 4), true, *rig.comm, DType::f32, {});
    ASSERT_TRUE(buckets.zero1());
    // The parameter store all-gathers the updated pieces bucket by bucket (ZeRO-1's cuts).
    PlacementSpec spec;
    spec.padded_numel = kNumel;
    spec.zero_stage = 1;
    spec.cuts = bucket_cuts(kNumel, 4, 2, 2 * kParamNumel * 4);
    spec.shard_size = 2;
    ReplicatedParameters store(flat, Placement(spec), *rig.comm, {}, {{}, {}, [&rig](const Tensor& out, const Tensor& in) { rig.kernel("copy", {in}, {out}); }});
    for (int step = 0; step < 2; ++step) {
        rig.kernel("forward", {flat.compute_values}, {});
        backward(rig, buckets, flat);
        for (const OwnedPiece& piece : buckets.owned())
            rig.kernel("adamw", {piece.grads}, {part(flat.values, piece.begin, piece.end), part(flat.compute_values, piece.begin, piece.end)});
        store.after_update();
    }
    store.gather_master();
    rig.kernel("checkpoint copy", {flat.values}, {});
    expect_no_races(rig);
    const std::vector<std::string> dp = rig.order.work_on(1);
    EXPECT_EQ(count(dp, "reduce_scatter (dp)"), 4u);
    EXPECT_EQ(count(dp, "all_gather (dp)"), 6u);  // the compute copy twice, the master weights once
}

TEST(EventOrdering, TensorParallelAllReduce_WaitsForTheLayerAndTheNextOpWaitsForIt) {
    Rig rig("tp");
    OwnedTensor x = device_tensor(DType::bf16, 16), partial = device_tensor(DType::bf16, 16);
    for (int layer = 0; layer < 3; ++layer) {
        rig.kernel(cat("row-parallel matmul of layer ", layer), {x.view()}, {partial.view()});
        rig.comm->all_reduce(partial.view(), ReduceOp::sum);
        rig.kernel(cat("residual add of layer ", layer), {x.view(), partial.view()}, {x.view()});
    }
    expect_no_races(rig);
    EXPECT_EQ(count(rig.order.work_on(1), "all_reduce (tp)"), 3u);
}

// Routing tokens to experts: the all-to-all of chunks of their own sizes waits for the
// permutation that wrote its input, and the experts' GEMM for it.
TEST(EventOrdering, AllToAllV_WaitsForThePermutationAndTheExpertsWaitForIt) {
    Rig rig("ep");
    OwnedTensor tokens = device_tensor(DType::bf16, 12), routed = device_tensor(DType::bf16, 10);
    const std::vector<int64_t> send_counts{5, 7}, recv_counts{5, 5};
    for (int layer = 0; layer < 2; ++layer) {
        rig.kernel(cat("permute tokens by expert, layer ", layer), {}, {tokens.view()});
        rig.comm->all_to_all_v(routed.view(), recv_counts, tokens.view(), send_counts);
        rig.kernel(cat("experts' GEMM, layer ", layer), {routed.view()}, {});
    }
    expect_no_races(rig);
    EXPECT_EQ(count(rig.order.work_on(1), "all_to_all_v (ep)"), 2u);
}

TEST(EventOrdering, PipelineTransfers_TowardLowerRanksTakeTheirOwnStream) {
    Rig rig("pp", 1, 3, 300, true);
    OwnedTensor in = device_tensor(DType::bf16, 8), out = device_tensor(DType::bf16, 8);
    OwnedTensor grad_in = device_tensor(DType::bf16, 8), grad_out = device_tensor(DType::bf16, 8);
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
        rig.comm->recv(in.view(), 0);
        rig.kernel("forward", {in.view()}, {out.view()});
        CommHandle sent = rig.comm->send_async(out.view(), 2);
        rig.comm->recv(grad_out.view(), 2);
        rig.kernel("backward", {grad_out.view(), in.view()}, {grad_in.view()});
        CommHandle sent_back = rig.comm->send_async(grad_in.view(), 0);
        sent.wait();
        sent_back.wait();
    }
    expect_no_races(rig);
    EXPECT_EQ(rig.order.work_on(1), (std::vector<std::string>{"recv (pp)", "send (pp)", "recv (pp)", "send (pp)"}));  // upward
    EXPECT_EQ(rig.order.work_on(2), (std::vector<std::string>{"recv (pp)", "send (pp)", "recv (pp)", "send (pp)"}));  // downward
}

TEST(EventOrdering, Collectives_NeverMakeTheHostWaitAndHostScalarsGoOverTheHostComm) {
    Rig rig("dp");
    OwnedTensor grads = device_tensor(DType::f32, 8);
    for (int i = 0; i < 5; ++i) rig.comm->all_reduce(grads.view(), ReduceOp::sum);
    EXPECT_EQ(rig.watchdog.watched(), 5u);  // nothing was polled: the host did not wait
    EXPECT_EQ(rig.comm->all_reduce_scalar(2.5, ReduceOp::sum), 2.5);
    EXPECT_EQ(rig.order.work_on(1).size(), 5u);  // the scalar took the host Comm
    rig.watchdog.poll();
    EXPECT_EQ(rig.watchdog.watched(), 0u);
    EXPECT_NO_THROW(rig.watchdog.check());
}

TEST(EventOrdering, HungCollective_AbortsItsCommunicatorAndNamesTheRankTheOpAndTheGroup) {
    Rig rig("dp", 1, 2, 0.05);
    OwnedTensor grads = device_tensor(DType::f32, 8);
    rig.comm->all_reduce(grads.view(), ReduceOp::sum);
    rig.order.hang();
    rig.comm->all_reduce(grads.view(), ReduceOp::sum);
    rig.watchdog.poll();
    EXPECT_NO_THROW(rig.watchdog.check()) << "not late yet";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rig.watchdog.poll();
    EXPECT_TRUE(rig.collectives->aborted());
    try {
        rig.comm->all_reduce(grads.view(), ReduceOp::sum);
        FAIL() << "the next collective must throw";
    } catch (const Error& e) {
        // Rank 0's record is not on this rank's board: its node did not answer.
        EXPECT_NE(std::string(e.what()).find("all_reduce #2 in the dp group (world ranks 0, 1) did not complete within 0.05 s "
                                             "(parallel.timeout_seconds) on world rank 1: no record of world rank 0 could be read"),
                  std::string::npos)
            << e.what();
    }
}

TEST(EventOrdering, WatchdogThread_FindsAHangWithoutAnyoneAsking) {
    Rig rig("tp", 0, 2, 0.05);
    rig.watchdog.start(std::chrono::milliseconds(10));
    OwnedTensor partial = device_tensor(DType::bf16, 8);
    rig.order.hang();
    rig.comm->all_reduce(partial.view(), ReduceOp::sum);
    for (int i = 0; i < 200 && !rig.collectives->aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(rig.collectives->aborted());
    EXPECT_THROW(rig.watchdog.check(), Error);
}

TEST(EventOrdering, WatchdogClock_StartsWhenTheCollectiveCouldStartWhichIsWhenItArrives) {
    Rig rig("dp", 1, 2, 0.05);
    OwnedTensor grads = device_tensor(DType::f32, 8);
    rig.order.hang(rig.compute());  // the backward the collective waits for is still running
    rig.order.hang();               // and the collective hangs once it runs
    rig.comm->all_reduce(grads.view(), ReduceOp::sum);
    const auto device_lane = [&rig] { return *rig.board->read_local(1).find("dp", CommLane::device); };
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rig.watchdog.poll();
    EXPECT_NO_THROW(rig.watchdog.check()) << "enqueued 0.1 s ago, but it could not start: no clock yet";
    EXPECT_EQ(device_lane().collectives, 0u) << "the device has not reached it";
    EXPECT_EQ(rig.board->read_local(1).device_wait.channel, -1);

    rig.order.resume(rig.compute());
    rig.watchdog.poll();
    EXPECT_EQ(device_lane().collectives, 1u);
    EXPECT_EQ(device_lane().collective_op, CommOp::all_reduce);
    EXPECT_EQ(rig.board->read_local(1).device_wait.value, 1u) << "the device waits in it";
    EXPECT_NO_THROW(rig.watchdog.check()) << "it could start just now";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rig.watchdog.poll();
    EXPECT_THROW(rig.watchdog.check(), Error);
}

TEST(EventOrdering, WatchdogClock_OfAnOperationStartsOnceTheOneBeforeItOnItsStreamHasCompleted) {
    Rig rig("dp", 0, 2, 0.05);
    OwnedTensor grads = device_tensor(DType::f32, 8);
    const StreamId lane = 1;  // the group's stream, the first made after the compute stream
    rig.order.hang(lane);
    rig.comm->all_reduce(grads.view(), ReduceOp::sum);  // runs long
    rig.comm->all_reduce(grads.view(), ReduceOp::sum);  // queued behind it
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rig.order.resume(lane, 1);  // the first completes 0.1 s after both were queued
    rig.watchdog.poll();
    EXPECT_NO_THROW(rig.watchdog.check()) << "the second could start only now";
    EXPECT_EQ(rig.board->read_local(0).find("dp", CommLane::device)->collectives, 2u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rig.watchdog.poll();
    try {
        rig.watchdog.check();
        FAIL() << "the second collective hangs";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("all_reduce #2 in the dp group"), std::string::npos) << e.what();
    }
}

// 1-bit Adam's compressed all-reduce over MPI, on 2 and 4 ranks: every rank ends
// with the same vector, close to the true average (each value within the compression error
// of the chunk: the scale), and with error feedback the running sum of results tracks the
// running sum of true averages far more closely than one call does.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "optim/onebit_compression.h"
#include "parallel/context.h"
#include "parallel/mpi_comm.h"
#include "support/parallel_test.h"

using namespace llmtrain;

namespace {

// Rank r's input at call t: a shared signal plus a rank-dependent part (so the ranks disagree
// in sign on some values, as real momenta do).
float input(int rank, int t, size_t i) {
    return std::sin(0.05f * static_cast<float>(i) + 0.3f * static_cast<float>(t)) + 0.4f * std::cos(1.7f * static_cast<float>(i * (rank + 1)) + static_cast<float>(t));
}

void check_compressed_average(int world) {
    ParallelContext ctx = make_mpi_context(ParallelConfig{});
    Comm& group = *ctx.world;
    ASSERT_EQ(group.size(), world);
    const size_t n = 1000;  // not a multiple of 32 x world: padded
    CompressedAllReduce reduce(group, static_cast<int64_t>(n));
    std::vector<double> true_sum(n, 0.0), result_sum(n, 0.0);
    double first_error = 0;
    const int calls = 50;
    for (int t = 0; t < calls; ++t) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = input(group.rank(), t, i);
        reduce.average(x);
        double worst = 0;
        for (size_t i = 0; i < n; ++i) {
            double mean = 0;
            for (int r = 0; r < world; ++r) mean += input(r, t, i) / world;
            true_sum[i] += mean;
            result_sum[i] += x[i];
            worst = std::max(worst, std::fabs(x[i] - mean));
        }
        if (t == 0) first_error = worst;
        // Identical on every rank, bit for bit.
        std::vector<float> copy = x;
        group.all_reduce(Tensor(copy.data(), DType::f32, {static_cast<int64_t>(n)}), ReduceOp::max);
        ASSERT_EQ(copy, x) << "call " << t;
        // One call is off by at most the two compressions' scales (about the RMS of the values).
        EXPECT_LT(worst, 3.0) << "call " << t;
    }
    double drift = 0;
    for (size_t i = 0; i < n; ++i) drift = std::max(drift, std::fabs(result_sum[i] - true_sum[i]));
    // Error feedback: after 50 calls the sums differ by no more than a few single-call errors
    // (without it the difference grows with the number of calls).
    EXPECT_LT(drift, 3 * first_error) << "first call's error " << first_error;
    // 2 (p - 1) chunks of (4 + chunk / 8) bytes per call; an f32 ring all-reduce sends 2 (p - 1) 4 chunk.
    const int64_t chunk = reduce.chunk_numel();
    EXPECT_EQ(reduce.bytes_sent(), calls * 2 * (world - 1) * (4 + chunk / 8));
    EXPECT_GE(2 * (world - 1) * 4 * chunk, 25 * reduce.bytes_per_call());
}

}  // namespace

PARALLEL_TEST(OneBitCollectives, CompressedAllReduceOverTwoRanks_TracksTheAverageWithErrorFeedback, 2) { check_compressed_average(2); }
PARALLEL_TEST(OneBitCollectives, CompressedAllReduceOverFourRanks_TracksTheAverageWithErrorFeedback, 4) { check_compressed_average(4); }

PARALLEL_TEST(OneBitCollectives, AllToAll_DeliversChunkRFromEveryRankToRankR, 4) {
    ParallelContext ctx = make_mpi_context(ParallelConfig{});
    Comm& group = *ctx.world;
    const int p = group.size(), me = group.rank();
    std::vector<int32_t> in(static_cast<size_t>(2 * p)), out(in.size(), -1);
    for (int r = 0; r < p; ++r) in[static_cast<size_t>(2 * r)] = 100 * me + r, in[static_cast<size_t>(2 * r + 1)] = -(100 * me + r);
    group.all_to_all(Tensor(out.data(), DType::i32, {2 * p}), Tensor(in.data(), DType::i32, {2 * p}));
    for (int r = 0; r < p; ++r) {
        EXPECT_EQ(out[static_cast<size_t>(2 * r)], 100 * r + me);
        EXPECT_EQ(out[static_cast<size_t>(2 * r + 1)], -(100 * r + me));
    }
}

// 1-bit Adam's compression: the sign + scale round trip, error feedback over many calls, the
// compressed all-reduce on a group of one, and the layouts it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_compression.h"

using namespace llmtrain;

namespace {
std::vector<float> ramp(int64_t n, float phase) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i) + phase) * (1.0f + 0.01f * static_cast<float>(i));
    return x;
}
}  // namespace

TEST(OnebitCompression, RoundTripKeepsSignsAndNormAndTheErrorIsWhatWasLost) {
    const int64_t n = 64;
    std::vector<float> x = ramp(n, 0.5f), error(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    x[3] = 0.0f;  // sign(0) = +1
    std::vector<int32_t> words(static_cast<size_t>(compressed_words(n)));
    ASSERT_EQ(words.size(), 3u);  // the scale and 64 bits
    compress_signs(x.data(), n, words.data(), error.data());
    decompress_signs(words.data(), n, back.data());
    double squares = 0;
    for (float v : x) squares += static_cast<double>(v) * v;
    const float scale = static_cast<float>(std::sqrt(squares / n));
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(back[i], x[i] < 0 ? -scale : scale) << i;
        EXPECT_NEAR(back[i] + error[i], x[i], 1e-6) << i;
    }
}

namespace {
// After `calls` compressions of a steady input: the largest difference between the running
// sums of inputs and of what was sent, with error feedback and without.
std::pair<double, double> running_sum_drift(int calls) {
    const int64_t n = 96;
    std::vector<float> error(static_cast<size_t>(n), 0.0f), scratch(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    std::vector<double> input_sum(static_cast<size_t>(n), 0.0), sent_sum(static_cast<size_t>(n), 0.0), no_feedback_sum(static_cast<size_t>(n), 0.0);
    std::vector<int32_t> words(static_cast<size_t>(compressed_words(n)));
    for (int t = 0; t < calls; ++t) {
        // A steady input with a small wobble: what compression loses each call has the same
        // sign call after call, so without feedback it piles up linearly.
        std::vector<float> x = ramp(n, 0.5f);
        for (float& v : x) v += 0.05f * std::sin(0.7f * static_cast<float>(t));
        std::vector<float> with_error(static_cast<size_t>(n));
        for (size_t i = 0; i < x.size(); ++i) with_error[i] = x[i] + error[i], input_sum[i] += x[i];
        compress_signs(with_error.data(), n, words.data(), error.data());
        decompress_signs(words.data(), n, back.data());
        for (size_t i = 0; i < x.size(); ++i) sent_sum[i] += back[i];
        compress_signs(x.data(), n, words.data(), scratch.data());
        decompress_signs(words.data(), n, back.data());
        for (size_t i = 0; i < x.size(); ++i) no_feedback_sum[i] += back[i];
    }
    double drift = 0, drift_without = 0;
    for (size_t i = 0; i < input_sum.size(); ++i) {
        // The difference is exactly the last error.
        EXPECT_NEAR(sent_sum[i] + error[i], input_sum[i], 1e-3) << i;
        drift = std::max(drift, std::fabs(sent_sum[i] - input_sum[i]));
        drift_without = std::max(drift_without, std::fabs(no_feedback_sum[i] - input_sum[i]));
    }
    return {drift, drift_without};
}
}  // namespace

TEST(OnebitCompression, ErrorFeedbackMakesTheRunningSumOfSentValuesTrackTheInputs) {
    // With feedback the running sums stay apart by one bounded error however long it runs;
    // without, the losses pile up with the number of calls.
    const auto [drift_100, without_100] = running_sum_drift(100);
    const auto [drift_400, without_400] = running_sum_drift(400);
    EXPECT_LT(drift_400, 2 * std::max(drift_100, 1.0));
    EXPECT_GT(without_400, 3 * without_100);
    EXPECT_GT(without_400, 20 * drift_400);
}

TEST(CompressedAllReduce, OnOneRankIsTheCompressionWithErrorFeedbackAndSendsNothing) {
    const std::unique_ptr<Comm> self = make_self_comm("dp");
    CompressedAllReduce reduce(*self, 50);  // padded to 64
    EXPECT_EQ(reduce.chunk_numel(), 64);
    std::vector<float> x = ramp(50, 0.0f);
    const std::vector<float> input = x;
    reduce.average(x);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(std::signbit(x[i]), std::signbit(input[i])) << i;
    EXPECT_EQ(reduce.bytes_sent(), 0);
    EXPECT_NE(reduce.worker_error()[0], 0.0f);
}

TEST(OnebitAdamLayout, ZeroOneShardingAndFreezeStepBelowOneAreRefusedNamingTheKey) {
    OptimizerConfig optimizer;
    optimizer.name = OptimizerName::onebit_adam;
    ParallelConfig parallel;
    parallel.zero_stage = 1;
    try {
        check_optimizer_layout(optimizer, parallel, 2);
        FAIL() << "onebit_adam with ZeRO-1 on dp 2 was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("parallel.zero_stage = 0"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(check_optimizer_layout(optimizer, parallel, 1));  // nothing to shard on one rank
    parallel.zero_stage = 0;
    EXPECT_NO_THROW(check_optimizer_layout(optimizer, parallel, 4));
    optimizer.name = OptimizerName::adamw;
    parallel.zero_stage = 1;
    EXPECT_NO_THROW(check_optimizer_layout(optimizer, parallel, 4));
}

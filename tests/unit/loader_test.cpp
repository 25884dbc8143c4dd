// The sampler and the loader: every sample exactly once per epoch over all DP ranks, the
// same batches after a restart from a saved cursor, the same global order with another DP
// size, blending by weight, and prefetching that never changes what a batch holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "core/error.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/token_shard.h"

using namespace llmtrain;

namespace {

// Token i of the stream is first + i, so a window's first token says where it starts.
class CountingSource : public TokenSource {
public:
    CountingSource(uint64_t tokens, int32_t first = 0) : tokens_(tokens), first_(first) {}
    uint64_t token_count() const override { return tokens_; }
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        for (uint64_t i = 0; i < count; ++i) out[i] = first_ + static_cast<int32_t>(start + i);
    }
    std::string describe() const override { return "counting"; }

private:
    uint64_t tokens_;
    int32_t first_;
};

constexpr int64_t kSeqLen = 8;

std::vector<std::unique_ptr<TokenSource>> one_source(uint64_t samples) {
    std::vector<std::unique_ptr<TokenSource>> s;
    s.push_back(std::make_unique<CountingSource>(samples * kSeqLen + 1));
    return s;
}

// The start token of each row of a micro-batch (its sample * seq_len, for one source).
std::vector<int32_t> row_starts(DataLoader& loader, int64_t batch, int64_t step, int64_t micro, int rank, int size) {
    BatchBuffers b(batch, kSeqLen);
    loader.fill(b, step, micro, rank, size);
    std::vector<int32_t> starts;
    for (int64_t r = 0; r < batch; ++r) {
        EXPECT_EQ(b.targets.data<int32_t>()[r * kSeqLen], b.inputs.data<int32_t>()[r * kSeqLen] + 1);  // targets shifted by one
        starts.push_back(b.inputs.data<int32_t>()[r * kSeqLen]);
    }
    return starts;
}

// Samples of steps [first, last) in global order: rank by rank, micro-batch by micro-batch.
std::vector<int32_t> global_order(DataLoader& loader, int64_t batch, int64_t accum, int dp, int64_t first, int64_t last) {
    std::vector<int32_t> order;
    for (int64_t step = first; step < last; ++step)
        for (int rank = 0; rank < dp; ++rank)
            for (int64_t m = 0; m < accum; ++m)
                for (int32_t s : row_starts(loader, batch, step, m, rank, dp)) order.push_back(s);
    return order;
}

}  // namespace

// A validation sequence is the same whatever batch it is asked in: sequences 0..4 at once,
// or as 0..2 and 3..4, fill the same rows.
TEST(EvalWindows, SequencesDoNotDependOnTheBatchTheyAreAskedIn) {
    EvalWindows windows(std::make_unique<CountingSource>(40 * kSeqLen + 1), kSeqLen);
    BatchBuffers whole(5, kSeqLen), first(3, kSeqLen), rest(3, kSeqLen);
    windows.fill(whole, 0, 5);
    windows.fill(first, 0, 3);
    windows.fill(rest, 3, 2);
    for (int64_t row = 0; row < 5; ++row) {
        const int32_t start = row < 3 ? first.inputs.data<int32_t>()[row * kSeqLen] : rest.inputs.data<int32_t>()[(row - 3) * kSeqLen];
        EXPECT_EQ(whole.inputs.data<int32_t>()[row * kSeqLen], row * kSeqLen);
        EXPECT_EQ(start, row * kSeqLen) << "row " << row;
    }
}

TEST(Permutation, IsABijectionForAnySize) {
    for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 64ull, 1000ull}) {
        const Permutation p(n, 99);
        std::set<uint64_t> seen;
        for (uint64_t i = 0; i < n; ++i) seen.insert(p(i));
        EXPECT_EQ(seen.size(), n);
        EXPECT_LT(*seen.rbegin(), n);
    }
}

TEST(Loader, UnionOfAllDpRanksOverAnEpochIsEverySampleExactlyOnce) {
    const uint64_t samples = 96;
    DataLoader loader(one_source(samples), {1.0}, {kSeqLen, 3, 2, 42, 4, {}});
    // dp 4 x batch 3 x accum 2 = 24 samples per step: 4 steps are one epoch.
    std::multiset<int32_t> seen;
    for (int32_t s : global_order(loader, 3, 2, 4, 0, 4)) seen.insert(s / static_cast<int32_t>(kSeqLen));
    ASSERT_EQ(seen.size(), samples);
    for (uint64_t s = 0; s < samples; ++s) EXPECT_EQ(seen.count(static_cast<int32_t>(s)), 1u) << "sample " << s;
}

TEST(Loader, EachEpochIsShuffledDifferently) {
    DataLoader loader(one_source(50), {1.0}, {kSeqLen, 10, 1, 7, 0, {}});
    const auto first = global_order(loader, 10, 1, 1, 0, 5), second = global_order(loader, 10, 1, 1, 5, 10);
    EXPECT_NE(first, second);
    EXPECT_EQ(std::multiset<int32_t>(first.begin(), first.end()), std::multiset<int32_t>(second.begin(), second.end()));
}

TEST(Loader, RestartFromASavedCursorGivesTheSameBatches) {
    DataLoader uninterrupted(one_source(200), {1.0}, {kSeqLen, 4, 2, 5, 4, {}});
    const auto expected = global_order(uninterrupted, 4, 2, 2, 6, 12);
    for (int64_t stop : {1, 6}) {
        DataLoader before(one_source(200), {1.0}, {kSeqLen, 4, 2, 5, 4, {}});
        global_order(before, 4, 2, 2, 0, stop);
        const LoaderState saved = before.state_at(stop, 2);
        DataLoader resumed(one_source(200), {1.0}, {kSeqLen, 4, 2, saved.seed, 4, saved});
        auto got = global_order(resumed, 4, 2, 2, stop, 12);
        got.erase(got.begin(), got.begin() + (6 - stop) * 16);
        EXPECT_EQ(got, expected) << "stopped at step " << stop;
    }
}

TEST(Loader, ChangingDpSizeKeepsTheGlobalOrder) {
    // Global batch 16 samples: dp 2 x batch 4 x accum 2, then dp 4 x batch 4 x accum 1.
    DataLoader dp2(one_source(300), {1.0}, {kSeqLen, 4, 2, 11, 4, {}});
    const auto reference = global_order(dp2, 4, 2, 2, 0, 10);
    const LoaderState saved = dp2.state_at(5, 2);
    DataLoader dp4(one_source(300), {1.0}, {kSeqLen, 4, 1, 11, 4, saved});
    const auto resumed = global_order(dp4, 4, 1, 4, 5, 10);
    EXPECT_EQ(std::vector<int32_t>(reference.begin() + 80, reference.end()), resumed);
}

TEST(Loader, BlendsSourcesByWeight) {
    std::vector<std::unique_ptr<TokenSource>> sources;
    sources.push_back(std::make_unique<CountingSource>(1000 * kSeqLen + 1, 0));
    sources.push_back(std::make_unique<CountingSource>(1000 * kSeqLen + 1, 1 << 20));
    DataLoader loader(std::move(sources), {3.0, 1.0}, {kSeqLen, 8, 1, 1, 0, {}});
    int from_second = 0;
    for (int32_t s : global_order(loader, 8, 1, 1, 0, 500)) from_second += s >= (1 << 20);
    EXPECT_EQ(from_second, 1000);  // exactly a quarter of 4000 samples
}

TEST(Loader, PrefetchingDoesNotChangeBatchesEvenAfterJumps) {
    DataLoader plain(one_source(100), {1.0}, {kSeqLen, 4, 2, 3, 0, {}});
    DataLoader prefetching(one_source(100), {1.0}, {kSeqLen, 4, 2, 3, 3, {}});
    const std::vector<std::array<int64_t, 2>> requests = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {7, 1}, {8, 0}, {2, 0}, {2, 1}, {3, 0}};
    for (const auto& [step, micro] : requests) EXPECT_EQ(row_starts(prefetching, 4, step, micro, 1, 2), row_starts(plain, 4, step, micro, 1, 2));
}

TEST(Loader, SourceShorterThanOneSequenceIsAnError) {
    std::vector<std::unique_ptr<TokenSource>> sources;
    sources.push_back(std::make_unique<CountingSource>(kSeqLen));
    try {
        DataLoader loader(std::move(sources), {1.0}, {kSeqLen, 1, 1, 0, 0, {}});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("holds 8 tokens; one sequence needs train.seq_len + 1 = 9"), std::string::npos) << e.what();
    }
}

namespace {

// A CountingSource whose tokens [bad_begin, bad_end) lie in a corrupt block (block 3 of shard 0).
class CorruptCountingSource : public CountingSource {
public:
    CorruptCountingSource(uint64_t tokens, uint64_t bad_begin, uint64_t bad_end) : CountingSource(tokens), bad_begin_(bad_begin), bad_end_(bad_end) {}
    void read(uint64_t start, uint64_t count, int32_t* out) override {
        if (start < bad_end_ && start + count > bad_begin_) throw CorruptBlockError("counting.ltshard", 3, 0, bad_begin_, bad_end_ - bad_begin_, "zstd: checksum");
        CountingSource::read(start, count, out);
    }

private:
    uint64_t bad_begin_, bad_end_;
};

std::vector<std::unique_ptr<TokenSource>> corrupt_source(uint64_t samples) {
    std::vector<std::unique_ptr<TokenSource>> s;
    s.push_back(std::make_unique<CorruptCountingSource>(samples * kSeqLen + 1, 20 * kSeqLen + 3, 23 * kSeqLen));
    return s;
}

// Global samples replaced, in order, as each rank's loader reported them.
std::vector<uint64_t> replaced_samples(DataLoader& loader) {
    std::vector<uint64_t> samples;
    for (const ReplacedSample& r : loader.take_replaced()) {
        EXPECT_EQ(r.block, 3u);
        samples.push_back(r.global_sample);
    }
    return samples;
}

}  // namespace

// data.on_corrupt_block = "skip": samples 20, 21 and 22 (whose windows of 9 tokens meet
// tokens [163, 184)) become sample 23, the first whole one after them. Over one epoch (3 steps
// of 16 of the 48 samples) the global order, and the samples replaced, are the same on every
// dp size, micro-batch count and prefetch depth.
TEST(Loader, CorruptBlockSkipReplacesTheSameSamplesOnEveryLayout) {
    const int64_t batch = 4;
    DataLoader reference(corrupt_source(48), {1.0}, {kSeqLen, batch, 4, 5, 0, {}, true});
    const std::vector<int32_t> order = global_order(reference, batch, 4, 1, 0, 3);
    const std::vector<uint64_t> replaced = replaced_samples(reference);
    EXPECT_EQ(replaced.size(), 3u);
    std::map<int32_t, int> seen;
    for (int32_t start : order) ++seen[start / static_cast<int32_t>(kSeqLen)];
    for (int32_t sample = 20; sample <= 22; ++sample) EXPECT_EQ(seen.count(sample), 0u) << "sample " << sample << " meets the corrupt tokens";
    EXPECT_EQ(seen[23], 4) << "sample 23 is read for itself and for samples 20, 21 and 22";
    EXPECT_EQ(seen.size(), 45u);
    for (const auto& [dp, accum, prefetch] : std::vector<std::array<int64_t, 3>>{{2, 2, 0}, {4, 1, 3}, {2, 2, 2}}) {
        DataLoader layout(corrupt_source(48), {1.0}, {kSeqLen, batch, accum, 5, static_cast<size_t>(prefetch), {}, true});
        EXPECT_EQ(global_order(layout, batch, accum, static_cast<int>(dp), 0, 3), order) << "dp " << dp;
        std::vector<uint64_t> got = replaced_samples(layout), want = replaced;
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        EXPECT_EQ(got, want) << "dp " << dp;
    }
}

// "abort": the sample that meets the block stops the run, naming it and the remedy.
TEST(Loader, CorruptBlockAbortNamesTheBlockAndTheSample) {
    DataLoader loader(corrupt_source(48), {1.0}, {kSeqLen, 48, 1, 5, 0, {}, false});
    BatchBuffers b(48, kSeqLen);
    try {
        loader.fill(b, 0, 0, 0, 1);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::data);
        for (const char* needle : {"corrupt training data (sample ", "shard 'counting.ltshard': block 3", "data.on_corrupt_block = \"skip\""})
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << needle << " not in: " << e.what();
    }
}

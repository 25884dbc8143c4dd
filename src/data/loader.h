// The training data loader: fills the micro-batches of one data-parallel rank from the
// global sample order (sampler.h), with a prefetch thread and a bounded queue.
//
// Step s consumes the global samples [cursor(s), cursor(s) + B), B = batch_size *
// grad_accum * dp_size (the global batch), cursor(s) = resume.cursor + (s - resume.step) * B.
// DP rank r owns the contiguous slice [r * B / dp_size, (r + 1) * B / dp_size) of it and
// micro-batch m the m-th batch_size samples of that slice. The cursor is global, not per
// rank: a run resumed with another dp_size (and the same B) sees the same global order.
// Nothing here knows about MPI: dp_rank and dp_size are plain integers.
//
// A corrupt block (a token shard's block that fails its checksum, data.on_corrupt_block):
// "abort" stops the run naming the shard, the block and the global sample; "skip" replaces
// each sample whose window meets one by the next sample of the same source (k + 1, k + 2, ...
// modulo its samples) whose window reads whole. The substitute is a pure function of the
// files, so the global sample order, and thus what every rank of every layout reads at
// every step, is the same whichever rank meets the block first and whenever (prefetch,
// resume): no rank's discovery changes another rank's samples. Replacing a sample rather
// than masking its tokens keeps every micro-batch full and the loss's normalisation as it
// is; the substitute sample is read twice in that epoch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/batch_windows.h"
#include "data/external_formats.h"
#include "data/sampler.h"

namespace llmtrain {

// Where a run is in the data: what a checkpoint stores to resume exactly.
struct LoaderState {
    uint64_t step = 0;    // the optimizer step the cursor belongs to
    uint64_t cursor = 0;  // global index of that step's first sample
    uint64_t seed = 0;    // the sample order's only randomness
};

// A training sample replaced because its window met a corrupt block: which sample, and the
// first corrupt block it met (source, shard in the source's split, block in the shard).
struct ReplacedSample {
    uint64_t global_sample = 0;
    uint32_t source = 0;
    uint64_t shard = 0;
    uint32_t block = 0;
};

// A sample's stand-in: the sample read in its place, and the corrupt block (shard in the
// source's split, block in the shard) the replaced sample's window met first.
struct Substitute {
    uint64_t sample;
    uint64_t shard;
    uint32_t block;
};

// Reads sample windows of one source (of `samples` samples). At a corrupt block, with
// skip_corrupt = false the CorruptBlockError goes on; with skip_corrupt = true the window of
// the next sample that reads whole is read instead, and the substitute is returned (and kept,
// so a sample's stand-in is searched for once).
class WindowReader {
public:
    WindowReader(TokenSource& source, uint64_t samples, int64_t seq_len, bool skip_corrupt) : source_(source), samples_(samples), seq_len_(seq_len), skip_(skip_corrupt) {}
    // Tokens [sample * seq_len, + seq_len + 1) into out, or its substitute's; nullopt: the sample's own.
    std::optional<Substitute> read(uint64_t sample, int32_t* out);

private:
    TokenSource& source_;
    uint64_t samples_;
    int64_t seq_len_;
    bool skip_;
    std::map<uint64_t, Substitute> substitutes_;
};

struct LoaderOptions {
    int64_t seq_len = 0;
    int64_t batch_size = 0;   // samples per micro-batch on one rank
    int64_t grad_accum = 1;   // micro-batches per step
    uint64_t seed = 0;
    size_t prefetch = 4;      // micro-batches queued ahead; 0: no prefetch thread
    LoaderState resume{};     // default: step 0 at cursor 0
    bool skip_corrupt_blocks = false;  // data.on_corrupt_block = "skip"
};

class DataLoader {
public:
    // weights: one per source. Each source must hold at least seq_len + 1 tokens.
    DataLoader(std::vector<std::unique_ptr<TokenSource>> sources, const std::vector<double>& weights, LoaderOptions options);
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    // Micro-batch `micro_batch` of step `step` for DP rank dp_rank of dp_size.
    void fill(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size);
    // The state to checkpoint before step `step` runs (with this dp_size).
    LoaderState state_at(int64_t step, int dp_size) const;
    // Global index of row `row` of that micro-batch, and which sample it is.
    uint64_t global_sample(int64_t step, int64_t micro_batch, int dp_rank, int dp_size, int64_t row) const;
    SampleRef sample_at(uint64_t global_index) const { return order_->at(global_index); }
    // Where global sample global_index comes from: its source's file and document ids.
    std::string locate_sample(uint64_t global_index) const;
    uint64_t source_samples(size_t source) const { return samples_[source]; }
    // The samples replaced in the micro-batches fill() handed out since the last call.
    std::vector<ReplacedSample> take_replaced();
    BlockOrigin block_origin(const ReplacedSample& r) const { return sources_[r.source]->block_origin(r.shard, r.block); }
    std::string describe() const;

private:
    struct Request {
        int64_t step, micro_batch;
        int dp_rank, dp_size;
        bool operator==(const Request&) const = default;
    };
    struct Ready {
        Request request;
        std::vector<int32_t> windows;  // batch_size x (seq_len + 1)
        std::vector<ReplacedSample> replaced;
    };
    Request next_request(const Request& r) const;
    Ready build(const Request& r);
    void prefetch_loop();

    std::vector<std::unique_ptr<TokenSource>> sources_;
    std::vector<uint64_t> samples_;
    LoaderOptions options_;
    std::unique_ptr<GlobalSampleOrder> order_;
    std::mutex read_mutex_;  // sources (and readers_) are used by one thread at a time
    std::vector<WindowReader> readers_;  // one per source
    std::vector<ReplacedSample> replaced_;  // handed out, not yet taken (the caller's thread)

    std::mutex queue_mutex_;
    std::condition_variable queue_changed_;
    std::deque<Ready> queue_;
    bool have_next_ = false;
    Request next_{};
    std::optional<Request> in_flight_;
    uint64_t generation_ = 0;  // bumped on a jump: batches built for the old sequence are dropped
    bool stopping_ = false;
    std::thread thread_;
};

// Validation sequences: consecutive samples from the start of a source, the same at every
// evaluation and whatever the batch they are asked in (wrapping around a short source).
class EvalWindows {
public:
    // skip_corrupt: data.on_corrupt_block = "skip" (a replaced validation sample is logged
    // once per block by the rank that reads it).
    EvalWindows(std::unique_ptr<TokenSource> source, int64_t seq_len, bool skip_corrupt = false);
    // Rows [0, sequences) of out: samples first_sequence, first_sequence + 1, ...
    void fill(BatchBuffers& out, int64_t first_sequence, int64_t sequences);
    uint64_t token_count() const { return source_->token_count(); }
    // Distinct sequences: sample i is sample i % samples().
    uint64_t samples() const { return samples_; }
    TokenSource& source() { return *source_; }

private:
    std::unique_ptr<TokenSource> source_;
    int64_t seq_len_;
    uint64_t samples_;
    WindowReader reader_;
    std::set<std::pair<uint64_t, uint32_t>> reported_;  // corrupt blocks logged already
};

// Tokens [begin, end) of another source: a held-out tail, or everything before it.
std::unique_ptr<TokenSource> slice_source(std::shared_ptr<TokenSource> source, uint64_t begin, uint64_t end);

}  // namespace llmtrain

#include "data/loader.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "data/token_shard.h"

namespace llmtrain {

namespace {

uint64_t sample_count(const TokenSource& s, int64_t seq_len) {
    if (s.token_count() < static_cast<uint64_t>(seq_len) + 1)
        fail(ErrorKind::data, s.describe(), " holds ", s.token_count(), " tokens; one sequence needs train.seq_len + 1 = ", seq_len + 1);
    return (s.token_count() - 1) / static_cast<uint64_t>(seq_len);
}

void split_windows(BatchBuffers& out, const std::vector<int32_t>& windows, int64_t rows, int64_t seq_len) {
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t* w = windows.data() + r * (seq_len + 1);
        std::memcpy(out.inputs.data<int32_t>() + r * seq_len, w, static_cast<size_t>(seq_len) * sizeof(int32_t));
        std::memcpy(out.targets.data<int32_t>() + r * seq_len, w + 1, static_cast<size_t>(seq_len) * sizeof(int32_t));
    }
}

// data.on_corrupt_block = "abort": the error says what to do about it.
[[noreturn]] void stop_at_corrupt_block(const CorruptBlockError& e, const char* split, uint64_t sample) {
    fail(ErrorKind::data, "corrupt ", split, " data (sample ", sample, "): ", e.what(), "; data.on_corrupt_block = \"abort\" stops here: `llmtrain data verify DATASET` ",
         "lists every corrupt block, and data.on_corrupt_block = \"skip\" trains on without them");
}

class SliceSource : public TokenSource {
public:
    SliceSource(std::shared_ptr<TokenSource> source, uint64_t begin, uint64_t end) : source_(std::move(source)), begin_(begin), end_(end) {}
    uint64_t token_count() const override { return end_ - begin_; }
    void read(uint64_t start, uint64_t count, int32_t* out) override { source_->read(begin_ + start, count, out); }
    std::string describe() const override { return cat(source_->describe(), " tokens [", begin_, ", ", end_, ")"); }
    std::string locate(uint64_t start, uint64_t count) const override { return source_->locate(begin_ + start, count); }
    BlockOrigin block_origin(size_t shard, uint32_t block) const override { return source_->block_origin(shard, block); }

private:
    std::shared_ptr<TokenSource> source_;
    uint64_t begin_, end_;
};

}  // namespace

std::optional<Substitute> WindowReader::read(uint64_t sample, int32_t* out) {
    const uint64_t width = static_cast<uint64_t>(seq_len_) + 1;
    const auto seq_len = static_cast<uint64_t>(seq_len_);
    if (const auto known = substitutes_.find(sample); known != substitutes_.end()) {
        source_.read(known->second.sample * seq_len, width, out);
        return known->second;
    }
    try {
        source_.read(sample * seq_len, width, out);
        return std::nullopt;
    } catch (const CorruptBlockError& e) {
        if (!skip_) throw;
        for (uint64_t ahead = 1; ahead < samples_; ++ahead) {
            const uint64_t candidate = (sample + ahead) % samples_;
            if (substitutes_.count(candidate) > 0) continue;
            try {
                source_.read(candidate * seq_len, width, out);
            } catch (const CorruptBlockError&) {
                continue;
            }
            return substitutes_.emplace(sample, Substitute{candidate, e.shard_index, e.block()}).first->second;
        }
        fail(ErrorKind::data, source_.describe(), ": every sample meets a corrupt block (the first: ", e.what(), "): nothing left to train on");
    }
}

std::unique_ptr<TokenSource> slice_source(std::shared_ptr<TokenSource> source, uint64_t begin, uint64_t end) {
    return std::make_unique<SliceSource>(std::move(source), begin, end);
}

DataLoader::DataLoader(std::vector<std::unique_ptr<TokenSource>> sources, const std::vector<double>& weights, LoaderOptions options)
    : sources_(std::move(sources)), options_(options) {
    for (const auto& s : sources_) {
        samples_.push_back(sample_count(*s, options_.seq_len));
        readers_.emplace_back(*s, samples_.back(), options_.seq_len, options_.skip_corrupt_blocks);
    }
    order_ = std::make_unique<GlobalSampleOrder>(samples_, weights, options_.seed);
    if (options_.prefetch > 0) thread_ = std::thread([this] { prefetch_loop(); });
}

DataLoader::~DataLoader() {
    {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        stopping_ = true;
    }
    queue_changed_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::string DataLoader::describe() const {
    std::string text;
    for (size_t i = 0; i < sources_.size(); ++i) text += cat(i ? "; " : "", sources_[i]->describe(), ": ", sources_[i]->token_count(), " tokens, ", samples_[i], " samples");
    return text;
}

LoaderState DataLoader::state_at(int64_t step, int dp_size) const {
    if (step < 0 || static_cast<uint64_t>(step) < options_.resume.step)
        fail(ErrorKind::runtime, "data loader: step ", step, " lies before the resumed step ", options_.resume.step);
    const auto global_batch = static_cast<uint64_t>(options_.batch_size * options_.grad_accum * dp_size);
    return {static_cast<uint64_t>(step), options_.resume.cursor + (static_cast<uint64_t>(step) - options_.resume.step) * global_batch, options_.seed};
}

std::string DataLoader::locate_sample(uint64_t global_index) const {
    const SampleRef ref = order_->at(global_index);
    return sources_[ref.source]->locate(ref.sample * static_cast<uint64_t>(options_.seq_len), static_cast<uint64_t>(options_.seq_len) + 1);
}

uint64_t DataLoader::global_sample(int64_t step, int64_t micro_batch, int dp_rank, int dp_size, int64_t row) const {
    const uint64_t per_rank = static_cast<uint64_t>(options_.batch_size * options_.grad_accum);
    return state_at(step, dp_size).cursor + static_cast<uint64_t>(dp_rank) * per_rank + static_cast<uint64_t>(micro_batch * options_.batch_size + row);
}

// Reads the micro-batch's windows, sample by sample.
DataLoader::Ready DataLoader::build(const Request& r) {
    const int64_t width = options_.seq_len + 1;
    Ready ready{r, std::vector<int32_t>(static_cast<size_t>(options_.batch_size * width)), {}};
    std::lock_guard<std::mutex> lock(read_mutex_);
    for (int64_t row = 0; row < options_.batch_size; ++row) {
        const uint64_t global = global_sample(r.step, r.micro_batch, r.dp_rank, r.dp_size, row);
        const SampleRef ref = order_->at(global);
        try {
            if (const std::optional<Substitute> met = readers_[ref.source].read(ref.sample, ready.windows.data() + row * width))
                ready.replaced.push_back({global, ref.source, met->shard, met->block});
        } catch (const CorruptBlockError& e) {
            stop_at_corrupt_block(e, "training", global);
        }
    }
    return ready;
}

std::vector<ReplacedSample> DataLoader::take_replaced() { return std::exchange(replaced_, {}); }

DataLoader::Request DataLoader::next_request(const Request& r) const {
    if (r.micro_batch + 1 < options_.grad_accum) return {r.step, r.micro_batch + 1, r.dp_rank, r.dp_size};
    return {r.step + 1, 0, r.dp_rank, r.dp_size};
}

// The queue's head is handed out when it is what was asked for, or awaited when the prefetch
// thread is building it; anything else is a jump (first call, resume, another rank): build it
// here and prefetch on from there.
void DataLoader::fill(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size) {
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) fail(ErrorKind::runtime, "data loader: dp_rank ", dp_rank, " is outside dp_size ", dp_size);
    const Request wanted{step, micro_batch, dp_rank, dp_size};
    Ready ready;
    bool hit = false;
    {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        while (true) {
            if (!queue_.empty() && queue_.front().request == wanted) {
                ready = std::move(queue_.front());
                queue_.pop_front();
                hit = true;
                break;
            }
            if (queue_.empty() && in_flight_ && *in_flight_ == wanted) {
                queue_changed_.wait(lock);
                continue;
            }
            queue_.clear();
            ++generation_;
            next_ = next_request(wanted);
            have_next_ = true;
            break;
        }
    }
    queue_changed_.notify_all();
    if (!hit) ready = build(wanted);
    replaced_.insert(replaced_.end(), ready.replaced.begin(), ready.replaced.end());
    split_windows(out, ready.windows, options_.batch_size, options_.seq_len);
}

void DataLoader::prefetch_loop() {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    while (true) {
        queue_changed_.wait(lock, [&] { return stopping_ || (have_next_ && queue_.size() < options_.prefetch); });
        if (stopping_) return;
        const Request request = next_;
        const uint64_t generation = generation_;
        in_flight_ = request;
        next_ = next_request(request);
        lock.unlock();
        Ready ready;
        bool failed = false;
        try {
            ready = build(request);
        } catch (const std::exception&) {
            failed = true;  // the caller meets the same error when it builds this batch itself
        }
        lock.lock();
        in_flight_.reset();
        if (generation == generation_) {
            if (failed) have_next_ = false;
            else queue_.push_back(std::move(ready));
        }
        queue_changed_.notify_all();
    }
}

EvalWindows::EvalWindows(std::unique_ptr<TokenSource> source, int64_t seq_len, bool skip_corrupt)
    : source_(std::move(source)), seq_len_(seq_len), samples_(sample_count(*source_, seq_len)), reader_(*source_, samples_, seq_len, skip_corrupt) {}

void EvalWindows::fill(BatchBuffers& out, int64_t first_sequence, int64_t sequences) {
    const int64_t width = seq_len_ + 1;
    std::vector<int32_t> windows(static_cast<size_t>(sequences * width));
    for (int64_t row = 0; row < sequences; ++row) {
        const uint64_t sample = static_cast<uint64_t>(first_sequence + row) % samples_;
        std::optional<Substitute> met;
        try {
            met = reader_.read(sample, windows.data() + row * width);
        } catch (const CorruptBlockError& e) {
            stop_at_corrupt_block(e, "validation", sample);
        }
        if (met && reported_.emplace(met->shard, met->block).second) {
            const BlockOrigin b = source_->block_origin(met->shard, met->block);
            log_warn("data: validation sample ", sample, " meets corrupt block ", b.block, " of '", b.shard, "' (tokens [", b.first_token, ", ", b.first_token + b.tokens,
                     ")): replaced by validation sample ", met->sample, ", and so is every validation sample that meets the block (data.on_corrupt_block = \"skip\")");
        }
    }
    split_windows(out, windows, sequences, seq_len_);
}

}  // namespace llmtrain

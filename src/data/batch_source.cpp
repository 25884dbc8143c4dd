#include "data/batch_source.h"

#include <filesystem>

#include "core/error.h"
#include "core/philox.h"
#include "data/external_formats.h"
#include "data/token_source.h"
#include "data/tokenizer.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

// text / tokens: as before the loader existed, so runs on them stay bit for bit the same.
// The windows are keyed by a data step, which is the training step unless a rollback skipped
// data: global samples are numbered data step x B + (micro-batch, row), B the global batch,
// so the cursor of a checkpoint means here what it means for the loader.
class WindowBatchSource : public BatchSource {
public:
    WindowBatchSource(const Config& config, std::optional<LoaderState> resume)
        : config_(config), splits_(load_token_splits(config.data, config.model.vocab_size, config.train.seq_len)),
          resume_(resume.value_or(LoaderState{0, 0, config.train.seed})) {}

    // Ranks interleave as extra micro-batches: dp_size = 1 draws exactly the old windows.
    void fill_train(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size) override {
        const TrainConfig& t = config_.train;
        const auto data_step = static_cast<int64_t>(state_at(step, dp_size)->cursor / global_batch(dp_size));
        fill_train_batch(out, splits_.train, t.seed, data_step, dp_rank * t.grad_accum + micro_batch, t.grad_accum * dp_size, t.batch_size, t.seq_len);
    }
    void fill_eval(BatchBuffers& out, int64_t first_sequence, int64_t sequences) override {
        fill_eval_batch(out, splits_.val, first_sequence, sequences, config_.train.seq_len);
    }
    // Window w starts at token w * seq_len modulo (tokens - seq_len): the windows before the
    // first wrap are (tokens - 1) / seq_len, as the loader's samples of a source (loader.h).
    std::optional<int64_t> distinct_eval_sequences() const override {
        return (static_cast<int64_t>(splits_.val.size()) - 1) / config_.train.seq_len;
    }
    std::string describe() const override { return cat(splits_.train.size(), " training and ", splits_.val.size(), " validation tokens"); }
    std::vector<int32_t> prompt_tokens(const std::string& prompt) const override {
        if (config_.data.format == DataFormat::tokens) return {splits_.val.front()};
        std::vector<int32_t> context = bytes_to_tokens(prompt, "");
        context.insert(context.begin(), byte_eos_token);  // start as at a document boundary
        return context;
    }
    std::string printable(const std::vector<int32_t>& tokens) const override {
        std::string out;
        for (int32_t t : tokens) {
            if (config_.data.format == DataFormat::tokens) out += cat(out.empty() ? "" : " ", t);
            else if (t == byte_eos_token) out += "\n<|eos|>\n";
            else out += static_cast<char>(t);
        }
        return out;
    }
    std::optional<LoaderState> state_at(int64_t step, int dp_size) const override {
        return LoaderState{static_cast<uint64_t>(step), resume_.cursor + (static_cast<uint64_t>(step) - resume_.step) * global_batch(dp_size), resume_.seed};
    }
    std::string describe_samples(uint64_t begin, uint64_t end) const override {
        return cat("windows at random offsets of '", config_.data.train_path, "' (the training split) drawn from (seed ", config_.train.seed,
                   ", data step, micro-batch, row) for global samples [", begin, ", ", end, ")");
    }

private:
    uint64_t global_batch(int dp_size) const { return static_cast<uint64_t>(config_.train.batch_size * config_.train.grad_accum * dp_size); }
    Config config_;
    TokenSplits splits_;
    LoaderState resume_;
};

// Uniform random tokens from Philox, keyed by (seed, the global sequence): what `bench`
// measures on, with no data files and no loader cost. Nothing to learn.
class SyntheticBatchSource : public BatchSource {
public:
    explicit SyntheticBatchSource(const Config& config) : config_(config), stream_(config.train.seed, fnv1a64("synthetic tokens")) {}

    void fill_train(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size) override {
        const TrainConfig& t = config_.train;
        const int64_t global_micro_batch = (step * dp_size + dp_rank) * t.grad_accum + micro_batch;
        fill(out, global_micro_batch * t.batch_size, t.batch_size, training);
    }
    void fill_eval(BatchBuffers& out, int64_t first_sequence, int64_t sequences) override { fill(out, first_sequence, sequences, evaluation); }
    std::optional<int64_t> distinct_eval_sequences() const override { return std::nullopt; }
    std::string describe() const override { return cat("synthetic: uniform random tokens over the vocabulary of ", config_.model.vocab_size); }
    std::vector<int32_t> prompt_tokens(const std::string&) const override { return {0}; }
    std::string printable(const std::vector<int32_t>& tokens) const override {
        std::string out;
        for (int32_t t : tokens) out += cat(out.empty() ? "" : " ", t);
        return out;
    }
    std::optional<LoaderState> state_at(int64_t, int) const override { return std::nullopt; }
    std::string describe_samples(uint64_t begin, uint64_t end) const override { return cat("synthetic samples [", begin, ", ", end, ")"); }

private:
    static constexpr uint64_t training = 0, evaluation = 1;
    // Rows [0, sequences) from sequences first_sequence, ... of the training or the evaluation
    // stream (even and odd keys): sequence k's seq_len + 1 tokens are Philox draws from
    // (2k + split) * (seq_len + 1) on.
    void fill(BatchBuffers& out, int64_t first_sequence, int64_t sequences, uint64_t split) const {
        const int64_t seq_len = config_.train.seq_len;
        const auto vocab = static_cast<uint64_t>(config_.model.vocab_size);
        for (int64_t row = 0; row < sequences; ++row) {
            const uint64_t first = (2 * static_cast<uint64_t>(first_sequence + row) + split) * static_cast<uint64_t>(seq_len + 1);
            for (int64_t i = 0; i < seq_len; ++i) {
                const int64_t at = row * seq_len + i;
                out.inputs.data<int32_t>()[at] = static_cast<int32_t>(stream_.below(first + static_cast<uint64_t>(i), vocab));
                out.targets.data<int32_t>()[at] = static_cast<int32_t>(stream_.below(first + static_cast<uint64_t>(i) + 1, vocab));
            }
        }
    }
    Config config_;
    PhiloxStream stream_;
};

std::unique_ptr<TokenSource> open_source(DataFormat format, const std::string& path, const std::string& split, uint64_t vocab) {
    switch (format) {
        case DataFormat::shards: return open_shard_dataset(path, split, vocab);
        case DataFormat::megatron: return open_megatron(path, vocab);
        case DataFormat::llmc: return open_llmc(path, vocab);
        case DataFormat::nanogpt: return open_nanogpt(path, vocab);
        default: fail(ErrorKind::runtime, "the data loader does not read the text and tokens formats");
    }
}

struct TrainVal {
    std::unique_ptr<TokenSource> train;
    std::unique_ptr<TokenSource> val;
};

// Validation: data.val_path, else the dataset's val split (shards), else the last
// val_fraction of the training source's tokens, which training then leaves out.
TrainVal open_train_and_val(const DataConfig& d, const std::string& train_path, bool first, uint64_t vocab) {
    TrainVal tv;
    tv.train = open_source(d.format, train_path, "train", vocab);
    if (!first) return tv;
    if (!d.val_path.empty()) {
        tv.val = open_source(d.format, d.val_path, "val", vocab);
        return tv;
    }
    if (d.format == DataFormat::shards) {
        auto val = open_source(d.format, train_path, "val", vocab);
        if (val->token_count() > 0) {
            tv.val = std::move(val);
            return tv;
        }
    }
    if (!(d.val_fraction > 0)) fail(ErrorKind::data, "data.val_fraction: '", train_path, "' has no validation split; set data.val_path or a val_fraction > 0");
    std::shared_ptr<TokenSource> whole(std::move(tv.train));
    const uint64_t tokens = whole->token_count();
    const auto held_out = static_cast<uint64_t>(static_cast<double>(tokens) * d.val_fraction);
    tv.train = slice_source(whole, 0, tokens - held_out);
    tv.val = slice_source(whole, tokens - held_out, tokens);
    return tv;
}

}  // namespace

std::optional<Tokenizer> run_tokenizer(const Config& config) {
    std::string path = config.data.tokenizer;
    if (path.empty() && config.data.format == DataFormat::shards) {
        const fs::path own = fs::path(config.data.train_path).parent_path() / "tokenizer.json";
        if (fs::exists(own)) path = own.string();
    }
    if (path.empty()) return std::nullopt;
    return Tokenizer::load(path);
}

namespace {

// Another tokenizer than a dataset's own would print its samples as the wrong text, and a
// blend of datasets of different tokenizers would mix ids that mean different things.
void check_tokenizer_of_datasets(const DataConfig& data, const Tokenizer& tokenizer) {
    if (data.format != DataFormat::shards) return;
    const uint64_t hash = tokenizer.hash();
    for (const WeightedPath& source : training_sources(data)) check_dataset_tokenizer(source.path, hash, tokenizer.source());
    if (!data.val_path.empty()) check_dataset_tokenizer(data.val_path, hash, tokenizer.source());
}

class LoaderBatchSource : public BatchSource {
public:
    LoaderBatchSource(const Config& config, std::optional<LoaderState> resume) : config_(config), tokenizer_(run_tokenizer(config)) {
        if (tokenizer_) check_tokenizer_of_datasets(config.data, *tokenizer_);
        const auto vocab = static_cast<uint64_t>(config.model.vocab_size);
        const bool skip_corrupt = config.data.on_corrupt_block == CorruptBlockPolicy::skip;
        std::vector<std::unique_ptr<TokenSource>> sources;
        std::vector<double> weights;
        for (const WeightedPath& source : training_sources(config.data)) {
            TrainVal tv = open_train_and_val(config.data, source.path, sources.empty(), vocab);
            if (tv.val) eval_ = std::make_unique<EvalWindows>(std::move(tv.val), config.train.seq_len, skip_corrupt);
            sources.push_back(std::move(tv.train));
            weights.push_back(source.weight);
        }
        const TrainConfig& t = config.train;
        loader_ = std::make_unique<DataLoader>(std::move(sources), weights,
                                               LoaderOptions{t.seq_len, t.batch_size, t.grad_accum, t.seed, static_cast<size_t>(config.data.prefetch), resume.value_or(LoaderState{}), skip_corrupt});
    }
    void fill_train(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size) override {
        loader_->fill(out, step, micro_batch, dp_rank, dp_size);
    }
    void fill_eval(BatchBuffers& out, int64_t first_sequence, int64_t sequences) override { eval_->fill(out, first_sequence, sequences); }
    std::optional<int64_t> distinct_eval_sequences() const override { return static_cast<int64_t>(eval_->samples()); }
    std::string describe() const override { return cat(loader_->describe(), " | validation ", eval_->token_count(), " tokens"); }
    std::vector<int32_t> prompt_tokens(const std::string& prompt) const override {
        std::vector<int32_t> context;
        if (tokenizer_ && tokenizer_->end_of_text_id()) context.push_back(*tokenizer_->end_of_text_id());
        if (tokenizer_) tokenizer_->encode_append(prompt, context);
        if (context.empty()) {
            context.resize(1);
            eval_->source().read(0, 1, context.data());
        }
        return context;
    }
    // Ids the tokenizer lacks (a model vocabulary padded beyond it) print as <|id|>.
    std::string printable(const std::vector<int32_t>& tokens) const override {
        std::string out;
        for (int32_t t : tokens) {
            if (!tokenizer_) out += cat(out.empty() ? "" : " ", t);
            else if (t < tokenizer_->vocab_size() && !tokenizer_->spec().token_bytes[static_cast<size_t>(t)].empty()) out += tokenizer_->decode(&t, 1);
            else out += cat("<|", t, "|>");
        }
        return out;
    }
    std::optional<LoaderState> state_at(int64_t step, int dp_size) const override { return loader_->state_at(step, dp_size); }
    std::vector<ReplacedSample> take_replaced_samples() override { return loader_->take_replaced(); }
    BlockOrigin corrupt_block_origin(const ReplacedSample& r) const override { return loader_->block_origin(r); }
    // One entry per sample, "1600: 'train-00000.ltshard' documents 12-14", the first
    // kListedSamples of them.
    std::string describe_samples(uint64_t begin, uint64_t end) const override {
        constexpr uint64_t kListedSamples = 4096;
        std::string text;
        for (uint64_t g = begin; g < end && g < begin + kListedSamples; ++g) text += cat(g == begin ? "" : "; ", g, ": ", loader_->locate_sample(g));
        if (end - begin > kListedSamples) text += cat("; and ", end - begin - kListedSamples, " more");
        return text;
    }

private:
    Config config_;
    std::optional<Tokenizer> tokenizer_;
    std::unique_ptr<DataLoader> loader_;
    std::unique_ptr<EvalWindows> eval_;
};

}  // namespace

std::optional<std::string> repeated_eval_warning(const BatchSource& data, int64_t sequences, int64_t seq_len, const std::string& fix) {
    const std::optional<int64_t> distinct = data.distinct_eval_sequences();
    if (!distinct || sequences <= *distinct) return std::nullopt;
    return cat("validation: ", sequences, " sequences of ", seq_len, " tokens asked, but the validation data holds ", *distinct,
               " distinct ones: the other ", sequences - *distinct, " wrap around and repeat its tokens (", fix, *distinct, " reads each once)");
}

int32_t document_end_token(const Config& config) {
    if (config.data.format == DataFormat::text) return byte_eos_token;
    const char* key = config.data.attention_mask == AttentionMask::document ? "data.attention_mask" : "data.reset_position_ids";
    const std::optional<Tokenizer> tokenizer = run_tokenizer(config);
    if (!tokenizer) fail(ErrorKind::config, key, ": documents end at the tokenizer's end-of-text token, and this data has no tokenizer (set data.tokenizer)");
    const std::optional<int32_t> end = tokenizer->end_of_text_id();
    if (!end)
        fail(ErrorKind::config, key, ": the tokenizer ", tokenizer->source(), " has no end-of-text token to end documents at (allowed: \"causal\", false)");
    return *end;
}

std::unique_ptr<BatchSource> make_synthetic_batch_source(const Config& config) { return std::make_unique<SyntheticBatchSource>(config); }

std::unique_ptr<BatchSource> make_batch_source(const Config& config, std::optional<LoaderState> resume) {
    if (config.data.format == DataFormat::text || config.data.format == DataFormat::tokens) return std::make_unique<WindowBatchSource>(config, resume);
    return std::make_unique<LoaderBatchSource>(config, resume);
}

}  // namespace llmtrain

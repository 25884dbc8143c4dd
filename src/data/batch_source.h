// What the trainer asks of its data: fill the (inputs, targets) of a training micro-batch for
// (step, micro-batch, dp_rank, dp_size), fill evaluation sequences, and turn token ids into
// printable text for samples. Two implementations behind one interface:
//  - text / tokens: the whole file in memory, windows at random offsets (batch_windows.h);
//  - shards / megatron / llmc / nanogpt: the data loader (loader.h) over one or more
//    blended sources, with the dataset's tokenizer (if any) to print samples.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/batch_windows.h"
#include "data/loader.h"
#include "data/tokenizer.h"

namespace llmtrain {

class BatchSource {
public:
    virtual ~BatchSource() = default;
    virtual void fill_train(BatchBuffers& out, int64_t step, int64_t micro_batch, int dp_rank, int dp_size) = 0;
    // Rows [0, sequences) of out: validation sequences first_sequence, first_sequence + 1, ...
    // Sequence i is the same whatever the batch it is asked in.
    virtual void fill_eval(BatchBuffers& out, int64_t first_sequence, int64_t sequences) = 0;
    // How many distinct validation sequences the data holds: those past it wrap around to the
    // start of the validation tokens and repeat them. nullopt: they never repeat (synthetic).
    virtual std::optional<int64_t> distinct_eval_sequences() const = 0;
    // One line for the startup log: sources and token counts.
    virtual std::string describe() const = 0;
    // Tokens to start generation from: the prompt after an end-of-document token.
    virtual std::vector<int32_t> prompt_tokens(const std::string& prompt) const = 0;
    virtual std::string printable(const std::vector<int32_t>& tokens) const = 0;
    // Where the data stands before step `step` (for checkpoints and rollbacks). Step s reads
    // the global samples [cursor(s), cursor(s) + B), B the global batch; a source made with
    // another state (a rollback that skips data) continues from its cursor.
    virtual std::optional<LoaderState> state_at(int64_t step, int dp_size) const = 0;
    // Where global samples [begin, end) come from, for a person to look at them.
    virtual std::string describe_samples(uint64_t begin, uint64_t end) const = 0;
    // Training samples replaced since the last call because they met a corrupt block
    // (data.on_corrupt_block = "skip"; data/loader.h), and the file and tokens of such a block.
    // Only token shards have blocks: the other sources never replace one.
    virtual std::vector<ReplacedSample> take_replaced_samples() { return {}; }
    virtual BlockOrigin corrupt_block_origin(const ReplacedSample& r) const { fail(ErrorKind::runtime, describe(), " has no corrupt block ", r.block); }
};

// The tokenizer a run's text goes through: data.tokenizer, else a shards dataset's own
// tokenizer.json; none for byte-level text, token files and external formats without one.
std::optional<Tokenizer> run_tokenizer(const Config& config);

// The end-of-text id that ends each document of the run's data (data.attention_mask =
// "document", data.reset_position_ids): the byte vocabulary's for data.format = "text", else
// the run's tokenizer's. A config error naming the key when there is none.
int32_t document_end_token(const Config& config);

// A warning's text where `sequences` validation sequences exceed the distinct ones `data`
// holds, naming both counts and `fix`, the key or flag that sets the count ("--sequences ");
// nullopt where every sequence is distinct.
std::optional<std::string> repeated_eval_warning(const BatchSource& data, int64_t sequences, int64_t seq_len, const std::string& fix);

// Opens the configured data; errors name the key and the file. resume: where a resumed run's
// data stands (from its checkpoint, or a rollback that skips data); nullopt: the start.
std::unique_ptr<BatchSource> make_batch_source(const Config& config, std::optional<LoaderState> resume = std::nullopt);
// Uniform random tokens, no files (`bench`).
std::unique_ptr<BatchSource> make_synthetic_batch_source(const Config& config);

}  // namespace llmtrain

// A checkpoint loaded whole into this one process, whatever tp / pp / dp layout saved it
// (`generate`, `eval`), and the text its tokens stand for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/manifest.h"
#include "config/config.h"
#include "data/tokenizer.h"
#include "model/transformer.h"

namespace llmtrain {

// The checkpoint a path names, verified (checkpoint_store.h: verify_checkpoint): a checkpoint
// directory itself; a checkpoint.dir (the newest checkpoint of the one run it holds); or a
// run directory (the newest checkpoint of that run's own chain, never another run's). A
// newest checkpoint that fails verification is refused, naming the newest valid one to pass
// instead: shipping an older model than the user thinks is worse than an error. Throws
// Error(data) naming the path when there is none.
std::string find_checkpoint(const std::string& path);

struct ModelOptions {
    std::vector<std::string> overrides;  // --set on the saved config
    std::string device;                  // "", "cpu" or "cuda": "" is the run's train.device
    int64_t threads = 0;                 // CPU threads; 0: every core
    // The activations planned: one sequence of model.max_seq_len tokens, or (training_shape)
    // micro-batches of the run's train.batch_size x train.seq_len.
    bool training_shape = false;
};

struct CheckpointModel {
    std::string path;
    Manifest manifest;
    Config config;  // the run's effective config, with the overrides
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Transformer> model;
};
// Reads the saved config (data files are not required) and the weights.
CheckpointModel load_checkpoint_model(const std::string& path, const ModelOptions& options);

// Text <-> token ids for a run: through a tokenizer (--tokenizer, else the run's own), as
// bytes (byte-level text: ids 0-255 and 256 for the end of a document), or as the ids
// themselves, written in decimal, when the run has no tokenizer.
class TextCodec {
public:
    TextCodec(const Config& config, const std::string& tokenizer_path);
    // The prompt's ids, after an end-of-document token where document_start and the run's
    // text has one (byte-level text, a tokenizer with an end-of-text token): the model then
    // continues it as the start of a new document, as its training data begins one.
    std::vector<int32_t> encode_prompt(const std::string& prompt, bool document_start = true) const;
    // The end-of-document token encode_prompt puts first ("<|endoftext|>"); nullopt where none.
    std::optional<std::string> document_start_token() const;
    std::string token_text(int32_t token) const;
    // Bytes of text the token stands for (0 for the end of a document); nullopt without text.
    std::optional<int64_t> token_bytes(int32_t token) const;
    std::string describe() const;

private:
    enum class Kind { tokenizer, bytes, ids } kind_;
    std::optional<Tokenizer> tokenizer_;
    std::string source_;
};

}  // namespace llmtrain

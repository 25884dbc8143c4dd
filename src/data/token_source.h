// The in-memory data formats: raw text read as bytes (vocabulary of 256 byte values +
// EOS = 256) or a flat file of token ids (u16 or i32), split into a training and a
// validation stream of token ids. The tokenized formats go through loader.h instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace llmtrain {

constexpr int32_t byte_eos_token = 256;  // ends a document in the byte-level vocabulary
constexpr int64_t byte_vocab_size = 257;

struct TokenSplits {
    std::vector<int32_t> train;
    std::vector<int32_t> val;
};

// Bytes of text as tokens; each occurrence of separator (if non-empty) becomes one EOS.
std::vector<int32_t> bytes_to_tokens(const std::string& text, const std::string& separator);

// Loads data.train_path (and data.val_path, or holds out the last val_fraction of the
// training tokens). Every split must hold at least seq_len + 1 tokens, and every id must be
// below vocab_size; errors name the file and the token offset.
TokenSplits load_token_splits(const DataConfig& data, int64_t vocab_size, int64_t seq_len);

}  // namespace llmtrain

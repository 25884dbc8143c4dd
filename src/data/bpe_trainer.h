// Trains a byte-level BPE vocabulary on a corpus, as Hugging Face's BpeTrainer does: the
// text is cut into pieces by the pre-tokenizer pattern and counted; starting from the 256
// byte tokens, the most frequent adjacent pair (ties: the lower pair of ids) is merged into
// a new token, again and again, until the vocabulary is full or no pair occurs
// min_frequency times. Special tokens take the last ids and are never learnt from the text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/pretokenizer.h"
#include "data/tokenizer.h"

namespace llmtrain {

struct BpeTrainOptions {
    int64_t vocab_size = 0;                                   // including the 256 bytes and the special tokens
    std::string pattern = kGpt2Pattern;
    std::vector<std::string> special_tokens = {"<|endoftext|>"};
    int64_t min_frequency = 2;
};

class BpeTrainer {
public:
    explicit BpeTrainer(BpeTrainOptions options);
    // Counts the pieces of text (special tokens in it are skipped, not learnt).
    void add_text(std::string_view text);
    Tokenizer train(const std::string& source_name) const;
    size_t distinct_pieces() const { return piece_counts_.size(); }

private:
    BpeTrainOptions options_;
    Pretokenizer pretokenizer_;
    std::unordered_map<std::string, int64_t> piece_counts_;
};

}  // namespace llmtrain

// Byte-level BPE as GPT-2 and Hugging Face `tokenizers` do it: added (special) tokens are cut
// out of the text first (leftmost, longest), the rest is split by the pre-tokenizer pattern,
// each piece becomes its bytes' tokens, and adjacent tokens are merged by merge rank (lowest
// first, leftmost among equals) until no listed merge applies. Every byte has a token, so any
// byte string encodes and decode(encode(x)) == x.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/pretokenizer.h"

namespace llmtrain {

struct AddedToken {
    std::string content;  // matched literally in the text
    int32_t id = 0;
    bool special = true;
};

// Everything that defines a tokenizer; what the loaders produce and the trainer builds.
struct TokenizerSpec {
    std::vector<std::string> token_bytes;                 // id -> the bytes it stands for ("" for an unused id)
    std::vector<std::pair<int32_t, int32_t>> merges;      // in rank order: (left id, right id)
    std::vector<AddedToken> added;
    std::string pattern;                                   // pre-tokenizer regex
    bool ignore_merges = false;                            // a piece that is itself a token skips the merges (Llama 3)
};

// Memo of piece -> ids; one per thread, since pieces repeat (" the", " of") all the time.
class EncodeCache {
public:
    const std::vector<int32_t>* find(std::string_view piece) const;
    void insert(std::string_view piece, const std::vector<int32_t>& ids);

private:
    // Transparent hashing: a lookup by string_view allocates nothing.
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> entries_;
};

class Tokenizer {
public:
    // `source` names the file in errors. Throws ErrorKind::data on an inconsistent spec.
    Tokenizer(TokenizerSpec spec, std::string source);

    // A Hugging Face tokenizer.json, a directory holding one, or a directory holding GPT-2's
    // encoder.json + vocab.bpe.
    static Tokenizer load(const std::string& path);
    static Tokenizer from_hf_json(const std::string& json_text, const std::string& source);
    static Tokenizer from_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
    // tokenizer.json text that from_hf_json (and Hugging Face) read back.
    std::string to_hf_json() const;

    std::vector<int32_t> encode(std::string_view text, EncodeCache* cache = nullptr) const;
    void encode_append(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache = nullptr) const;
    // Bytes of the ids; an id outside the vocabulary is an error naming its position.
    std::string decode(const int32_t* ids, size_t count) const;
    std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

    int64_t vocab_size() const { return static_cast<int64_t>(spec_.token_bytes.size()); }
    // The end-of-document token: <|endoftext|> (GPT-2), <|end_of_text|> (Llama 3), else none.
    std::optional<int32_t> end_of_text_id() const;
    // Hash of the canonical tokenizer.json: two tokenizers that encode alike hash alike.
    uint64_t hash() const;
    const TokenizerSpec& spec() const { return spec_; }
    const std::string& source() const { return source_; }

private:
    void index_spec();
    void encode_ordinary(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    std::optional<size_t> added_token_at(std::string_view text, size_t pos) const;

    TokenizerSpec spec_;
    std::string source_;
    std::shared_ptr<Pretokenizer> pretokenizer_;
    std::array<int32_t, 256> byte_id_{};
    std::unordered_map<std::string, int32_t> id_of_bytes_;        // model tokens only
    struct Merge { int32_t rank; int32_t merged; };
    std::unordered_map<uint64_t, Merge> merges_;                   // (left << 32 | right) -> merge
    std::array<std::vector<size_t>, 256> added_by_first_byte_;      // indices into spec_.added, longest first
    std::vector<bool> is_added_;
};

}  // namespace llmtrain

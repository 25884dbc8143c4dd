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
// Open addressing over two arenas (the pieces' bytes, their ids): a lookup hashes the piece
// once and allocates nothing; an insert appends to the arenas. When it holds kMaxEntries
// pieces it starts again empty, which bounds its memory (about 100 MB) on any input.
class EncodeCache {
public:
    static constexpr size_t kMaxPieceBytes = 64;   // longer pieces rarely repeat: not kept
    static constexpr size_t kMaxEntries = size_t{1} << 20;

    EncodeCache();
    // The ids of piece, or nullptr when it has not been inserted; count receives their number.
    const int32_t* find(std::string_view piece, size_t& count) const;
    void insert(std::string_view piece, const int32_t* ids, size_t count);
    size_t size() const { return entries_; }

private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_offset = 0, ids_offset = 0;
        uint16_t key_length = 0, id_count = 0;  // key_length 0: empty slot
    };
    size_t probe(std::string_view piece, uint64_t hash) const;
    void grow();

    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<int32_t> ids_;
    size_t entries_ = 0;
};

// The merges as a flat open-addressing table: (left, right) -> (rank, merged token), probed
// linearly from a multiplicative hash of the pair. BPE asks it about every adjacent pair of a
// piece, so it is the tokenizer's hottest lookup.
class MergeTable {
public:
    struct Merge { int32_t rank, merged; };
    void reserve(size_t merges);
    // A repeated pair takes the later merge, as Hugging Face's map does.
    void insert(int32_t left, int32_t right, Merge merge);
    const Merge* find(int32_t left, int32_t right) const {
        const uint64_t key = pair_key(left, right);
        for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
            if (slots_[i].key == key) return &slots_[i].merge;
            if (slots_[i].key == kEmpty) return nullptr;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t pair_key(int32_t left, int32_t right) { return uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right); }
    size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
    struct Slot { uint64_t key = kEmpty; Merge merge{}; };
    std::vector<Slot> slots_{2};
    size_t mask_ = 1;
    int shift_ = 63;
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

    // BPE of one pre-tokenized piece (no added-token matching, no cache): its ids appended to out.
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    const Pretokenizer& pretokenizer() const { return *pretokenizer_; }
    // Splits with this engine from now on (the ids do not change; `bench tokenizer` compares).
    void use_split_engine(SplitEngine engine) { pretokenizer_ = std::make_shared<Pretokenizer>(spec_.pattern, engine); }

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
    void merge_short_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void merge_long_piece(std::string_view piece, std::vector<int32_t>& out) const;
    std::optional<size_t> added_token_at(std::string_view text, size_t pos) const;

    TokenizerSpec spec_;
    std::string source_;
    std::shared_ptr<Pretokenizer> pretokenizer_;
    std::array<int32_t, 256> byte_id_{};
    struct BytesHash {  // transparent: a lookup by string_view allocates nothing
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>> id_of_bytes_;  // model tokens only
    MergeTable merges_;
    std::array<std::vector<size_t>, 256> added_by_first_byte_;      // indices into spec_.added, longest first
    std::array<bool, 256> starts_added_{};                          // some added token starts with this byte
    std::vector<bool> is_added_;
};

}  // namespace llmtrain

// Token files of other trainers, read and written:
//  - Megatron-LM indexed dataset: PREFIX.bin (the ids, back to back) and PREFIX.idx:
//    "MMIDIDX\0\0", u64 version = 1, u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16),
//    u64 sequence count, u64 document count (= documents + 1), then i32 sequence lengths,
//    i64 sequence byte offsets into .bin, i64 document indices (first sequence of each
//    document, then the sequence count).
//  - llm.c shard: 256 x i32 header (magic 20240520, version 1, token count) + u16 ids, or
//    (magic 20240801, version 7, token count) + u32 ids.
//  - nanoGPT: a headerless array of u16 ids (train.bin, val.bin).
// Every reader checks the header against the file size before trusting it and every id
// against the vocabulary when it is read; errors name the file and the offset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace llmtrain {

// A block of a token shard, for a person: the file and the block's tokens within it.
struct BlockOrigin {
    std::string shard;
    uint32_t block = 0;
    uint64_t first_token = 0, tokens = 0;
};

// A random-access stream of token ids (documents back to back).
class TokenSource {
public:
    virtual ~TokenSource() = default;
    virtual uint64_t token_count() const = 0;
    // Tokens [start, start + count); each id is checked against the vocabulary.
    virtual void read(uint64_t start, uint64_t count, int32_t* out) = 0;
    virtual std::string describe() const = 0;
    // Where tokens [start, start + count) come from, for a person to look at them: the file
    // and, where the format records them, the document ids.
    virtual std::string locate(uint64_t start, uint64_t count) const { return cat(describe(), " tokens [", start, ", ", start + count, ")"); }
    // Block `block` of shard `shard` (CorruptBlockError::shard_index) of a source read from
    // token shards; an error for the formats without blocks.
    virtual BlockOrigin block_origin(size_t shard, uint32_t block) const {
        fail(ErrorKind::runtime, describe(), " has no shard ", shard, " block ", block, ": it is not read from token shards");
    }
};

class TokenStreamWriter {
public:
    virtual ~TokenStreamWriter() = default;
    virtual void add_document(const int32_t* tokens, size_t count) = 0;
    virtual void finish() = 0;  // writes the file(s)
};

std::unique_ptr<TokenStreamWriter> make_megatron_writer(const std::string& prefix, uint64_t vocab_size);
std::unique_ptr<TokenStreamWriter> make_llmc_writer(const std::string& path, uint64_t vocab_size);
std::unique_ptr<TokenStreamWriter> make_nanogpt_writer(const std::string& path, uint64_t vocab_size);

// prefix: the path without .bin/.idx (a path ending in .bin or .idx is taken as its prefix).
std::unique_ptr<TokenSource> open_megatron(const std::string& prefix, uint64_t vocab_size);
std::unique_ptr<TokenSource> open_llmc(const std::string& path, uint64_t vocab_size);
std::unique_ptr<TokenSource> open_nanogpt(const std::string& path, uint64_t vocab_size);
// One split ("train" | "val") of an llmtrain dataset, given its dataset.json.
std::unique_ptr<TokenSource> open_shard_dataset(const std::string& manifest_path, const std::string& split, uint64_t vocab_size);
// The shards an llmtrain dataset's manifest lists, split by split ("train" then "val"), with
// the token count and size it records for each. Error(data) naming the manifest when it is
// not one.
struct ManifestShard {
    std::string split, path;  // path: beside the manifest
    uint64_t tokens = 0, bytes = 0;
};
std::vector<ManifestShard> dataset_shards(const std::string& manifest_path);
// Refuses (ErrorKind::data) a tokenizer other than the one an llmtrain dataset was prepared
// with: dataset.json records the xxh3 of its canonical tokenizer.json (Tokenizer::hash).
void check_dataset_tokenizer(const std::string& manifest_path, uint64_t tokenizer_hash, const std::string& tokenizer_path);

// Document boundaries of a Megatron pair, as token offsets (one per document plus the total).
std::vector<uint64_t> megatron_document_starts(const std::string& prefix, uint64_t vocab_size);

// Megatron .idx parsing from bytes (for fuzzing): throws Error(data) on anything malformed.
void check_megatron_index(const std::string& name, const std::string& idx_bytes, uint64_t bin_bytes);

}  // namespace llmtrain

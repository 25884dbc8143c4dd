// llmtrain's token shard: a file of token ids cut into fixed-size blocks, each block a zstd
// frame, with an index of block offsets and of document starts up front, so any token range
// is read by decompressing only the blocks it touches.
//
// Layout (little-endian):
//   header (64 bytes): magic "LTSHARD\0", u32 version = 1, u32 token_bytes (2 | 4),
//     u64 vocab_size, u64 token_count, u64 document_count, u32 block_tokens, u32 block_count,
//     u64 payload_bytes, u64 metadata_xxh3 (of the header's first 56 bytes, the block
//     offsets and the document starts)
//   block offsets: (block_count + 1) x u64, relative to the payload, the last = payload_bytes
//   document starts: (document_count + 1) x u64 token offsets, the last = token_count
//   payload: the blocks; each zstd frame carries its content checksum.
// A flipped bit anywhere is caught: in the metadata by its hash, in a block by zstd.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace llmtrain {

constexpr uint32_t kShardVersion = 1;
// Training reads random samples of ~1-8k tokens: a block much larger than a sample is
// decompressed for little use (64k-token blocks gave 2.1M tokens/s of random samples, 4k ones
// 17.9M/s on one core), while 4k-token blocks cost only ~2% more bytes than 64k ones.
constexpr uint32_t kDefaultBlockTokens = 4096;

struct ShardContents {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> document_starts{0};  // one per document plus token_count at the end
};

struct ShardWriteOptions {
    uint32_t token_bytes = 2;                  // 2 when every id < 65536, else 4
    uint64_t vocab_size = 0;
    uint32_t block_tokens = kDefaultBlockTokens;
    int zstd_level = 3;
};

// The shard's bytes; checks ids < vocab_size and that they fit token_bytes.
std::string encode_shard(const ShardContents& contents, const ShardWriteOptions& options);

// One block of a shard fails its checks (zstd's content checksum, its frame's sizes, an id at
// or above the vocabulary): the file's bytes are wrong there, the same at every read, unlike
// an I/O error. The loader may train on without it (data.on_corrupt_block); verify_dataset
// lists them.
class CorruptBlockError : public Error {
public:
    CorruptBlockError(std::string shard, uint32_t block, uint64_t byte_offset, uint64_t first_token, uint64_t tokens, std::string reason);
    const std::string& shard() const { return shard_; }
    uint32_t block() const { return block_; }
    uint64_t first_token() const { return first_token_; }  // within the shard
    uint64_t tokens() const { return tokens_; }
    const std::string& reason() const { return reason_; }
    // The position of the shard in its dataset split (set by the dataset's reader).
    size_t shard_index = 0;

private:
    std::string shard_, reason_;
    uint32_t block_;
    uint64_t first_token_, tokens_;
};

class ShardReader {
public:
    // Reads and checks the header and index; errors name the file and what is wrong.
    explicit ShardReader(std::string path);
    // From bytes in memory (fuzzing, tests); name stands for the file in errors.
    ShardReader(std::string name, std::string bytes);
    ~ShardReader();
    ShardReader(const ShardReader&) = delete;
    ShardReader& operator=(const ShardReader&) = delete;

    uint64_t token_count() const { return token_count_; }
    uint64_t document_count() const { return document_starts_.size() - 1; }
    uint64_t vocab_size() const { return vocab_size_; }
    uint32_t token_bytes() const { return token_bytes_; }
    const std::vector<uint64_t>& document_starts() const { return document_starts_; }
    const std::string& path() const { return path_; }
    uint32_t block_count() const { return static_cast<uint32_t>(block_offsets_.size() - 1); }
    uint32_t block_tokens() const { return block_tokens_; }
    uint64_t block_bytes(uint32_t index) const { return block_offsets_[index + 1] - block_offsets_[index]; }
    uint64_t block_first_token(uint32_t index) const { return uint64_t{index} * block_tokens_; }
    uint64_t block_token_count(uint32_t index) const;

    // Decompresses block `index` into out and checks it; throws CorruptBlockError when its
    // bytes are wrong, Error(data) when they cannot be read. Safe from several threads.
    void decode_block(uint32_t index, std::vector<int32_t>& out) const;

    // Tokens [start, start + count) into out; decompresses only the blocks they lie in.
    void read(uint64_t start, uint64_t count, int32_t* out);
    std::vector<int32_t> read_all();

private:
    void parse_metadata(const std::string& head, uint64_t file_size);
    const std::vector<int32_t>& block(uint32_t index);
    std::string read_bytes(uint64_t offset, uint64_t count) const;

    std::string path_;
    std::string memory_;        // the whole shard when built from bytes
    int fd_ = -1;
    uint32_t token_bytes_ = 0, block_tokens_ = 0;
    uint64_t vocab_size_ = 0, token_count_ = 0, payload_offset_ = 0;
    std::vector<uint64_t> block_offsets_;
    std::vector<uint64_t> document_starts_;
    uint32_t cached_block_ = UINT32_MAX;  // the last decompressed block, for sequential reads
    std::vector<int32_t> cached_tokens_;
};

}  // namespace llmtrain

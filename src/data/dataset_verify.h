// `llmtrain data verify` and `doctor --data`: read every block of every shard of an llmtrain
// dataset and check it, before a run meets a flipped bit at the step that reads it. Checked:
// the manifest's shards exist with the size and token count it records; each shard's header
// and index (its XXH3, counts, offsets: ShardReader); each block's zstd frame (its sizes and
// content checksum) and ids (below the vocabulary). Every byte of a shard is under one of
// those checks.
//
// The work is shared by ranks and threads: the dataset's blocks are numbered in manifest
// order (train shards, then val), rank r of R checks the r-th of R contiguous ranges, and the
// threads of a rank take its blocks in turn. Every rank opens every shard's header and index
// (a few KB each) to number the blocks; rank 0 alone reports a shard-level problem. The
// reports of the ranks add up (merge) to the dataset's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmtrain {

struct CorruptPart {
    uint64_t shard_order = 0;  // the shard's position in the manifest (train, then val)
    std::string shard;         // the file
    int64_t block = -1;        // -1: the shard as a whole (missing, size, header or index)
    uint64_t first_token = 0;  // the block's tokens within the shard: [first_token, first_token + tokens)
    uint64_t tokens = 0;
    std::string message;       // one line naming the shard and the block, and what is wrong
};

struct VerifyReport {
    uint64_t shards = 0, blocks = 0, bytes = 0, tokens = 0;  // checked (bytes: the blocks' compressed bytes)
    double seconds = 0;                                     // wall time (merged: the slowest rank's)
    std::vector<CorruptPart> corrupt;                       // in manifest order, then block order
    bool clean() const { return corrupt.empty(); }
    void merge(const VerifyReport& other);
    std::string to_json() const;
    static VerifyReport from_json(const std::string& text);
};

struct VerifyShare {
    int rank = 0, ranks = 1;
    int threads = 1;
};

// DATASET: a dataset.json, or the directory that holds one.
std::string dataset_manifest_path(const std::string& dataset);

// This rank's share of the checks of one dataset. Error(data) when the manifest cannot be read.
VerifyReport verify_dataset(const std::string& dataset, const VerifyShare& share);

// "N shards, M blocks, X MB (T tokens) in S s (R MB/s)".
std::string describe_verified(const VerifyReport& report);

}  // namespace llmtrain

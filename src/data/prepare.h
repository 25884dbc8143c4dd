// `llmtrain prepare`: raw text -> tokenized dataset. The input (files in the given order,
// plain, gzip or zstd text or JSONL, or Parquet, each split into documents) is cut into work units of about
// unit_bytes at document boundaries; the plan depends on the input alone (prepare_plan.h).
// Each unit is tokenized by one rank, by whichever of its threads is free, and written as
// its own shard(s). So the output is byte-identical whatever the number of ranks or threads,
// and whether a file is compressed or not.
//
// Each document gets the end-of-text token appended and goes to the validation split when
// a hash of (seed, unit, document index in the unit) falls below val_fraction.
// Output formats: llmtrain shards + dataset.json (the default), or Megatron's .bin/.idx,
// llm.c shards or a nanoGPT .bin per split, converted from the shards by rank 0 at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/bad_records.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace llmtrain {

enum class InputFormat { text, jsonl, parquet, automatic };  // automatic: per file, by its name
enum class OutputFormat { shards, megatron, llmc, nanogpt };

struct PrepareOptions {
    std::vector<std::string> inputs;        // files, in order
    InputFormat input_format = InputFormat::text;
    std::string separator;                  // text: "" = one document per file, else the split string
    std::string json_key = "text";          // jsonl: the field holding the document
    std::string text_column = "text";       // parquet: the column holding the document
    BadRecordPolicy on_bad_record = BadRecordPolicy::abort;
    std::string output_dir;                 // written in full beside it, then swapped in (StagedDirectory)
    bool replace = false;                   // --force: a non-empty output_dir holding a dataset is replaced
    OutputFormat output_format = OutputFormat::shards;
    double val_fraction = 0;
    uint64_t seed = 1234;
    uint64_t unit_bytes = 16u << 20;        // input bytes per work unit (one shard each)
    int threads = 1;                        // per rank
    uint32_t block_tokens = kDefaultBlockTokens;
    int zstd_level = 3;
    bool progress = false;                  // a progress line on stderr (rank 0)
};

// How the ranks of a run talk: sum_u64 adds a vector elementwise over all ranks (in place);
// every rank makes the same calls in the same order. One process: rank 0 of 1 and an
// identity sum.
struct RankGroup {
    int rank = 0;
    int size = 1;
    std::function<void(std::vector<uint64_t>&)> sum_u64 = [](std::vector<uint64_t>&) {};
};

struct PrepareSummary {
    uint64_t input_bytes = 0;
    uint64_t documents = 0;
    uint64_t train_tokens = 0, val_tokens = 0;
    uint64_t skipped_records = 0;
    size_t units = 0;
    double seconds = 0;
};

// Rank 0 refuses a non-empty output_dir without `replace` (ErrorKind::config), creates the
// staging directory beside it, and swaps it in once every rank has written its shards and
// rank 0 the rest; an error on any rank before the swap removes the staging directory and
// leaves output_dir as it was, and every rank throws.
PrepareSummary prepare_dataset(const Tokenizer& tokenizer, const std::string& tokenizer_json, const PrepareOptions& options, const RankGroup& group);

// The documents of one piece of input (exposed for tests): the whole text, the non-empty
// parts between separators, or the json_key strings of JSONL lines. first_line is the
// 1-based number of the text's first line in `path`, for errors and skipped records; bad
// records throw (abort) or go to `skipped` (skip).
std::vector<std::string> split_documents(const std::string& text, const PrepareOptions& options, const std::string& path, uint64_t first_line,
                                         std::vector<SkippedRecord>* skipped = nullptr);

}  // namespace llmtrain

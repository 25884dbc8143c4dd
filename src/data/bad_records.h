// Bad records of `prepare`'s inputs (a JSONL line that is not an object with a string
// --json-key field; a Parquet row whose text is null or not UTF-8), and what is done with them:
// end the run naming file:line (file, row group and row), or leave them out and list them in
// the dataset's skipped-records.jsonl.
#pragma once

#include <cstdint>
#include <string>

namespace llmtrain {

enum class BadRecordPolicy { abort, skip };

// A record left out under BadRecordPolicy::skip: a JSONL line, or a Parquet row.
struct SkippedRecord {
    std::string file;
    uint64_t line = 0;  // JSONL: 1-based
    std::string reason;
    int64_t row_group = -1;  // Parquet: 0-based row group, and row within it
    uint64_t row = 0;
};

}  // namespace llmtrain

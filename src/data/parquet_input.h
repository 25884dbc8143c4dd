// Parquet files as inputs of `prepare` (parquet_reader.h reads them). A file's pieces are its
// row groups, measured by their text column's uncompressed bytes (a row group larger than a
// unit is cut further at its data pages); the plan packs them into units as it packs the
// pieces of other inputs, so they are read by whichever rank and thread owns their unit,
// each with its own positioned reads (no shared stream). Each row's text is one document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/bad_records.h"

namespace llmtrain {

struct ParquetTextOptions {
    std::string text_column = "text";
    uint64_t unit_bytes = 16u << 20;  // a row group weighing more is cut at its data pages
    BadRecordPolicy on_bad_record = BadRecordPolicy::abort;
};

// A file as the plan sees it: its text offsets run to text_bytes (the row groups' weights
// summed), and its pieces start at 0 and at each cut.
struct ParquetLayout {
    uint64_t text_bytes = 0;
    std::vector<uint64_t> cuts;
};

// Whether a file name says Parquet (.parquet, .pq).
bool is_parquet_name(const std::string& path);

// The file's footer read and checked, the text column found: the cuts are where the pieces
// start (row groups, and the data pages where a row group larger than options.unit_bytes is
// cut). Throws ErrorKind::data naming the file (a missing column lists the file's columns).
ParquetLayout scan_parquet_layout(const std::string& path, const ParquetTextOptions& options);

// The documents of the pieces that start in the text offsets [begin, end), in order; the file
// must still have the planned text_bytes. A null or invalid UTF-8 text is a bad record: the
// run ends naming file, row group and row, or (skip) it is left out and listed in `skipped`.
std::vector<std::string> parquet_documents(const std::string& path, uint64_t text_bytes, uint64_t begin, uint64_t end, const ParquetTextOptions& options,
                                           std::vector<SkippedRecord>* skipped);

// The offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates
// and code points past U+10FFFF are invalid, as JSON parsers hold), or npos.
size_t first_invalid_utf8(std::string_view text);

}  // namespace llmtrain

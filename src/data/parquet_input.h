// Parquet files as inputs of `prepare` (parquet_reader.h reads them). A file's pieces are its
// row groups, measured by their text column's uncompressed bytes (a row group larger than a
// unit is cut further at its data pages); the plan packs them into units as it packs the
// pieces of other inputs, so they are read by whichever rank and thread owns their unit,
// each with its own positioned reads (no shared stream). Each row's text is one document.
#pragma once

#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/prepare_plan.h"

namespace llmtrain {

// Whether a file name says Parquet (.parquet, .pq).
bool is_parquet_name(const std::string& path);

// The file's footer read and checked, the text column found: text_bytes is the sum of the
// row groups' weights, and the cuts are where the pieces start (row groups, and the data
// pages where a row group larger than options.unit_bytes is cut). Throws
// ErrorKind::data naming the file (a missing column lists the file's columns).
InputFile scan_parquet_input(const std::string& path, const PrepareOptions& options);

// The documents of the pieces a segment covers, in order. A null or invalid UTF-8 text
// is a bad record: the run ends naming file, row group and row, or (skip) it is left out and
// listed in `skipped`.
std::vector<std::string> parquet_documents(const InputFile& file, const Segment& segment, const PrepareOptions& options, std::vector<SkippedRecord>* skipped);

// The offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates
// and code points past U+10FFFF are invalid, as JSON parsers hold), or npos.
size_t first_invalid_utf8(std::string_view text);

}  // namespace llmtrain

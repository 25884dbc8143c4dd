// The work plan of `prepare`, the same on every rank and for any number of ranks and threads,
// and the same for a file and its gzip / zstd twin: each input is scanned for its text size
// and its cut points (the end of the first document separator at or after the previous cut
// + unit_bytes, in the file's own text offsets), so a file's pieces depend on that file
// alone; the pieces, in input order, are packed into work units of at least unit_bytes.
//
// A compressed file can only be read from its start, so every unit that holds a piece of one
// belongs to one job with its neighbours that share the file, and a job's units are read in
// order from one stream by the rank that owns the job. Jobs go to ranks by input bytes,
// largest load first-come. The scan of the inputs is spread over the ranks (file f on rank
// f mod ranks) and its results summed over them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/parquet_input.h"
#include "data/prepare.h"
#include "data/text_input.h"

namespace llmtrain {

struct InputFile {
    std::string path;
    InputFormat format = InputFormat::text;  // resolved: text, jsonl or parquet
    Compression compression = Compression::none;
    uint64_t text_bytes = 0;
    std::vector<uint64_t> cuts;  // piece boundaries inside the file, ascending, each in (0, text_bytes)
};

struct Segment {
    size_t file;
    uint64_t begin, end;  // text offsets
};

struct Unit {
    std::vector<Segment> segments;
    uint64_t bytes = 0;
    size_t job = 0;
};

struct PreparePlan {
    std::vector<InputFile> files;
    std::vector<Unit> units;
    std::vector<int> job_rank;  // job -> the rank that runs it
};

// text, jsonl or parquet for a file: the option when it is set, else from the name
// (.parquet, .pq -> parquet; without its compression extension, .jsonl, .json -> jsonl).
InputFormat resolve_input_format(InputFormat option, const std::string& path);

// What the Parquet reader takes of the options.
ParquetTextOptions parquet_text_options(const PrepareOptions& o);

// Text size and cut points of one input (sniffed for text first; decompressed in full when
// compressed). Throws ErrorKind::data naming the file.
InputFile scan_input(const std::string& path, InputFormat format, const PrepareOptions& o);

// Collective over the group: every rank returns the same plan, or every rank throws.
PreparePlan plan_prepare(const PrepareOptions& o, const RankGroup& group);

// Units and jobs from scanned files (exposed for tests).
PreparePlan pack_units(std::vector<InputFile> files, uint64_t unit_bytes, int ranks);

}  // namespace llmtrain

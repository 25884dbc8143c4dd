// Reads the text of `prepare`'s work units (prepare_plan.h): a piece of a plain file with
// one positioned read; a piece of a compressed file from the job's one decompressing stream,
// which the job's units take turns on in unit order (a thread that claims a later unit waits
// for the earlier one to be read, not tokenized). Line numbers, for errors and skipped
// records, are counted on the way for compressed files and on demand for plain ones.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/prepare_plan.h"

namespace llmtrain {

struct SegmentText {
    Segment segment;
    std::string text;
    std::function<uint64_t()> first_line;  // 1-based line number of the text's first byte
    // A Parquet segment comes with no text: its documents are read by row group (parquet_input.h).
};

class UnitReader {
public:
    explicit UnitReader(const PreparePlan& plan);
    ~UnitReader();
    // The texts of unit u's segments, in order. Thread-safe; each unit is read once.
    std::vector<SegmentText> read(size_t unit);

private:
    struct JobStream;
    SegmentText read_plain(const Segment& s);
    SegmentText read_compressed(JobStream& job, const Segment& s);
    uint64_t plain_lines_before(size_t file, uint64_t offset);

    const PreparePlan& plan_;
    std::vector<std::unique_ptr<JobStream>> jobs_;
    std::mutex lines_mutex_;
    std::vector<std::map<uint64_t, uint64_t>> line_anchors_;  // per plain file: offset -> newlines before it
};

}  // namespace llmtrain

// The input of `llmtrain prepare` read as prepare reads it before tokenizing: the file planned
// into work units of unit_bytes (plan_prepare: its size, compression and cut points), each
// unit's text read by a UnitReader (plain: positioned reads; gzip / zstd: one stream), checked
// to be text, and split into documents (process_unit in src/data/prepare.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "data/prepare.h"
#include "data/prepare_plan.h"
#include "data/prepare_reader.h"
#include "data/text_input.h"

namespace llmtrain::fuzz {

inline std::vector<std::string> documents_as_prepare_reads(const std::string& path, BadRecordPolicy policy, uint64_t unit_bytes,
                                                           std::vector<SkippedRecord>* skipped = nullptr) {
    PrepareOptions options;
    options.inputs = {path};
    options.input_format = InputFormat::automatic;
    options.on_bad_record = policy;
    options.unit_bytes = unit_bytes;
    const PreparePlan plan = plan_prepare(options, RankGroup{});
    UnitReader reader(plan);
    std::vector<std::string> documents;
    for (size_t unit = 0; unit < plan.units.size(); ++unit) {
        for (SegmentText& s : reader.read(unit)) {
            const InputFile& file = plan.files[s.segment.file];
            require_text(sniff_text(s.text, false), cat("input '", file.path, "' (text bytes ", s.segment.begin, "-", s.segment.end, ")"));
            PrepareOptions per_file = options;
            per_file.input_format = file.format;
            for (std::string& document : split_documents(s.text, per_file, file.path, s.first_line(), skipped)) documents.push_back(std::move(document));
        }
    }
    return documents;
}

// The checks every prepare input passes, whatever its bytes: read in units of 64 bytes or in
// one, the documents are the same, or both readings refuse the file naming it; a record that
// --on-bad-record skip leaves out is one that abort refuses, and skip reads every document
// abort reads.
inline void check_prepare_reads(const std::string& path) {
    std::vector<std::string> whole, cut;
    std::string whole_error, cut_error;
    try {
        whole = documents_as_prepare_reads(path, BadRecordPolicy::abort, uint64_t{1} << 40);
    } catch (const Error& e) {
        whole_error = e.what();
    }
    try {
        cut = documents_as_prepare_reads(path, BadRecordPolicy::abort, 64);
    } catch (const Error& e) {
        cut_error = e.what();
    }
    if (whole_error.empty() != cut_error.empty() || whole != cut) std::abort();  // the plan changed what was read
    if (!whole_error.empty() && whole_error.find(path) == std::string::npos) std::abort();  // a refusal that does not name the file
    std::vector<SkippedRecord> skipped;
    std::vector<std::string> kept;
    try {
        kept = documents_as_prepare_reads(path, BadRecordPolicy::skip, 64, &skipped);
    } catch (const Error&) {
        if (whole_error.empty()) std::abort();  // skip refused what abort read
        return;
    }
    if (whole_error.empty() && (kept != whole || !skipped.empty())) std::abort();
    for (const SkippedRecord& record : skipped)
        if (record.file != path || record.line == 0) std::abort();
}

}  // namespace llmtrain::fuzz

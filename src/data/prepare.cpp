#include "data/prepare.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/staged_directory.h"
#include "data/external_formats.h"
#include "data/input_files.h"
#include "data/prepare_plan.h"
#include "data/prepare_reader.h"
#include "data/token_shard.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

// Per unit, summed over ranks (each unit is filled in by exactly one rank).
enum Stat { train_tokens, train_docs, train_bytes, train_xxh3, val_tokens, val_docs, val_bytes, val_xxh3, input_bytes, skipped, failed, stat_count };

constexpr const char* kSkippedRecordsFile = "skipped-records.jsonl";
std::unique_ptr<TokenStreamWriter> make_token_stream_writer(OutputFormat format, const std::string& base, uint64_t vocab);

const char* split_name(bool val) { return val ? "val" : "train"; }

std::string shard_name(bool val, size_t unit) {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%05zu.ltshard", split_name(val), unit);
    return name;
}

bool goes_to_validation(const PrepareOptions& o, size_t unit, size_t document) {
    if (o.val_fraction <= 0) return false;
    const uint64_t key[2] = {unit, document};
    const uint64_t h = XXH3_64bits_withSeed(key, sizeof key, o.seed);
    return static_cast<double>(h >> 11) * 0x1.0p-53 < o.val_fraction;
}

struct UnitOutput {
    ShardContents split[2];
};

std::string skipped_part_name(size_t unit) {
    char name[64];
    std::snprintf(name, sizeof name, "skipped-%05zu.part", unit);
    return name;
}

// One JSON line per skipped record: {"file": ..., "line": ..., "reason": ...}, or for a
// Parquet row {"file": ..., "row_group": ..., "row": ..., "reason": ...}.
std::string skipped_records_jsonl(const std::vector<SkippedRecord>& records) {
    using ojson = nlohmann::ordered_json;
    std::string out;
    for (const SkippedRecord& r : records) {
        const ojson record = r.row_group >= 0 ? ojson{{"file", r.file}, {"row_group", r.row_group}, {"row", r.row}, {"reason", r.reason}}
                                              : ojson{{"file", r.file}, {"line", r.line}, {"reason", r.reason}};
        out += record.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";  // a reason may quote invalid bytes: they become U+FFFD
    }
    return out;
}

// The documents of one segment of a unit's input.
std::vector<std::string> segment_documents(const SegmentText& s, const InputFile& file, const PrepareOptions& o, std::vector<SkippedRecord>& skipped) {
    if (file.format == InputFormat::parquet) return parquet_documents(file.path, file.text_bytes, s.segment.begin, s.segment.end, parquet_text_options(o), &skipped);
    require_text(sniff_text(s.text, false), cat("input '", file.path, "' (text bytes ", s.segment.begin, "-", s.segment.end, ")"));
    PrepareOptions per_file = o;
    per_file.input_format = file.format;
    return split_documents(s.text, per_file, file.path, s.first_line(), &skipped);
}

// Tokenizes one unit's text and writes its shard(s) (and its skipped records); returns its
// row of statistics. progress() hears of the input bytes as documents are done.
std::vector<uint64_t> process_unit(size_t index, const PreparePlan& plan, UnitReader& reader, const Tokenizer& tokenizer, int32_t eos, const PrepareOptions& o,
                                   EncodeCache& cache, const std::function<void(uint64_t)>& progress) {
    const Unit& unit = plan.units[index];
    UnitOutput out;
    std::vector<SkippedRecord> skipped_records;
    size_t document = 0;
    uint64_t reported = 0;
    for (SegmentText& s : reader.read(index)) {
        for (const std::string& text : segment_documents(s, plan.files[s.segment.file], o, skipped_records)) {
            ShardContents& c = out.split[goes_to_validation(o, index, document++)];
            tokenizer.encode_append(text, c.tokens, &cache);
            c.tokens.push_back(eos);
            c.document_starts.push_back(c.tokens.size());
            progress(text.size());
            reported += text.size();
        }
    }
    progress(unit.bytes - std::min(reported, unit.bytes));  // separators and JSON syntax
    std::vector<uint64_t> row(stat_count, 0);
    row[input_bytes] = unit.bytes;
    row[skipped] = skipped_records.size();
    if (!skipped_records.empty()) write_file_durably((fs::path(o.output_dir) / skipped_part_name(index)).string(), skipped_records_jsonl(skipped_records));
    const ShardWriteOptions write{tokenizer.vocab_size() <= 65536 ? 2u : 4u, static_cast<uint64_t>(tokenizer.vocab_size()), o.block_tokens, o.zstd_level};
    for (int val = 0; val < 2; ++val) {
        const ShardContents& c = out.split[val];
        if (c.document_starts.size() == 1) continue;
        const std::string bytes = encode_shard(c, write);
        write_file_durably((fs::path(o.output_dir) / shard_name(val, index)).string(), bytes);
        const size_t base = val ? val_tokens : train_tokens;
        row[base] = c.tokens.size();
        row[base + 1] = c.document_starts.size() - 1;
        row[base + 2] = bytes.size();
        row[base + 3] = XXH3_64bits(bytes.data(), bytes.size());
    }
    return row;
}

// A line on stderr twice a second while units are processed: this rank's share done, MB/s, ETA.
class ProgressLine {
public:
    ProgressLine(bool enabled, uint64_t total_bytes) : enabled_(enabled), total_(total_bytes) {
        if (enabled_) thread_ = std::thread([this] { loop(); });
    }
    ~ProgressLine() {
        if (!enabled_) return;
        { std::lock_guard<std::mutex> lock(mutex_); done_flag_ = true; }
        wake_.notify_all();
        thread_.join();
        std::fprintf(stderr, "\n");
    }
    void add(uint64_t bytes) { done_ += bytes; }

private:
    void loop() {
        const auto start = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return done_flag_; })) {
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const double mb = static_cast<double>(done_) / 1e6, rate = mb / seconds;
            const double eta = rate > 0 ? (static_cast<double>(total_) / 1e6 - mb) / rate : 0;
            std::fprintf(stderr, "\rprepare: %.1f / %.1f MB | %.1f MB/s | ETA %.0f s   ", mb, static_cast<double>(total_) / 1e6, rate, eta);
        }
    }
    bool enabled_;
    uint64_t total_;
    std::atomic<uint64_t> done_{0};
    bool done_flag_ = false;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::thread thread_;
};

// Runs this rank's units (those of the jobs the plan gives it) on its threads, in unit
// order; the first error is kept, the unit is marked failed and no further unit is started,
// and every rank still reaches the collective sum.
std::vector<uint64_t> run_rank_units(const PreparePlan& plan, const Tokenizer& tokenizer, int32_t eos, const PrepareOptions& o, const RankGroup& g,
                                     std::exception_ptr& error) {
    std::vector<uint64_t> stats(plan.units.size() * stat_count, 0);
    std::vector<size_t> mine;
    uint64_t my_bytes = 0;
    for (size_t u = 0; u < plan.units.size(); ++u) {
        if (plan.job_rank[plan.units[u].job] != g.rank) continue;
        mine.push_back(u);
        my_bytes += plan.units[u].bytes;
    }
    UnitReader reader(plan);
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex error_mutex;
    ProgressLine progress(o.progress && g.rank == 0, my_bytes);
    const auto worker = [&] {
        EncodeCache cache;
        for (size_t i; !stop && (i = next++) < mine.size();) {
            const size_t u = mine[i];
            try {
                const std::vector<uint64_t> row = process_unit(u, plan, reader, tokenizer, eos, o, cache, [&](uint64_t bytes) { progress.add(bytes); });
                std::copy(row.begin(), row.end(), stats.begin() + static_cast<std::ptrdiff_t>(u * stat_count));
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!error) error = std::current_exception();
                stats[u * stat_count + failed] = 1;
                stop = true;
            }
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < std::max(1, o.threads); ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    return stats;
}

std::string hex64(uint64_t v) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
    return text;
}

// tokenizer_hash: Tokenizer::hash(), taken from the JSON already in hand.
void write_manifest(const std::vector<uint64_t>& stats, size_t units, const Tokenizer& tokenizer, uint64_t tokenizer_hash, int32_t eos, const PrepareOptions& o) {
    using ojson = nlohmann::ordered_json;
    ojson splits = ojson::object();
    for (int val = 0; val < 2; ++val) {
        const size_t base = val ? val_tokens : train_tokens;
        ojson shards = ojson::array();
        uint64_t tokens = 0, docs = 0;
        for (size_t u = 0; u < units; ++u) {
            const uint64_t* row = &stats[u * stat_count];
            if (row[base + 1] == 0) continue;
            shards.push_back({{"file", shard_name(val, u)}, {"tokens", row[base]}, {"documents", row[base + 1]}, {"bytes", row[base + 2]}, {"xxh3", hex64(row[base + 3])}});
            tokens += row[base];
            docs += row[base + 1];
        }
        splits[split_name(val)] = {{"tokens", tokens}, {"documents", docs}, {"shards", shards}};
    }
    uint64_t skipped_records = 0;
    for (size_t u = 0; u < units; ++u) skipped_records += stats[u * stat_count + skipped];
    ojson manifest = {{"format", "llmtrain-token-shards"}, {"version", 1},
                            {"tokenizer", {{"file", "tokenizer.json"}, {"xxh3", hex64(tokenizer_hash)}, {"vocab_size", tokenizer.vocab_size()}, {"eos_id", eos}}},
                            {"dtype", tokenizer.vocab_size() <= 65536 ? "u16" : "u32"},
                            {"split", {{"val_fraction", o.val_fraction}, {"seed", o.seed}}},
                            {"train", splits["train"]}, {"val", splits["val"]},
                            {"skipped_records", skipped_records}};
    if (skipped_records > 0) manifest["skipped_records_file"] = kSkippedRecordsFile;
    write_file_durably((fs::path(o.output_dir) / "dataset.json").string(), manifest.dump(1) + "\n");
}

// Rank 0, after every rank has finished: the shards of each split, in unit order, become one
// file (pair) of the external format; the shards are removed.
void convert_shards(size_t units, const std::vector<uint64_t>& stats, const Tokenizer& tokenizer, const PrepareOptions& o) {
    for (int val = 0; val < 2; ++val) {
        const std::string base = (fs::path(o.output_dir) / split_name(val)).string();
        const uint64_t vocab = static_cast<uint64_t>(tokenizer.vocab_size());
        std::unique_ptr<TokenStreamWriter> writer = make_token_stream_writer(o.output_format, base, vocab);
        bool any = false;
        for (size_t u = 0; u < units; ++u) {
            if (stats[u * stat_count + (val ? val_docs : train_docs)] == 0) continue;
            const std::string path = (fs::path(o.output_dir) / shard_name(val, u)).string();
            {
                ShardReader shard(path);
                const std::vector<int32_t> tokens = shard.read_all();
                const auto& starts = shard.document_starts();
                for (size_t d = 0; d + 1 < starts.size(); ++d) writer->add_document(tokens.data() + starts[d], starts[d + 1] - starts[d]);
            }
            std::error_code ec;
            if (!fs::remove(path, ec) || ec) fail(ErrorKind::io, "cannot remove '", path, "': ", ec ? ec.message() : "it is gone");
            any = true;
        }
        if (any) writer->finish();
    }
}

// The document of a JSONL line, or the reason the record is bad.
bool jsonl_document(std::string_view line, const std::string& key, std::string& document, std::string& reason) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        reason = cat("line is not JSON: ", e.what());
        return false;
    }
    if (!j.is_object()) {
        reason = cat("line is JSON but not an object (", j.type_name(), ")");
        return false;
    }
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
        reason = cat("record has no string field \"", key, "\" (--json-key)", it == j.end() ? "" : cat("; it is ", it->type_name()));
        return false;
    }
    document = it->get<std::string>();
    return true;
}

std::unique_ptr<TokenStreamWriter> make_token_stream_writer(OutputFormat format, const std::string& base, uint64_t vocab) {
    switch (format) {
        case OutputFormat::megatron: return make_megatron_writer(base, vocab);
        case OutputFormat::llmc: return make_llmc_writer(base + ".bin", vocab);
        case OutputFormat::nanogpt: return make_nanogpt_writer(base + ".bin", vocab);
        case OutputFormat::shards: break;
    }
    fail(ErrorKind::runtime, "no stream writer for the shard format");
}

std::exception_ptr capture(const std::function<void()>& work) {
    try {
        work();
    } catch (...) {
        return std::current_exception();
    }
    return nullptr;
}

// True on every rank when `failed` is true on any.
bool any_rank(const RankGroup& g, bool failed) {
    std::vector<uint64_t> count{failed ? 1u : 0u};
    g.sum_u64(count);
    return count[0] > 0;
}

// --force replaces a directory that prepare wrote (it holds tokenizer.json), never a
// mistyped path such as a home directory.
void begin_output(StagedDirectory& output, bool replace) {
    std::error_code ec;
    const fs::path dir(output.path());
    if (replace && fs::is_directory(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(dir / "tokenizer.json", ec))
        fail(ErrorKind::config, "output directory '", output.path(), "' holds no tokenizer.json: it is not a dataset that --force may replace; empty or remove it yourself");
    output.begin(replace);
}

// --force would delete an input that lies in the output directory along with the old dataset.
void refuse_inputs_inside_output(const PrepareOptions& o) {
    if (!o.replace) return;
    std::error_code ec;
    fs::path out = fs::weakly_canonical(o.output_dir, ec);
    if (ec) return;
    if (out.filename().empty()) out = out.parent_path();  // "DIR/"
    for (const std::string& input : o.inputs) {
        const fs::path in = fs::weakly_canonical(input, ec);
        if (ec) continue;
        if (std::mismatch(out.begin(), out.end(), in.begin(), in.end()).first == out.end())
            fail(ErrorKind::config, "input '", input, "' lies inside the output directory '", o.output_dir, "', which --force replaces; write the dataset elsewhere");
    }
}

// The same on every rank: the statistics are summed over all of them.
PrepareSummary summarize(const std::vector<uint64_t>& stats, size_t units, const PrepareOptions& o, const RankGroup& g) {
    PrepareSummary summary;
    summary.units = units;
    for (size_t u = 0; u < units; ++u) {
        const uint64_t* row = &stats[u * stat_count];
        if (row[failed]) fail(ErrorKind::data, "prepare: unit ", u, " failed on rank ", u % static_cast<size_t>(g.size), " (its error is in that rank's output)");
        summary.input_bytes += row[input_bytes];
        summary.documents += row[train_docs] + row[val_docs];
        summary.train_tokens += row[train_tokens];
        summary.val_tokens += row[val_tokens];
        summary.skipped_records += row[skipped];
    }
    if (summary.documents == 0) fail(ErrorKind::data, "prepare: the input (", o.inputs.size(), " file(s), first '", o.inputs.front(), "') holds no document");
    return summary;
}

// Rank 0: the units' lists of skipped records, in unit order, become skipped-records.jsonl.
void gather_skipped_records(const std::vector<uint64_t>& stats, size_t units, const std::string& dir) {
    std::string all;
    for (size_t u = 0; u < units; ++u) {
        if (stats[u * stat_count + skipped] == 0) continue;
        const std::string part = (fs::path(dir) / skipped_part_name(u)).string();
        all += read_whole_file(part);
        std::error_code ec;
        if (!fs::remove(part, ec) || ec) fail(ErrorKind::io, "cannot remove '", part, "': ", ec ? ec.message() : "it is gone");
    }
    if (!all.empty()) write_file_durably((fs::path(dir) / kSkippedRecordsFile).string(), all);
}

// Rank 0, once every rank's shards are written: the tokenizer, the manifest (or the
// conversion to another format), then the swap.
void finish_dataset(const std::vector<uint64_t>& stats, size_t units, const Tokenizer& tokenizer, const std::string& tokenizer_json, int32_t eos,
                    const PrepareOptions& staged, StagedDirectory& output) {
    write_file_durably((fs::path(staged.output_dir) / "tokenizer.json").string(), tokenizer_json);
    gather_skipped_records(stats, units, staged.output_dir);
    if (staged.output_format == OutputFormat::shards) write_manifest(stats, units, tokenizer, XXH3_64bits(tokenizer_json.data(), tokenizer_json.size()), eos, staged);
    else convert_shards(units, stats, tokenizer, staged);
    output.commit();
}

}  // namespace

std::vector<std::string> split_documents(const std::string& text, const PrepareOptions& o, const std::string& path, uint64_t first_line,
                                         std::vector<SkippedRecord>* skipped_records) {
    std::vector<std::string> docs;
    if (o.input_format != InputFormat::jsonl && o.separator.empty()) {
        if (!text.empty()) docs.push_back(text);
        return docs;
    }
    const std::string separator = o.input_format == InputFormat::jsonl ? "\n" : o.separator;
    uint64_t line = first_line;
    std::string document, reason;
    for (size_t pos = 0; pos <= text.size();) {
        size_t end = text.find(separator, pos);
        if (end == std::string::npos) end = text.size();
        const std::string_view part(text.data() + pos, end - pos);
        if (o.input_format != InputFormat::jsonl) {
            if (!part.empty()) docs.emplace_back(part);
        } else if (part.find_first_not_of(" \t\r") != std::string_view::npos) {  // blank lines hold no record
            if (jsonl_document(part, o.json_key, document, reason)) {
                docs.push_back(std::move(document));
            } else if (o.on_bad_record == BadRecordPolicy::skip && skipped_records) {
                skipped_records->push_back({path, line, reason});
            } else {
                fail(ErrorKind::data, path, ":", line, ": ", reason, " (--on-bad-record skip leaves such records out)");
            }
        }
        line += o.input_format == InputFormat::jsonl ? 1 : static_cast<uint64_t>(std::count(part.begin(), part.end(), '\n') + std::count(separator.begin(), separator.end(), '\n'));
        pos = end + separator.size();
    }
    return docs;
}

PrepareSummary prepare_dataset(const Tokenizer& tokenizer, const std::string& tokenizer_json, const PrepareOptions& o, const RankGroup& g) {
    const auto start = std::chrono::steady_clock::now();
    const auto eos = tokenizer.end_of_text_id();
    if (!eos) fail(ErrorKind::data, "tokenizer '", tokenizer.source(), "' has no end-of-text token (<|endoftext|> or <|end_of_text|>) to join documents with");
    if (o.inputs.empty()) fail(ErrorKind::data, "prepare: no input files");
    refuse_inputs_inside_output(o);
    StagedDirectory output(o.output_dir);
    PrepareOptions staged = o;
    staged.output_dir = output.staging_path();
    // Rank 0 decides and makes the staging directory before any input is read (a bad output
    // path fails in a second, not after a scan of the input); no rank writes before it exists.
    std::exception_ptr error = g.rank == 0 ? capture([&] { begin_output(output, o.replace); }) : nullptr;
    if (any_rank(g, error != nullptr)) {
        if (error) std::rethrow_exception(error);
        fail(ErrorKind::data, "prepare: rank 0 could not set up the output directory '", o.output_dir, "' (its error is in that rank's output)");
    }
    PreparePlan plan;
    error = capture([&] { plan = plan_prepare(o, g); });  // collective: every rank fails alike
    if (any_rank(g, error != nullptr)) {
        if (g.rank == 0) output.abandon();
        any_rank(g, false);  // no rank ends the job before rank 0 has cleaned up
        if (error) std::rethrow_exception(error);
        fail(ErrorKind::data, "prepare: planning failed on another rank (its error is in that rank's output)");
    }
    std::vector<uint64_t> stats = run_rank_units(plan, tokenizer, *eos, staged, g, error);
    g.sum_u64(stats);
    PrepareSummary summary;
    if (!error) error = capture([&] { summary = summarize(stats, plan.units.size(), o, g); });
    if (g.rank == 0) {
        if (!error) error = capture([&] { finish_dataset(stats, plan.units.size(), tokenizer, tokenizer_json, *eos, staged, output); });
        if (error) output.abandon();
    }
    // Every rank waits for rank 0's swap or clean-up: a rank that ended the job first (under
    // mpirun an error on any rank ends them all) could cut it short and leave the staging
    // directory behind.
    const bool rank0_failed = any_rank(g, g.rank == 0 && error);
    if (error) std::rethrow_exception(error);
    if (rank0_failed) fail(ErrorKind::io, "prepare: rank 0 could not finish the dataset '", o.output_dir, "' (its error is in that rank's output)");
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
}

}  // namespace llmtrain

#include "data/prepare_plan.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <atomic>

#include "core/error.h"

namespace llmtrain {

namespace {

namespace fs = std::filesystem;

constexpr size_t kScanChunk = 1 << 20;
constexpr uint64_t kNoCut = UINT64_MAX;

std::string read_plain_range(const std::string& path, uint64_t begin, uint64_t end) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::data, "cannot open input '", path, "'");
    std::string bytes(static_cast<size_t>(end - begin), '\0');
    in.seekg(static_cast<std::streamoff>(begin));
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (static_cast<uint64_t>(in.gcount()) != end - begin) fail(ErrorKind::io, "input '", path, "' changed while being read (short read at byte ", begin, ")");
    return bytes;
}

// The end of the first separator that starts at or after `from` in a plain file, or kNoCut;
// read in chunks that overlap by the separator's length.
uint64_t plain_boundary_after(const std::string& path, uint64_t from, uint64_t size, const std::string& separator) {
    for (uint64_t pos = from; pos < size; pos += kScanChunk) {
        const std::string bytes = read_plain_range(path, pos, std::min(size, pos + kScanChunk + separator.size() - 1));
        const size_t hit = bytes.find(separator);
        if (hit != std::string::npos) return pos + hit + separator.size();
    }
    return kNoCut;
}

// Cuts of a compressed file's text, found while decompressing it once from the start.
void scan_compressed(TextReader& reader, std::string window, const std::string& separator, uint64_t unit_bytes, InputFile& file) {
    uint64_t base = 0, next_target = separator.empty() ? kNoCut : unit_bytes;
    const size_t keep = separator.empty() ? 0 : separator.size() - 1;
    for (;;) {
        while (next_target != kNoCut && next_target < base + window.size()) {
            const size_t from = static_cast<size_t>(std::max(next_target, base) - base);
            const size_t hit = window.find(separator, from);
            if (hit == std::string::npos) break;
            const uint64_t cut = base + hit + separator.size();
            file.cuts.push_back(cut);
            next_target = cut + unit_bytes;
        }
        const size_t drop = window.size() > keep ? window.size() - keep : 0;
        base += drop;
        window.erase(0, drop);
        const size_t before = window.size();
        reader.read_into(window, kScanChunk);
        if (window.size() == before) break;
    }
    file.text_bytes = base + window.size();
}

void scan_plain(const std::string& separator, uint64_t unit_bytes, InputFile& file) {
    std::error_code ec;
    file.text_bytes = fs::file_size(file.path, ec);
    if (ec) fail(ErrorKind::data, "cannot read input '", file.path, "': ", ec.message());
    if (separator.empty()) return;
    for (uint64_t target = unit_bytes; target < file.text_bytes;) {
        const uint64_t cut = plain_boundary_after(file.path, target, file.text_bytes, separator);
        if (cut == kNoCut) break;
        file.cuts.push_back(cut);
        target = cut + unit_bytes;
    }
}

std::string separator_of(InputFormat format, const PrepareOptions& o) { return format == InputFormat::jsonl ? "\n" : o.separator; }

// Each rank scans files f with f % size == rank on its threads; the first error is kept.
std::vector<InputFile> scan_my_files(const PrepareOptions& o, const RankGroup& g, std::exception_ptr& error) {
    std::vector<InputFile> files(o.inputs.size());
    std::atomic<size_t> next{static_cast<size_t>(g.rank)};
    std::mutex error_mutex;
    const auto worker = [&] {
        for (size_t f; (f = next.fetch_add(static_cast<size_t>(g.size))) < files.size();) {
            try {
                files[f] = scan_input(o.inputs[f], resolve_input_format(o.input_format, o.inputs[f]), o);
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!error) error = std::current_exception();
            }
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < std::max(1, o.threads); ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    return files;
}

// Every rank's scans to every rank: sizes, cut counts and a failure flag, then the cuts.
void share_scans(std::vector<InputFile>& files, const RankGroup& g, bool failed) {
    const size_t n = files.size();
    constexpr size_t kFields = 3;  // text bytes, cut count, compression
    std::vector<uint64_t> head(kFields * n + 1, 0);
    for (size_t f = static_cast<size_t>(g.rank); f < n; f += static_cast<size_t>(g.size)) {
        head[kFields * f] = files[f].text_bytes;
        head[kFields * f + 1] = files[f].cuts.size();
        head[kFields * f + 2] = static_cast<uint64_t>(files[f].compression);
    }
    head[kFields * n] = failed ? 1 : 0;
    g.sum_u64(head);
    if (head[kFields * n] > 0) {
        if (failed) return;  // the caller rethrows this rank's own error
        fail(ErrorKind::data, "prepare: scanning the input failed on another rank (its error is in that rank's output)");
    }
    std::vector<uint64_t> offsets(n + 1, 0);
    for (size_t f = 0; f < n; ++f) offsets[f + 1] = offsets[f] + head[kFields * f + 1];
    std::vector<uint64_t> cuts(offsets[n], 0);
    for (size_t f = static_cast<size_t>(g.rank); f < n; f += static_cast<size_t>(g.size))
        std::copy(files[f].cuts.begin(), files[f].cuts.end(), cuts.begin() + static_cast<std::ptrdiff_t>(offsets[f]));
    g.sum_u64(cuts);
    for (size_t f = 0; f < n; ++f) {
        files[f].text_bytes = head[kFields * f];
        files[f].compression = static_cast<Compression>(head[kFields * f + 2]);
        files[f].cuts.assign(cuts.begin() + static_cast<std::ptrdiff_t>(offsets[f]), cuts.begin() + static_cast<std::ptrdiff_t>(offsets[f + 1]));
    }
}

}  // namespace

InputFormat resolve_input_format(InputFormat option, const std::string& path) {
    if (option != InputFormat::automatic) return option;
    if (is_parquet_name(path)) return InputFormat::parquet;
    const std::string_view name = without_compression_extension(path);
    return name.ends_with(".jsonl") || name.ends_with(".json") ? InputFormat::jsonl : InputFormat::text;
}

ParquetTextOptions parquet_text_options(const PrepareOptions& o) { return {o.text_column, o.unit_bytes, o.on_bad_record}; }

InputFile scan_input(const std::string& path, InputFormat format, const PrepareOptions& o) {
    InputFile file;
    file.path = path;
    file.format = format;
    if (format == InputFormat::parquet) {  // read by positioned reads: no compression of the file as a whole
        ParquetLayout layout = scan_parquet_layout(path, parquet_text_options(o));
        file.text_bytes = layout.text_bytes;
        file.cuts = std::move(layout.cuts);
        return file;
    }
    TextReader reader(path);
    file.compression = reader.compression();
    std::string start;
    reader.read_into(start, kSniffBytes);
    require_text(sniff_text(start, start.size() == kSniffBytes), cat("input '", path, "'", file.compression == Compression::none ? "" : cat(" (", compression_name(file.compression), ")")));
    const std::string separator = separator_of(format, o);
    if (file.compression == Compression::none) scan_plain(separator, o.unit_bytes, file);
    else scan_compressed(reader, std::move(start), separator, o.unit_bytes, file);
    while (!file.cuts.empty() && file.cuts.back() >= file.text_bytes) file.cuts.pop_back();
    return file;
}

PreparePlan pack_units(std::vector<InputFile> files, uint64_t unit_bytes, int ranks) {
    PreparePlan plan;
    plan.files = std::move(files);
    plan.units.emplace_back();
    for (size_t f = 0; f < plan.files.size(); ++f) {
        const InputFile& file = plan.files[f];
        uint64_t begin = 0;
        for (size_t c = 0; c <= file.cuts.size() && begin < file.text_bytes; ++c) {
            const uint64_t end = c < file.cuts.size() ? file.cuts[c] : file.text_bytes;
            Unit& unit = plan.units.back();
            unit.segments.push_back({f, begin, end});
            unit.bytes += end - begin;
            if (unit.bytes >= unit_bytes) plan.units.emplace_back();
            begin = end;
        }
    }
    if (plan.units.back().segments.empty()) plan.units.pop_back();
    // Jobs: a unit joins the one before when both hold a piece of the same compressed file.
    std::vector<uint64_t> job_bytes;
    for (size_t u = 0; u < plan.units.size(); ++u) {
        Unit& unit = plan.units[u];
        const bool shares_stream = u > 0 && plan.units[u - 1].segments.back().file == unit.segments.front().file &&
                                   plan.files[unit.segments.front().file].compression != Compression::none;
        if (!shares_stream) job_bytes.push_back(0);
        unit.job = job_bytes.size() - 1;
        job_bytes.back() += unit.bytes;
    }
    std::vector<uint64_t> load(static_cast<size_t>(std::max(1, ranks)), 0);
    for (uint64_t bytes : job_bytes) {
        const auto lightest = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        plan.job_rank.push_back(static_cast<int>(lightest));
        load[lightest] += bytes;
    }
    return plan;
}

PreparePlan plan_prepare(const PrepareOptions& o, const RankGroup& g) {
    std::exception_ptr error;
    std::vector<InputFile> files = scan_my_files(o, g, error);
    share_scans(files, g, error != nullptr);
    if (error) std::rethrow_exception(error);
    for (size_t f = 0; f < files.size(); ++f) {  // what the scan on another rank knew; path and format are the same everywhere
        files[f].path = o.inputs[f];
        files[f].format = resolve_input_format(o.input_format, o.inputs[f]);
    }
    return pack_units(std::move(files), o.unit_bytes, g.size);
}

}  // namespace llmtrain

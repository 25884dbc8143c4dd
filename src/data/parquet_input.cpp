#include "data/parquet_input.h"

#include "core/error.h"
#include "data/parquet_reader.h"

namespace llmtrain {

namespace {

using parquet::TextColumnReader;

TextColumnReader open_text_column(const std::string& path, const ParquetTextOptions& o) { return TextColumnReader(parquet::open_file_source(path), path, o.text_column); }

// Row group g starts at the sum of the weights before it.
std::vector<uint64_t> row_group_starts(const TextColumnReader& reader) {
    std::vector<uint64_t> starts{0};
    for (size_t g = 0; g < reader.row_groups(); ++g) starts.push_back(starts.back() + reader.weight(g));
    return starts;
}

// A piece of the plan: the pages of a row group from `from` up to the page at `to`, whose
// text offset is `start`.
struct Piece {
    size_t row_group = 0;
    TextColumnReader::PageStart from;
    uint64_t to = UINT64_MAX;  // past the chunk: every page to the last
    uint64_t start = 0;
};

// The pieces of row group g, which starts at text offset `start`: the whole row group, or, when
// it weighs more than unit_bytes, cut at each data page where another unit_bytes of its pages
// begin (read from the pages' headers), so that no piece is much larger than a unit.
std::vector<Piece> row_group_pieces(const TextColumnReader& reader, size_t g, uint64_t start, uint64_t unit_bytes) {
    std::vector<Piece> pieces{{g, reader.chunk_start(g), UINT64_MAX, start}};
    const uint64_t weight = reader.weight(g);
    if (weight <= unit_bytes) return pieces;
    uint64_t last_cut = 0;
    for (const TextColumnReader::PageStart& page : reader.data_pages(g)) {
        if (page.bytes_before - last_cut < unit_bytes || page.bytes_before >= weight) continue;
        pieces.back().to = page.offset;
        pieces.push_back({g, page, UINT64_MAX, start + page.bytes_before});
        last_cut = page.bytes_before;
    }
    return pieces;
}

}  // namespace

bool is_parquet_name(const std::string& path) { return path.ends_with(".parquet") || path.ends_with(".pq"); }

ParquetLayout scan_parquet_layout(const std::string& path, const ParquetTextOptions& o) {
    const TextColumnReader reader = open_text_column(path, o);
    const std::vector<uint64_t> starts = row_group_starts(reader);
    ParquetLayout layout;
    for (size_t g = 0; g < reader.row_groups(); ++g)
        for (const Piece& piece : row_group_pieces(reader, g, starts[g], o.unit_bytes))
            if (piece.start > 0) layout.cuts.push_back(piece.start);
    layout.text_bytes = starts.back();
    return layout;
}

std::vector<std::string> parquet_documents(const std::string& path, uint64_t text_bytes, uint64_t begin, uint64_t end, const ParquetTextOptions& o,
                                           std::vector<SkippedRecord>* skipped) {
    const TextColumnReader reader = open_text_column(path, o);
    const std::vector<uint64_t> starts = row_group_starts(reader);
    if (starts.back() != text_bytes) fail(ErrorKind::io, "input '", path, "' changed while being read: its row groups are not the ones planned");
    std::vector<std::string> documents;
    for (size_t g = 0; g < reader.row_groups(); ++g) {
        if (starts[g + 1] <= begin || starts[g] >= end) continue;  // no piece of it in [begin, end)
        for (const Piece& piece : row_group_pieces(reader, g, starts[g], o.unit_bytes)) {
            if (piece.start < begin || piece.start >= end) continue;
            reader.read_pages(g, piece.from, piece.to, [&](uint64_t row, const std::string_view* text) {
                std::string reason;
                if (!text) {
                    reason = cat(o.text_column, " is null");
                } else if (const size_t bad = first_invalid_utf8(*text); bad != std::string_view::npos) {
                    reason = cat(o.text_column, " is not valid UTF-8 (byte ", bad, " of ", text->size(), ")");
                } else {
                    documents.emplace_back(*text);
                    return;
                }
                if (o.on_bad_record != BadRecordPolicy::skip || !skipped)
                    fail(ErrorKind::data, path, ": row group ", g, ", row ", row, ": ", reason, " (--on-bad-record skip leaves such records out)");
                skipped->push_back({path, 0, reason, static_cast<int64_t>(g), row});
            });
        }
    }
    return documents;
}

size_t first_invalid_utf8(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        const unsigned char c = s[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        // Lead byte: the length, and the range the first continuation byte must fall in
        // (which excludes overlong forms, surrogates and code points past U+10FFFF).
        size_t length = 0;
        unsigned char low = 0x80, high = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) length = 2;
        else if (c == 0xe0) length = 3, low = 0xa0;
        else if (c == 0xed) length = 3, high = 0x9f;
        else if (c >= 0xe1 && c <= 0xef) length = 3;
        else if (c == 0xf0) length = 4, low = 0x90;
        else if (c >= 0xf1 && c <= 0xf3) length = 4;
        else if (c == 0xf4) length = 4, high = 0x8f;
        else return i;
        if (n - i < length || s[i + 1] < low || s[i + 1] > high) return i;
        for (size_t k = 2; k < length; ++k)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
        i += length;
    }
    return std::string_view::npos;
}

}  // namespace llmtrain

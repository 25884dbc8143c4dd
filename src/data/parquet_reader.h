// Reads one text column of a Parquet file, row group by row group, page by page: what a
// pre-training corpus (FineWeb, DCLM, nanochat's shards) needs and no more. The footer's
// metadata and the page headers are Thrift compact protocol, read by Apache Thrift's C++
// library from our own IDL of the structures used (parquet_format.thrift); the pages by
// parquet_encodings.h.
//
// Supported: a flat BYTE_ARRAY column, required or optional; data pages v1 and v2; PLAIN,
// PLAIN_DICTIONARY / RLE_DICTIONARY, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY; the codecs
// UNCOMPRESSED, SNAPPY, GZIP and ZSTD. Refused by name: nested or repeated columns, other
// physical types, encryption, external column chunks, LZO, BROTLI, LZ4 and LZ4_RAW, and the
// deprecated BIT_PACKED levels.
//
// Memory: the footer, then one page at a time (and a column chunk's dictionary); a file of
// any size streams. Every error is ErrorKind::data and names the file and the part: the
// magic, the footer, or the row group, column and byte offset of the page.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::parquet_format {
class FileMetaData;  // parquet_format.thrift
class PageHeader;
}

namespace llmtrain::parquet {

// Random access to the file's bytes: a file on disk, or bytes in memory (the fuzz target).
class ByteSource {
public:
    virtual ~ByteSource() = default;
    virtual uint64_t size() const = 0;
    // Exactly `length` bytes from `offset`; throws when they are not there.
    virtual std::string read(uint64_t offset, size_t length) const = 0;
};

std::unique_ptr<ByteSource> open_file_source(const std::string& path);
std::unique_ptr<ByteSource> memory_source(std::string_view bytes);  // the bytes outlive it

// What the reader accepts before it allocates: the fuzz target lowers them.
struct ReaderLimits {
    uint64_t max_footer_bytes = uint64_t{256} << 20;
    uint64_t max_page_bytes = uint64_t{1} << 30;   // one page, uncompressed
    uint64_t max_page_values = uint64_t{1} << 24;  // rows of one page
};

// A row's text, a view valid during the call, or nullptr for a null.
using RowVisitor = std::function<void(uint64_t row, const std::string_view* text)>;

class TextColumnReader {
public:
    // Reads and checks the footer and finds `column` among the top-level fields; `name` stands
    // for the file in errors. A missing column is an error listing the file's columns.
    TextColumnReader(std::unique_ptr<ByteSource> source, std::string name, std::string column, ReaderLimits limits = {});
    ~TextColumnReader();
    TextColumnReader(const TextColumnReader&) = delete;
    TextColumnReader& operator=(const TextColumnReader&) = delete;

    size_t row_groups() const;
    uint64_t rows(size_t row_group) const;
    // The column chunk's uncompressed bytes (at least 1): how much work a row group is.
    uint64_t weight(size_t row_group) const;
    // Calls visit for every row of the row group, in order; row is 0-based within it.
    void read_row_group(size_t row_group, const RowVisitor& visit) const;

    // Where a row group's rows can be read from: the chunk's start, or a data page. A large row
    // group is split at its data pages, so that a piece of work need not be a whole row group.
    struct PageStart {
        uint64_t offset = 0;        // in the file
        uint64_t rows_before = 0;   // rows of the row group before it
        uint64_t bytes_before = 0;  // the pages before it, headers and uncompressed bodies
    };
    PageStart chunk_start(size_t row_group) const;
    // The row group's data pages, read by their headers alone.
    std::vector<PageStart> data_pages(size_t row_group) const;
    // Visits the rows of the pages from `from` up to the page at file offset `to` (the chunk's
    // end or beyond: every page to the last), reading the chunk's dictionary page first.
    void read_pages(size_t row_group, const PageStart& from, uint64_t to, const RowVisitor& visit) const;

private:
    struct Chunk;       // where a row group's text column chunk lies, and how it is coded
    struct ChunkState;  // the dictionary and the rows read so far, while a chunk is read
    void read_footer();
    // Finds column_ among the top-level fields; returns the schema's number of leaves.
    size_t find_column(const parquet_format::FileMetaData& metadata);
    // Each row group's chunk of the column, checked to lie inside the data (before the footer).
    void locate_chunks(const parquet_format::FileMetaData& metadata, size_t leaves, uint64_t data_end);
    struct DecodedPage;  // a data page's rows: which are present, and their values
    // Runs work(), giving its data errors the file, row group, column and page.
    template <class Work>
    auto in_page(size_t row_group, uint64_t page_at, Work&& work) const;
    // Reads and checks the page header at `pos`, advancing it to the page's body.
    parquet_format::PageHeader read_page_header(const Chunk& chunk, uint64_t& pos) const;
    // Reads the page at `pos`, advancing it past the page: a data page's rows, or none (a
    // dictionary page, kept in `state`, or an index page).
    DecodedPage read_page(const Chunk& chunk, uint64_t& pos, ChunkState& state) const;
    // bytes: the buffer levels and values point into, kept with the page.
    DecodedPage decode_data_page(uint64_t count, int32_t encoding, std::string_view levels, std::string_view values, std::unique_ptr<std::string> bytes,
                                 const ChunkState& state) const;

    std::unique_ptr<ByteSource> source_;
    std::string name_, column_;
    ReaderLimits limits_;
    size_t leaf_ = 0;          // the column's index among the schema's leaves
    int max_definition_ = 0;   // 1 for an optional column
    std::vector<Chunk> chunks_;
};

}  // namespace llmtrain::parquet

#include "data/parquet_reader.h"

#include <fcntl.h>
#include <thrift/TConfiguration.h>
#include <thrift/protocol/TCompactProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/error.h"
#include "data/parquet_encodings.h"
#include "data/parquet_format_types.h"  // generated from parquet_format.thrift

namespace llmtrain::parquet {

namespace pf = llmtrain::parquet_format;

namespace {

// The specification's enumeration values (parquet.thrift) the reader tells apart.
constexpr int32_t kByteArray = 6;
constexpr int32_t kRequired = 0, kRepeated = 2;
enum PageType : int32_t { data_page = 0, index_page = 1, dictionary_page = 2, data_page_v2 = 3 };
enum Encoding : int32_t { plain = 0, plain_dictionary = 2, rle = 3, bit_packed = 4, delta_length_byte_array = 6, delta_byte_array = 7, rle_dictionary = 8 };
constexpr size_t kFirstHeaderRead = 4 << 10, kMaxPageHeader = 16 << 20;  // a header is tens of bytes, more with statistics
constexpr int kMaxSchemaDepth = 64;

const char* type_name(int32_t type) {
    static const char* const names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
    return type >= 0 && type < 8 ? names[type] : "an unknown type";
}

std::string encoding_name(int32_t encoding) {
    static const char* const names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
                                        "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return encoding >= 0 && encoding < 10 ? names[encoding] : cat("encoding ", encoding);
}

class FileSource final : public ByteSource {
public:
    explicit FileSource(std::string path) : path_(std::move(path)) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) fail(ErrorKind::data, "cannot open input '", path_, "': ", std::strerror(errno));
        const off_t end = ::lseek(fd_, 0, SEEK_END);
        if (end < 0) fail(ErrorKind::io, "cannot read input '", path_, "': ", std::strerror(errno));
        size_ = static_cast<uint64_t>(end);
    }
    ~FileSource() override { ::close(fd_); }
    uint64_t size() const override { return size_; }
    std::string read(uint64_t offset, size_t length) const override {
        std::string bytes(length, '\0');
        for (size_t done = 0; done < length;) {
            const ssize_t n = ::pread(fd_, bytes.data() + done, length - done, static_cast<off_t>(offset + done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail(ErrorKind::io, "input '", path_, "' changed while being read (short read at byte ", offset + done, ")");
            done += static_cast<size_t>(n);
        }
        return bytes;
    }

private:
    std::string path_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

class MemorySource final : public ByteSource {
public:
    explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
    uint64_t size() const override { return bytes_.size(); }
    std::string read(uint64_t offset, size_t length) const override {
        if (offset > bytes_.size() || length > bytes_.size() - offset) fail(ErrorKind::data, "read of ", length, " bytes at ", offset, " past the end (", bytes_.size(), ")");
        return std::string(bytes_.substr(static_cast<size_t>(offset), length));
    }

private:
    std::string_view bytes_;
};

// A Thrift struct from the front of `bytes`; `consumed` tells how many bytes it took. Every
// string and list is bounded by the bytes given, so no length in the data allocates more.
template <class T>
T read_thrift(std::string_view bytes, size_t& consumed) {
    using apache::thrift::transport::TMemoryBuffer;
    const int limit = static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX));
    const int frame_size = apache::thrift::TConfiguration::DEFAULT_MAX_FRAME_SIZE;  // a copy: the constant has no definition to bind a reference to
    auto config = std::make_shared<apache::thrift::TConfiguration>(limit, frame_size, kMaxSchemaDepth);
    auto buffer = std::make_shared<TMemoryBuffer>(reinterpret_cast<uint8_t*>(const_cast<char*>(bytes.data())), static_cast<uint32_t>(limit), TMemoryBuffer::OBSERVE, config);
    apache::thrift::protocol::TCompactProtocolT<TMemoryBuffer> protocol(buffer, limit, limit);
    T value;
    value.read(&protocol);
    consumed = static_cast<size_t>(limit) - buffer->available_read();
    return value;
}

bool is_group(const pf::SchemaElement& e) { return e.__isset.num_children && e.num_children > 0; }

// The schema is a tree flattened depth first; `next` walks it from element `index`, counting
// the leaves (the column chunks of a row group are the leaves, in this order).
struct SchemaWalk {
    const std::vector<pf::SchemaElement>& schema;
    size_t next = 1, leaves = 0;
    void element(int depth) {
        if (next >= schema.size()) fail(ErrorKind::data, "the schema's tree needs more elements than its ", schema.size());
        if (depth > kMaxSchemaDepth) fail(ErrorKind::data, "the schema nests deeper than ", kMaxSchemaDepth, " levels");
        const pf::SchemaElement& e = schema[next++];
        if (!is_group(e)) {
            ++leaves;
            return;
        }
        for (int32_t c = 0; c < e.num_children; ++c) element(depth + 1);
    }
};

}  // namespace

std::unique_ptr<ByteSource> open_file_source(const std::string& path) { return std::make_unique<FileSource>(path); }
std::unique_ptr<ByteSource> memory_source(std::string_view bytes) { return std::make_unique<MemorySource>(bytes); }

struct TextColumnReader::Chunk {
    uint64_t rows = 0, weight = 1;
    uint64_t begin = 0, end = 0;  // file offsets of the column chunk's pages
    Codec codec = Codec::uncompressed;
};

struct TextColumnReader::ChunkState {
    size_t row_group = 0;
    uint64_t row = 0;  // rows visited so far
    std::string dictionary_bytes;
    std::vector<std::string_view> dictionary;
    bool has_dictionary = false;
};

struct TextColumnReader::DecodedPage {
    std::vector<uint8_t> present;         // per row: 1 a value, 0 a null
    PageValues values;                    // the non-null values, in order
    std::unique_ptr<std::string> bytes;   // what the values may point into (a stable address)
};

TextColumnReader::TextColumnReader(std::unique_ptr<ByteSource> source, std::string name, std::string column, ReaderLimits limits)
    : source_(std::move(source)), name_(std::move(name)), column_(std::move(column)), limits_(limits) {
    read_footer();
}

TextColumnReader::~TextColumnReader() = default;

size_t TextColumnReader::row_groups() const { return chunks_.size(); }
uint64_t TextColumnReader::rows(size_t g) const { return chunks_.at(g).rows; }
uint64_t TextColumnReader::weight(size_t g) const { return chunks_.at(g).weight; }

// The file is: PAR1, the column chunks, the footer's metadata, its 4-byte length, PAR1.
void TextColumnReader::read_footer() {
    const uint64_t size = source_->size();
    if (size < 12) fail(ErrorKind::data, "input '", name_, "': magic: ", size, " bytes are too few for a Parquet file (PAR1, footer, length, PAR1)");
    const std::string tail = source_->read(size - 8, 8);
    if (tail.compare(4, 4, "PARE") == 0) fail(ErrorKind::data, "input '", name_, "': footer: the file is encrypted (PARE), which is not supported");
    if (tail.compare(4, 4, "PAR1") != 0) fail(ErrorKind::data, "input '", name_, "': magic: the file does not end with PAR1 (cut short, or not Parquet)");
    if (source_->read(0, 4) != "PAR1") fail(ErrorKind::data, "input '", name_, "': magic: the file does not start with PAR1 (not Parquet)");
    ByteCursor length_bytes(std::string_view(tail).substr(0, 4));
    const uint64_t length = length_bytes.u32_le("footer length");
    if (length > size - 12) fail(ErrorKind::data, "input '", name_, "': footer: its length ", length, " runs past the start of the file (", size, " bytes)");
    if (length > limits_.max_footer_bytes) fail(ErrorKind::data, "input '", name_, "': footer: ", length, " bytes, more than the ", limits_.max_footer_bytes, " this reader takes");
    const uint64_t data_end = size - 8 - length;
    const std::string bytes = source_->read(data_end, static_cast<size_t>(length));
    pf::FileMetaData metadata;
    try {
        size_t consumed = 0;
        metadata = read_thrift<pf::FileMetaData>(bytes, consumed);
    } catch (const apache::thrift::TException& e) {
        fail(ErrorKind::data, "input '", name_, "': footer: the metadata is cut short or corrupt (", e.what(), ")");
    }
    if (metadata.__isset.encryption_algorithm) fail(ErrorKind::data, "input '", name_, "': footer: the file is encrypted, which is not supported");
    size_t leaves = 0;
    try {
        leaves = find_column(metadata);
    } catch (const Error& e) {
        if (std::string_view(e.what()).starts_with("input '")) throw;
        fail(ErrorKind::data, "input '", name_, "': footer: ", e.what());
    }
    locate_chunks(metadata, leaves, data_end);
}

size_t TextColumnReader::find_column(const pf::FileMetaData& metadata) {
    const auto& schema = metadata.schema;
    if (schema.empty() || !is_group(schema[0])) fail(ErrorKind::data, "the schema has no root group");
    SchemaWalk walk{schema};
    std::string columns;
    const pf::SchemaElement* found = nullptr;
    for (int32_t c = 0; c < schema[0].num_children; ++c) {
        const size_t at = walk.next, leaves_before = walk.leaves;
        walk.element(1);
        const pf::SchemaElement& e = schema[at];
        columns += (columns.empty() ? "" : ", ") + e.name;
        if (e.name != column_ || found) continue;
        found = &e;
        leaf_ = leaves_before;
    }
    if (walk.next != schema.size()) fail(ErrorKind::data, "the schema's tree uses ", walk.next, " of its ", schema.size(), " elements");
    if (!found) fail(ErrorKind::data, "input '", name_, "': no column \"", column_, "\" (--text-column); its columns: ", columns.empty() ? "none" : columns);
    const std::string where = cat("input '", name_, "': column \"", column_, "\"");
    if (is_group(*found)) fail(ErrorKind::data, where, " is nested (a group of ", found->num_children, " fields): only a flat string column can be read");
    if (found->__isset.repetition_type && found->repetition_type == kRepeated) fail(ErrorKind::data, where, " is nested (a repeated field): only a flat string column can be read");
    if (!found->__isset.type || found->type != kByteArray)
        fail(ErrorKind::data, where, " holds ", found->__isset.type ? type_name(found->type) : "no type", ", not BYTE_ARRAY strings");
    max_definition_ = found->__isset.repetition_type && found->repetition_type != kRequired ? 1 : 0;
    if (metadata.num_rows < 0) fail(ErrorKind::data, "the file says it holds ", metadata.num_rows, " rows");
    return walk.leaves;
}

void TextColumnReader::locate_chunks(const pf::FileMetaData& metadata, size_t leaves, uint64_t data_end) {
    for (size_t g = 0; g < metadata.row_groups.size(); ++g) {
        const pf::RowGroup& group = metadata.row_groups[g];
        const std::string where = cat("input '", name_, "': footer: row group ", g, ", column \"", column_, "\"");
        if (group.columns.size() != leaves) fail(ErrorKind::data, "input '", name_, "': footer: row group ", g, " has ", group.columns.size(), " column chunks for the schema's ", leaves, " columns");
        const pf::ColumnChunk& chunk = group.columns[leaf_];
        if (chunk.__isset.crypto_metadata || chunk.__isset.encrypted_column_metadata) fail(ErrorKind::data, where, ": the column is encrypted, which is not supported");
        if (chunk.__isset.file_path) fail(ErrorKind::data, where, ": the column chunk lives in another file ('", chunk.file_path, "'), which is not supported");
        if (!chunk.__isset.meta_data) fail(ErrorKind::data, where, ": the column chunk has no metadata");
        const pf::ColumnMetaData& meta = chunk.meta_data;
        if (meta.path_in_schema.size() != 1 || meta.path_in_schema[0] != column_) fail(ErrorKind::data, where, ": the column chunk belongs to another column");
        if (meta.type != kByteArray) fail(ErrorKind::data, where, ": the column chunk holds ", type_name(meta.type), ", not BYTE_ARRAY");
        if (!codec_supported(meta.codec)) fail(ErrorKind::data, where, ": the ", codec_name(meta.codec), " codec is not supported (UNCOMPRESSED, SNAPPY, GZIP and ZSTD are)");
        if (group.num_rows < 0 || meta.num_values != group.num_rows) fail(ErrorKind::data, where, ": ", meta.num_values, " values for the row group's ", group.num_rows, " rows");
        const int64_t begin = meta.__isset.dictionary_page_offset && meta.dictionary_page_offset > 0 && meta.dictionary_page_offset < meta.data_page_offset
                                  ? meta.dictionary_page_offset : meta.data_page_offset;
        if (begin < 4 || meta.total_compressed_size < 0 || static_cast<uint64_t>(begin) > data_end || static_cast<uint64_t>(meta.total_compressed_size) > data_end - static_cast<uint64_t>(begin))
            fail(ErrorKind::data, where, ": the column chunk (", meta.total_compressed_size, " bytes at byte ", begin, ") is not inside the data, which ends at byte ", data_end);
        if (meta.total_uncompressed_size < 0) fail(ErrorKind::data, where, ": a negative uncompressed size");
        Chunk c;
        c.rows = static_cast<uint64_t>(group.num_rows);
        c.weight = std::max<uint64_t>(1, static_cast<uint64_t>(meta.total_uncompressed_size));
        c.begin = static_cast<uint64_t>(begin);
        c.end = c.begin + static_cast<uint64_t>(meta.total_compressed_size);
        c.codec = static_cast<Codec>(meta.codec);
        chunks_.push_back(c);
    }
}

template <class Work>
auto TextColumnReader::in_page(size_t g, uint64_t page_at, Work&& work) const {
    try {
        return work();
    } catch (const apache::thrift::TException& e) {
        fail(ErrorKind::data, "input '", name_, "': row group ", g, ", column \"", column_, "\", page at byte ", page_at, ": the page header is corrupt (", e.what(), ")");
    } catch (const Error& e) {
        if (e.kind() != ErrorKind::data) throw;
        fail(ErrorKind::data, "input '", name_, "': row group ", g, ", column \"", column_, "\", page at byte ", page_at, ": ", e.what());
    }
}

TextColumnReader::PageStart TextColumnReader::chunk_start(size_t g) const { return {chunks_.at(g).begin, 0, 0}; }

std::vector<TextColumnReader::PageStart> TextColumnReader::data_pages(size_t g) const {
    const Chunk& chunk = chunks_.at(g);
    std::vector<PageStart> pages;
    uint64_t pos = chunk.begin, rows = 0, bytes = 0;
    while (rows < chunk.rows && pos < chunk.end) {
        const uint64_t page_at = pos;
        const pf::PageHeader header = in_page(g, page_at, [&] { return read_page_header(chunk, pos); });
        const bool data = header.type == data_page || header.type == data_page_v2;
        if (data) pages.push_back({page_at, rows, bytes});
        if (header.type == data_page && header.__isset.data_page_header) rows += static_cast<uint64_t>(std::max(0, header.data_page_header.num_values));
        if (header.type == data_page_v2 && header.__isset.data_page_header_v2) rows += static_cast<uint64_t>(std::max(0, header.data_page_header_v2.num_values));
        bytes += (pos - page_at) + static_cast<uint64_t>(header.uncompressed_page_size);
        pos += static_cast<uint64_t>(header.compressed_page_size);
    }
    return pages;
}

void TextColumnReader::read_row_group(size_t g, const RowVisitor& visit) const { read_pages(g, chunk_start(g), chunks_.at(g).end, visit); }

void TextColumnReader::read_pages(size_t g, const PageStart& from, uint64_t to, const RowVisitor& visit) const {
    const Chunk& chunk = chunks_.at(g);
    ChunkState state;
    state.row_group = g;
    uint64_t pos = chunk.begin;
    // Pages before `from`: only a dictionary page is read (its values are the later pages'),
    // the others are passed over by their headers.
    while (pos < from.offset && pos < chunk.end) {
        const uint64_t page_at = pos;
        uint64_t after = pos;
        const pf::PageHeader header = in_page(g, page_at, [&] { return read_page_header(chunk, after); });
        if (header.type == dictionary_page) in_page(g, page_at, [&] { return read_page(chunk, pos, state); });
        else pos = after + static_cast<uint64_t>(header.compressed_page_size);
    }
    if (pos != from.offset) fail(ErrorKind::data, "input '", name_, "': row group ", g, ", column \"", column_, "\": no page starts at byte ", from.offset);
    state.row = from.rows_before;
    while (state.row < chunk.rows && pos < to) {
        const uint64_t page_at = pos;
        const DecodedPage page = in_page(g, page_at, [&] { return read_page(chunk, pos, state); });
        size_t next = 0;
        for (const uint8_t present : page.present) visit(state.row++, present ? &page.values.values[next++] : nullptr);
    }
    if (to >= chunk.end && state.row < chunk.rows)
        fail(ErrorKind::data, "input '", name_, "': row group ", g, ", column \"", column_, "\": the column chunk ends after ", state.row, " of its ", chunk.rows, " rows");
}

parquet_format::PageHeader TextColumnReader::read_page_header(const Chunk& chunk, uint64_t& pos) const {
    // The header's length is known only once it is parsed: read a window, and a larger one
    // if the header (statistics can be long) does not fit.
    pf::PageHeader header;
    const uint64_t left = chunk.end - pos;
    for (size_t window = static_cast<size_t>(std::min<uint64_t>(left, kFirstHeaderRead));; window = static_cast<size_t>(std::min<uint64_t>(left, window * 4))) {
        const std::string bytes = source_->read(pos, window);
        try {
            size_t consumed = 0;
            header = read_thrift<pf::PageHeader>(bytes, consumed);
            pos += consumed;
            break;
        } catch (const apache::thrift::transport::TTransportException& e) {
            if (e.getType() != apache::thrift::transport::TTransportException::END_OF_FILE) throw;
            if (window == left) fail(ErrorKind::data, "the page header runs past the column chunk (which ends at byte ", chunk.end, ")");
            if (window >= kMaxPageHeader) fail(ErrorKind::data, "a page header longer than ", kMaxPageHeader, " bytes");
        }
    }
    if (header.compressed_page_size < 0 || header.uncompressed_page_size < 0) fail(ErrorKind::data, "the page header gives a negative size");
    const auto compressed = static_cast<uint64_t>(header.compressed_page_size), size = static_cast<uint64_t>(header.uncompressed_page_size);
    if (compressed > chunk.end - pos) fail(ErrorKind::data, "the page's ", compressed, " bytes run past the column chunk (which ends at byte ", chunk.end, ")");
    if (size > limits_.max_page_bytes) fail(ErrorKind::data, "the page is ", size, " bytes uncompressed, more than the ", limits_.max_page_bytes, " this reader takes");
    return header;
}

TextColumnReader::DecodedPage TextColumnReader::read_page(const Chunk& chunk, uint64_t& pos, ChunkState& state) const {
    const pf::PageHeader header = read_page_header(chunk, pos);
    const auto compressed = static_cast<uint64_t>(header.compressed_page_size), size = static_cast<uint64_t>(header.uncompressed_page_size);
    const std::string body = source_->read(pos, static_cast<size_t>(compressed));
    pos += compressed;
    switch (header.type) {
        case dictionary_page: {
            if (!header.__isset.dictionary_page_header) fail(ErrorKind::data, "a dictionary page without its header");
            const pf::DictionaryPageHeader& d = header.dictionary_page_header;
            if (state.has_dictionary) fail(ErrorKind::data, "a second dictionary page in one column chunk");
            if (d.encoding != plain && d.encoding != plain_dictionary) fail(ErrorKind::data, "a dictionary page in ", encoding_name(d.encoding), " (PLAIN expected)");
            if (d.num_values < 0 || static_cast<uint64_t>(d.num_values) > limits_.max_page_values) fail(ErrorKind::data, "a dictionary of ", d.num_values, " values");
            state.dictionary_bytes = decompress_page(chunk.codec, body, static_cast<size_t>(size));
            state.dictionary = decode_plain_byte_arrays(state.dictionary_bytes, static_cast<uint64_t>(d.num_values));
            state.has_dictionary = true;
            return {};
        }
        case data_page: {
            if (!header.__isset.data_page_header) fail(ErrorKind::data, "a data page without its header");
            const pf::DataPageHeader& d = header.data_page_header;
            auto page = std::make_unique<std::string>(decompress_page(chunk.codec, body, static_cast<size_t>(size)));
            ByteCursor in(*page);
            std::string_view levels;
            if (max_definition_ > 0) {  // v1: levels behind a 4-byte length, compressed with the values
                if (d.definition_level_encoding != rle) fail(ErrorKind::data, "definition levels in ", encoding_name(d.definition_level_encoding), " (only RLE is supported)");
                levels = in.take(in.u32_le("definition levels' length"), "definition levels");
            }
            if (d.num_values < 0) fail(ErrorKind::data, "a page of ", d.num_values, " values");
            return decode_data_page(static_cast<uint64_t>(d.num_values), d.encoding, levels, in.rest(), std::move(page), state);
        }
        case data_page_v2: {
            if (!header.__isset.data_page_header_v2) fail(ErrorKind::data, "a v2 data page without its header");
            const pf::DataPageHeaderV2& d = header.data_page_header_v2;
            // v2: repetition then definition levels, never compressed, then the values.
            if (d.num_values < 0 || d.definition_levels_byte_length < 0 || d.repetition_levels_byte_length < 0) fail(ErrorKind::data, "the v2 page header gives a negative count");
            const uint64_t level_bytes = static_cast<uint64_t>(d.definition_levels_byte_length) + static_cast<uint64_t>(d.repetition_levels_byte_length);
            if (level_bytes > compressed || level_bytes > size) fail(ErrorKind::data, "the v2 page's levels (", level_bytes, " bytes) are longer than the page");
            const std::string_view levels = std::string_view(body).substr(static_cast<size_t>(d.repetition_levels_byte_length), static_cast<size_t>(d.definition_levels_byte_length));
            const std::string_view stored = std::string_view(body).substr(static_cast<size_t>(level_bytes));
            const bool compressed_values = d.is_compressed && chunk.codec != Codec::uncompressed;
            auto values = std::make_unique<std::string>(decompress_page(compressed_values ? chunk.codec : Codec::uncompressed, stored, static_cast<size_t>(size - level_bytes)));
            const std::string_view value_bytes = *values;
            return decode_data_page(static_cast<uint64_t>(d.num_values), d.encoding, max_definition_ > 0 ? levels : std::string_view(), value_bytes, std::move(values), state);
        }
        case index_page: return {};  // not used by readers; skipped
        default: fail(ErrorKind::data, "page type ", header.type, " is not a Parquet page type");
    }
}

TextColumnReader::DecodedPage TextColumnReader::decode_data_page(uint64_t count, int32_t encoding, std::string_view levels, std::string_view values,
                                                                 std::unique_ptr<std::string> bytes, const ChunkState& state) const {
    const Chunk& chunk = chunks_[state.row_group];
    if (count > limits_.max_page_values) fail(ErrorKind::data, "a page of ", count, " values, more than the ", limits_.max_page_values, " this reader takes");
    if (count > chunk.rows - state.row) fail(ErrorKind::data, "the pages hold more than the row group's ", chunk.rows, " rows");
    // Definition level 1 is a value, 0 a null (an optional flat column); a required column
    // has no levels and every row is a value.
    DecodedPage page;
    page.bytes = std::move(bytes);
    page.present.assign(static_cast<size_t>(count), 1);
    uint64_t non_null = count;
    if (max_definition_ > 0) {
        HybridDecoder decoder(levels, 1, "definition levels");
        for (uint64_t i = 0; i < count; ++i) {
            const uint32_t level = decoder.next();
            if (level > static_cast<uint32_t>(max_definition_)) fail(ErrorKind::data, "definition level ", level, " of row ", state.row + i, " is past the maximum ", max_definition_);
            page.present[static_cast<size_t>(i)] = static_cast<uint8_t>(level);
            non_null -= level == 0;
        }
    }
    switch (encoding) {
        case plain: page.values.values = decode_plain_byte_arrays(values, non_null); break;
        case plain_dictionary:
        case rle_dictionary:
            if (!state.has_dictionary) fail(ErrorKind::data, "a dictionary-encoded page before any dictionary page");
            page.values.values = decode_dictionary_indices(values, non_null, state.dictionary);
            break;
        case delta_length_byte_array: page.values.values = decode_delta_length_byte_arrays(values, non_null); break;
        case delta_byte_array: page.values = decode_delta_byte_arrays(values, non_null); break;
        default: fail(ErrorKind::data, "values in ", encoding_name(encoding), ", which is not supported for a string column");
    }
    return page;
}

}  // namespace llmtrain::parquet

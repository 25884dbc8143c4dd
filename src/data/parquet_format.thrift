// The part of the Parquet format (https://github.com/apache/parquet-format, parquet.thrift)
// that `prepare` reads: the footer's file metadata down to the column chunks, and the page
// headers. Field ids and types are the specification's; fields we do not use are left out,
// and the Thrift reader skips them. Enumerations are read as i32 (the specification's values
// are in parquet_reader.cpp), so a value this list does not know is reported by name of the
// field, not lost. Only the fields the reader cannot do without are `required`, so a file
// missing one fails in the Thrift reader with the field's name.
namespace cpp llmtrain.parquet_format

// A union we only need to see the presence of (encryption metadata).
struct Present {}

struct SchemaElement {
  1: optional i32 type;              // Type: BOOLEAN 0 ... BYTE_ARRAY 6, FIXED_LEN_BYTE_ARRAY 7
  3: optional i32 repetition_type;   // REQUIRED 0, OPTIONAL 1, REPEATED 2
  4: required string name;
  5: optional i32 num_children;      // set (> 0) on groups
  6: optional i32 converted_type;    // UTF8 0, ...
}

struct ColumnMetaData {
  1: required i32 type;
  3: required list<string> path_in_schema;
  4: required i32 codec;             // UNCOMPRESSED 0, SNAPPY 1, GZIP 2, LZO 3, BROTLI 4, LZ4 5, ZSTD 6, LZ4_RAW 7
  5: required i64 num_values;
  6: required i64 total_uncompressed_size;
  7: required i64 total_compressed_size;
  9: required i64 data_page_offset;
  11: optional i64 dictionary_page_offset;
}

struct ColumnChunk {
  1: optional string file_path;      // set when the chunk lives in another file
  3: optional ColumnMetaData meta_data;
  8: optional Present crypto_metadata;
  9: optional binary encrypted_column_metadata;
}

struct RowGroup {
  1: required list<ColumnChunk> columns;
  3: required i64 num_rows;
}

struct FileMetaData {
  1: required i32 version;
  2: required list<SchemaElement> schema;
  3: required i64 num_rows;
  4: required list<RowGroup> row_groups;
  6: optional string created_by;
  8: optional Present encryption_algorithm;
}

struct DataPageHeader {
  1: required i32 num_values;
  2: required i32 encoding;          // PLAIN 0, PLAIN_DICTIONARY 2, RLE 3, BIT_PACKED 4, DELTA_BINARY_PACKED 5,
                                     // DELTA_LENGTH_BYTE_ARRAY 6, DELTA_BYTE_ARRAY 7, RLE_DICTIONARY 8
  3: required i32 definition_level_encoding;
  4: required i32 repetition_level_encoding;
}

struct DictionaryPageHeader {
  1: required i32 num_values;
  2: required i32 encoding;
}

struct DataPageHeaderV2 {
  1: required i32 num_values;
  2: required i32 num_nulls;
  3: required i32 num_rows;
  4: required i32 encoding;
  5: required i32 definition_levels_byte_length;
  6: required i32 repetition_levels_byte_length;
  7: optional bool is_compressed = true;
}

struct PageHeader {
  1: required i32 type;              // DATA_PAGE 0, INDEX_PAGE 1, DICTIONARY_PAGE 2, DATA_PAGE_V2 3
  2: required i32 uncompressed_page_size;
  3: required i32 compressed_page_size;
  5: optional DataPageHeader data_page_header;
  7: optional DictionaryPageHeader dictionary_page_header;
  8: optional DataPageHeaderV2 data_page_header_v2;
}

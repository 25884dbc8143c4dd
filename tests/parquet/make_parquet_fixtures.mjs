// Parquet fixtures for the tests of `llmtrain prepare --input FILE.parquet`.
//
// usage: node make_parquet_fixtures.mjs OUT_DIR TEXTS_JSON [--small]
//   --small  for fewer documents (the fuzz seeds, scripts/fuzz-seeds.sh): row-group and page
//            sizes scaled down to the documents given, and no check that every file has
//            several row groups of several pages
//
// TEXTS_JSON is a JSON array of strings: the documents, in order. Every file listed in
// OUT_DIR/fixtures.txt holds exactly those documents, in that order, in a BYTE_ARRAY (UTF-8)
// column named `text`, beside an id column (INT64 from parquet-wasm, INT32 from
// hyparquet-writer) and in some files a `url` string column, before or after `text`. Two
// writers, so that two implementations' reading of the format is exercised:
//   wasm-*  parquet-wasm (the Rust parquet crate): data page v1 or v2, any codec, dictionary
//           pages with a fallback to plain / delta pages when the dictionary outgrows its limit
//   hyp-*   hyparquet-writer (JavaScript): data page v2 only; ZSTD through the zstd tool
// Names read WRITER-PAGES-CODEC-ENCODING[-extra]. Coverage (of the text column; ~1,900
// documents, ~400 KB, as the end-to-end test makes them):
//
//   file (.parquet)                                pages codec         text data pages (after a PLAIN dictionary page)  text      row groups x pages
//   wasm-v1-none-plain                             v1    UNCOMPRESSED  PLAIN                                            required  7 x 2-7
//   wasm-v1-none-dict                              v1    UNCOMPRESSED  dictionary: RLE_DICTIONARY                       optional  5 x 2
//   wasm-v1-snappy-dict                            v1    SNAPPY        dictionary: RLE_DICTIONARY                       required  5 x 4-5
//   wasm-v1-snappy-plain_dictionary                v1    SNAPPY        dictionary: PLAIN_DICTIONARY (relabelled, and    required  7 x 2-4
//                                                                      its dictionary pages PLAIN_DICTIONARY)
//   wasm-v1-snappy-plain-one_page                  v1    SNAPPY        PLAIN                                            required  1 x 1
//   wasm-v1-gzip-delta_length_byte_array           v1    GZIP          DELTA_LENGTH_BYTE_ARRAY                          required  8 x 3-7
//   wasm-v1-zstd-dict                              v1    ZSTD          dictionary: RLE_DICTIONARY                       required  4 x 4-5
//   wasm-v1-zstd-dict_fallback_plain               v1    ZSTD          dictionary, then PLAIN in the same chunk         required  2 x 19-20
//   wasm-v2-none-dict                              v2    UNCOMPRESSED  dictionary: RLE_DICTIONARY                       optional  7 x 2
//   wasm-v2-snappy-delta_byte_array                v2    SNAPPY        DELTA_BYTE_ARRAY                                 required  5 x 7-9
//   wasm-v2-snappy-dict_fallback_delta_byte_array  v2    SNAPPY        dictionary, then DELTA_BYTE_ARRAY                optional  2 x 6-8
//   wasm-v2-gzip-dict                              v2    GZIP          dictionary: RLE_DICTIONARY                       required  6 x 2-5
//   wasm-v2-zstd-plain                             v2    ZSTD          PLAIN                                            optional  7 x 2-7
//   wasm-v2-zstd-delta_length_byte_array           v2    ZSTD          DELTA_LENGTH_BYTE_ARRAY                          optional  5 x 9-15
//   hyp-v2-none-plain                              v2    UNCOMPRESSED  PLAIN                                            required  7 x 2-10
//   hyp-v2-none-delta_byte_array                   v2    UNCOMPRESSED  DELTA_BYTE_ARRAY                                 optional  7 x 4-21
//   hyp-v2-snappy-dict                             v2    SNAPPY        dictionary: RLE_DICTIONARY                       optional  5 x 4-6
//   hyp-v2-snappy-delta_byte_array                 v2    SNAPPY        DELTA_BYTE_ARRAY                                 required  6 x 4-11
//   hyp-v2-gzip-dict                               v2    GZIP          dictionary: RLE_DICTIONARY                       required  4 x 4-6
//   hyp-v2-gzip-delta_length_byte_array            v2    GZIP          DELTA_LENGTH_BYTE_ARRAY                          optional  8 x 4-9
//   hyp-v2-zstd-plain                              v2    ZSTD          PLAIN                                            optional  5 x 4-6
//   (pages: of the text column chunks, a dictionary page included. parquet-wasm writes an
//   optional column's dictionary indices as one data page a chunk. The other columns: id
//   INT64 PLAIN (v1) or DELTA_BINARY_PACKED (v2) from parquet-wasm, INT32 PLAIN from
//   hyparquet-writer; url PLAIN (v1, hyparquet-writer) or DELTA_BYTE_ARRAY (parquet-wasm v2).
//   Text annotated UTF8 and STRING by parquet-wasm, UTF8 only by hyparquet-writer, whose v2
//   pages say is_compressed even when UNCOMPRESSED. The counts are printed for the corpus
//   given, and the names' promises checked.)
//
// Also written:
//   texts.jsonl          the documents as JSONL, {"text": ...} a line
//   fixtures.txt         the names of the files above, one a line
//   nulls.parquet        the documents with null rows inserted before documents 7 and 20 (rows
//                        7 and 21 of the file; row groups of 16 rows, then 600: row group 0
//                        row 7 and row group 1 row 5), text optional; nulls.jsonl: the same
//                        records, {"text": null} at the null rows
//   invalid-utf8.parquet document 3 replaced by bytes that are not UTF-8 (row 3 of row group 0);
//                        invalid-utf8.jsonl: the same records, the raw bytes in the JSON string
//   body-column.parquet  the documents in a column named `body` (columns: id, body)
//   unsupported/         files the reader is to refuse: lz4_raw.parquet, lz4.parquet (Hadoop
//                        LZ4), brotli.parquet (codecs), nested-list.parquet (text: list<string>)
//                        and nested-struct.parquet (text: struct<value: string>)
//
// Each file is read back with hyparquet and must give the documents (and ids) exactly; its
// pages are walked from the metadata's offsets, and the page types, encodings, row groups and
// pages printed and compared with what the file's name promises, so that a writer option
// silently ignored fails here rather than thinning the coverage. ZSTD (hyparquet-writer's
// pages, and hyparquet's reading of every ZSTD file) goes through the zstd command-line tool.
import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import zlib from 'node:zlib'

import * as arrow from 'apache-arrow'
import { parquetMetadata, parquetReadObjects } from 'hyparquet'
import { parquetHeader } from 'hyparquet/src/column.js'
import { parquetWriteBuffer } from 'hyparquet-writer'
import * as pq from 'parquet-wasm'

const [outDir, textsJson, mode] = process.argv.slice(2)
const small = mode === '--small'
if (!outDir || !textsJson || (mode !== undefined && !small)) {
  console.error('usage: make_parquet_fixtures.mjs OUT_DIR TEXTS_JSON [--small]')
  process.exit(1)
}
const texts = JSON.parse(fs.readFileSync(textsJson, 'utf8'))
if (!Array.isArray(texts) || texts.length < 40 || !texts.every(t => typeof t === 'string')) {
  throw new Error(`${textsJson}: expected a JSON array of at least 40 strings`)
}
const n = texts.length
fs.mkdirSync(path.join(outDir, 'unsupported'), { recursive: true })

function zstd(args, input) {
  const r = spawnSync('zstd', ['-q', '-c', ...args], { input, maxBuffer: 1 << 30 })
  if (r.error) throw new Error(`zstd: ${r.error.message} (the zstd tool is needed for the ZSTD fixtures)`)
  if (r.status !== 0) throw new Error(`zstd ${args.join(' ')}: ${r.stderr}`)
  return new Uint8Array(r.stdout.buffer, r.stdout.byteOffset, r.stdout.byteLength)
}
const compressors = {
  GZIP: bytes => new Uint8Array(zlib.gzipSync(bytes)),
  ZSTD: bytes => zstd(['-3'], bytes),
}
// ZSTD pages are decompressed ahead, a file's in one run of the tool (zstdAhead, from the
// page walk), and handed to hyparquet by their bytes.
const zstdPages = new Map()
const pageKey = bytes => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64')
const decompressors = {
  GZIP: bytes => new Uint8Array(zlib.unzipSync(bytes)),
  ZSTD: bytes => zstdPages.get(pageKey(bytes)) ?? zstd(['-d'], bytes),
}

const urls = texts.map((_, i) => `https://example.org/fortune/${i}`)

// ---- parquet-wasm: an Arrow table handed over as IPC ----
function arrowColumn(name) {
  switch (name) {
    case 'id': return { field: new arrow.Field('id', new arrow.Int64(), false), vector: arrow.vectorFromArray(BigInt64Array.from(texts, (_, i) => BigInt(i)), new arrow.Int64()) }
    case 'url': return { field: new arrow.Field('url', new arrow.Utf8(), false), vector: arrow.vectorFromArray(urls, new arrow.Utf8()) }
    case 'text': return { field: new arrow.Field('text', new arrow.Utf8(), false), vector: arrow.vectorFromArray(texts, new arrow.Utf8()) }
    case 'text?': return { field: new arrow.Field('text', new arrow.Utf8(), true), vector: arrow.vectorFromArray(texts, new arrow.Utf8()) }
    case 'body': return { field: new arrow.Field('body', new arrow.Utf8(), false), vector: arrow.vectorFromArray(texts, new arrow.Utf8()) }
    case 'text:list': {
      const type = new arrow.List(new arrow.Field('item', new arrow.Utf8(), false))
      return { field: new arrow.Field('text', type, false), vector: arrow.vectorFromArray(texts.map(t => [t]), type) }
    }
    case 'text:struct': {
      const type = new arrow.Struct([new arrow.Field('value', new arrow.Utf8(), false)])
      return { field: new arrow.Field('text', type, false), vector: arrow.vectorFromArray(texts.map(t => ({ value: t })), type) }
    }
  }
  throw new Error(`unknown column ${name}`)
}

function arrowTable(columns) {
  const cols = columns.map(arrowColumn)
  const schema = new arrow.Schema(cols.map(c => c.field))
  const data = arrow.makeData({ type: new arrow.Struct(schema.fields), length: n, nullCount: 0, children: cols.map(c => c.vector.data[0]) })
  return new arrow.Table(schema, [new arrow.RecordBatch(schema, data)])
}

// o: version 1|2, codec, dict, encoding (the non-dictionary encoding), rows (per row group),
// page (data page size limit, bytes), dictLimit (dictionary page size limit, bytes)
function writeWasm(columns, o) {
  let b = new pq.WriterPropertiesBuilder()
    .setWriterVersion(o.version === 2 ? pq.WriterVersion.V2 : pq.WriterVersion.V1)
    .setCompression(pq.Compression[o.codec])
    .setDictionaryEnabled(false)
    .setMaxRowGroupSize(o.rows ?? n)
    .setDataPageSizeLimit(o.page ?? 1 << 23)
    .setWriteBatchSize(o.batch ?? 16) // the page size limit is checked once a batch
  if (o.dict) b = b.setColumnDictionaryEnabled('text', true)
  if (o.dictLimit) b = b.setDictionaryPageSizeLimit(o.dictLimit)
  if (o.encoding) b = b.setColumnEncoding('text', pq.Encoding[o.encoding])
  const table = pq.Table.fromIPCStream(arrow.tableToIPC(arrowTable(columns), 'stream'))
  const bytes = pq.writeParquet(table, b.build())
  return o.relabel ? relabelPlainDictionary(bytes) : bytes
}

// ---- hyparquet-writer: columns of JS values ----
function hypColumn(name, encoding) {
  switch (name) {
    case 'id': return { name: 'id', data: Int32Array.from(texts, (_, i) => i), type: 'INT32', nullable: false, encoding: 'PLAIN' }
    case 'url': return { name: 'url', data: urls, type: 'STRING', nullable: false, encoding: 'PLAIN' }
    case 'text': return { name: 'text', data: texts, type: 'STRING', nullable: false, encoding }
    case 'text?': return { name: 'text', data: texts, type: 'STRING', nullable: true, encoding }
  }
  throw new Error(`unknown column ${name}`)
}

// o: codec, encoding (PLAIN, RLE_DICTIONARY, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY), rows, page
function writeHyp(columns, o) {
  const buffer = parquetWriteBuffer({
    columnData: columns.map(c => hypColumn(c, o.encoding)),
    codec: o.codec,
    compressors,
    rowGroupSize: o.rows,
    pageSize: o.page,
    createdBy: 'hyparquet-writer',
  })
  return new Uint8Array(buffer)
}

// The documents' files. rows / page are chosen for ~1,900 documents of ~210 bytes: several
// row groups of about 60-90 KB of text (the pieces of `--unit-mb 0.05` units) and several
// pages in each column chunk. Dictionary-index pages hold ~1-2 bytes a row, so their page
// limit is far lower.
const fixtures = [
  ['wasm-v1-none-plain', ['text', 'id'], { version: 1, codec: 'UNCOMPRESSED', encoding: 'PLAIN', rows: 300, page: 8192 }],
  ['wasm-v1-none-dict', ['id', 'text?', 'url'], { version: 1, codec: 'UNCOMPRESSED', dict: true, rows: 400, page: 128 }],
  ['wasm-v1-snappy-dict', ['id', 'url', 'text'], { version: 1, codec: 'SNAPPY', dict: true, rows: 400, page: 128 }],
  // parquet-mr's v1 writer labels dictionary pages and the data pages that index them
  // PLAIN_DICTIONARY, which parquet-wasm does not: its labels are rewritten (relabel below).
  ['wasm-v1-snappy-plain_dictionary', ['id', 'text', 'url'], { version: 1, codec: 'SNAPPY', dict: true, rows: 300, page: 128, relabel: true }],
  ['wasm-v1-snappy-plain-one_page', ['id', 'text'], { version: 1, codec: 'SNAPPY', encoding: 'PLAIN', batch: 1024 }],
  ['wasm-v1-gzip-delta_length_byte_array', ['text', 'id'], { version: 1, codec: 'GZIP', encoding: 'DELTA_LENGTH_BYTE_ARRAY', rows: 250, page: 8192 }],
  ['wasm-v1-zstd-dict', ['id', 'text'], { version: 1, codec: 'ZSTD', dict: true, rows: 500, page: 160 }],
  ['wasm-v1-zstd-dict_fallback_plain', ['id', 'text'], { version: 1, codec: 'ZSTD', dict: true, encoding: 'PLAIN', dictLimit: 32768, rows: 1000, page: 8192 }],
  ['wasm-v2-none-dict', ['id', 'text?', 'url'], { version: 2, codec: 'UNCOMPRESSED', dict: true, rows: 300, page: 96 }],
  ['wasm-v2-snappy-delta_byte_array', ['text', 'id'], { version: 2, codec: 'SNAPPY', encoding: 'DELTA_BYTE_ARRAY', rows: 400, page: 8192 }],
  ['wasm-v2-snappy-dict_fallback_delta_byte_array', ['id', 'text?'], { version: 2, codec: 'SNAPPY', dict: true, encoding: 'DELTA_BYTE_ARRAY', dictLimit: 32768, rows: 1000, page: 8192 }],
  ['wasm-v2-gzip-dict', ['url', 'text', 'id'], { version: 2, codec: 'GZIP', dict: true, rows: 350, page: 112 }],
  ['wasm-v2-zstd-plain', ['id', 'text?'], { version: 2, codec: 'ZSTD', encoding: 'PLAIN', rows: 300, page: 8192 }],
  ['wasm-v2-zstd-delta_length_byte_array', ['text?', 'url', 'id'], { version: 2, codec: 'ZSTD', encoding: 'DELTA_LENGTH_BYTE_ARRAY', rows: 400, page: 4096 }],
  ['hyp-v2-none-plain', ['id', 'text'], { codec: 'UNCOMPRESSED', encoding: 'PLAIN', rows: 300, page: 8192 }],
  ['hyp-v2-none-delta_byte_array', ['text?', 'id'], { codec: 'UNCOMPRESSED', encoding: 'DELTA_BYTE_ARRAY', rows: 300, page: 4096 }],
  ['hyp-v2-snappy-dict', ['text?', 'id'], { codec: 'SNAPPY', encoding: 'RLE_DICTIONARY', rows: 400, page: 400 }],
  ['hyp-v2-snappy-delta_byte_array', ['id', 'text', 'url'], { codec: 'SNAPPY', encoding: 'DELTA_BYTE_ARRAY', rows: 350, page: 8192 }],
  ['hyp-v2-gzip-dict', ['id', 'text'], { codec: 'GZIP', encoding: 'RLE_DICTIONARY', rows: 500, page: 500 }],
  ['hyp-v2-gzip-delta_length_byte_array', ['id', 'url', 'text?'], { codec: 'GZIP', encoding: 'DELTA_LENGTH_BYTE_ARRAY', rows: 250, page: 8192 }],
  ['hyp-v2-zstd-plain', ['id', 'text?'], { codec: 'ZSTD', encoding: 'PLAIN', rows: 400, page: 16384 }],
]
if (small) {  // the same shapes for fewer documents: sizes in proportion, within sane floors
  for (const [, , o] of fixtures) {
    if (o.rows) o.rows = Math.max(4, Math.round(o.rows * n / 1900))
    if (o.page) o.page = Math.max(64, Math.round(o.page * n / 1900))
    if (o.dictLimit) o.dictLimit = Math.max(256, Math.round(o.dictLimit * n / 1900))
  }
}

// ---- Thrift compact protocol, each value read with its place, for relabelling in place ----
function varint(b, pos) {
  let value = 0n
  for (let shift = 0n; ; shift += 7n) {
    const byte = b[pos++]
    value |= BigInt(byte & 0x7f) << shift
    if (!(byte & 0x80)) return [value, pos]
  }
}
const unzigzag = z => (z >> 1n) ^ -(z & 1n)

// A struct's fields by id: { type, start, end, value } each (a struct's value: its fields; a
// list's: its elements; an integer's: a BigInt). Booleans in a struct live in the field header.
function readStruct(b, pos) {
  const start = pos
  const fields = {}
  let id = 0
  for (;;) {
    const header = b[pos++]
    const type = header & 0x0f
    if (type === 0) return { type: 12, start, end: pos, value: fields }
    if (header >> 4) id += header >> 4
    else { let z; [z, pos] = varint(b, pos); id = Number(unzigzag(z)) }
    const node = type === 1 || type === 2 ? { type, start: pos, end: pos, value: type === 1 } : readValue(b, pos, type)
    fields[id] = node
    pos = node.end
  }
}

function readValue(b, pos, type) {
  const start = pos
  let value
  switch (type) {
    case 1: case 2: value = b[pos++] === 1; break // a boolean element of a list
    case 3: value = BigInt(b[pos++]); break
    case 4: case 5: case 6: { let z; [z, pos] = varint(b, pos); value = unzigzag(z); break }
    case 7: pos += 8; break
    case 8: { let length; [length, pos] = varint(b, pos); value = b.subarray(pos, pos + Number(length)); pos += Number(length); break }
    case 9: case 10: {
      const header = b[pos++]
      let size = header >> 4
      if (size === 15) { let s; [s, pos] = varint(b, pos); size = Number(s) }
      value = []
      for (let i = 0; i < size; ++i) { const e = readValue(b, pos, header & 0x0f); value.push(e); pos = e.end }
      break
    }
    case 11: {
      let size; [size, pos] = varint(b, pos)
      value = []
      const kinds = size ? b[pos++] : 0
      for (let i = 0; i < Number(size); ++i) {
        const k = readValue(b, pos, kinds >> 4)
        const v = readValue(b, k.end, kinds & 0x0f)
        value.push([k, v])
        pos = v.end
      }
      break
    }
    case 12: return readStruct(b, pos)
    default: throw new Error(`thrift: unknown type ${type} at byte ${start}`)
  }
  return { type, start, end: pos, value }
}

// An i32 of one byte set to another small value, in place.
function setSmallInt(b, node, value) {
  if (node.end - node.start !== 1 || value < 0 || value > 63) throw new Error(`cannot set the value at byte ${node.start} in place`)
  b[node.start] = value * 2
}

// The text column's dictionary pages (PLAIN) and dictionary-indexed data pages
// (RLE_DICTIONARY) relabelled PLAIN_DICTIONARY, in the page headers, the chunk's encodings
// and its encoding_stats: a dictionary file as parquet-mr's v1 writer labels it.
const PLAIN = 0n
const PLAIN_DICTIONARY = 2
const RLE_DICTIONARY = 8n
function relabelPlainDictionary(bytes) {
  const b = Uint8Array.from(bytes)
  const footerLength = new DataView(b.buffer).getUint32(b.length - 8, true)
  const footer = readStruct(b, b.length - 8 - footerLength)
  let pages = 0
  for (const group of footer.value[4].value) { // FileMetaData.row_groups
    for (const chunk of group.value[1].value) { // RowGroup.columns
      const meta = chunk.value[3].value // ColumnChunk.meta_data
      if (meta[3].value.map(p => new TextDecoder().decode(p.value)).join('.') !== 'text') continue
      for (const e of meta[2].value) if (e.value === RLE_DICTIONARY) setSmallInt(b, e, PLAIN_DICTIONARY)
      for (const stats of meta[13]?.value ?? []) { // PageEncodingStats: page_type, encoding
        const encoding = stats.value[2]
        if (encoding.value === RLE_DICTIONARY || (stats.value[1].value === 2n && encoding.value === PLAIN)) setSmallInt(b, encoding, PLAIN_DICTIONARY)
      }
      let pos = Number((meta[11] ?? meta[9]).value) // dictionary_page_offset, else data_page_offset
      const end = pos + Number(meta[7].value) // total_compressed_size
      while (pos < end) {
        const header = readStruct(b, pos)
        const type = header.value[1].value
        if (type === 2n) setSmallInt(b, header.value[7].value[2], PLAIN_DICTIONARY) // DictionaryPageHeader.encoding
        if (type === 0n && header.value[5].value[2].value === RLE_DICTIONARY) setSmallInt(b, header.value[5].value[2], PLAIN_DICTIONARY)
        pos = header.end + Number(header.value[3].value) // compressed_page_size
        ++pages
      }
    }
  }
  if (!pages) throw new Error('relabel: no text column')
  return b
}

// ---- reading back ----
// The pages of one column chunk, walked from its first page's offset through
// total_compressed_size bytes.
// total_compressed_size bytes. Each page: its type, encoding, and where its compressed bytes
// lie (after a v2 page's levels, which are never compressed) with their size decompressed.
function chunkPages(bytes, meta) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const start = Number(meta.dictionary_page_offset ?? meta.data_page_offset)
  const end = start + Number(meta.total_compressed_size)
  const pages = []
  const reader = { view, offset: start }
  while (reader.offset < end) {
    const header = parquetHeader(reader)
    const v2 = header.data_page_header_v2
    const encoding = header.data_page_header?.encoding ?? v2?.encoding ?? header.dictionary_page_header?.encoding
    const levels = v2 ? v2.definition_levels_byte_length + v2.repetition_levels_byte_length : 0
    const compressed = !v2 || v2.is_compressed
    pages.push({ type: header.type, encoding, compressed, data: bytes.subarray(reader.offset + levels, reader.offset + header.compressed_page_size), size: header.uncompressed_page_size - levels })
    reader.offset += header.compressed_page_size
  }
  if (reader.offset !== end) throw new Error(`pages run to ${reader.offset}, the chunk ends at ${end}`)
  return pages
}

// Every ZSTD page of a file decompressed in one run of the tool: the frames concatenated
// decompress to their contents concatenated, cut at the headers' sizes.
function zstdAhead(bytes, metadata) {
  const pages = metadata.row_groups.flatMap(g => g.columns.filter(c => c.meta_data.codec === 'ZSTD').flatMap(c => chunkPages(bytes, c.meta_data)))
    .filter(p => p.compressed)
  if (!pages.length) return
  const all = zstd(['-d'], Buffer.concat(pages.map(p => p.data)))
  let at = 0
  for (const p of pages) {
    zstdPages.set(pageKey(p.data), all.subarray(at, at + p.size))
    at += p.size
  }
  if (at !== all.length) throw new Error(`ZSTD pages decompress to ${all.length} bytes, their headers say ${at}`)
}

// Page walk and metadata of a file; prints one line about its `column`.
function describe(name, bytes, column = 'text') {
  const metadata = parquetMetadata(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength))
  const leaf = metadata.schema.find(e => e.name === column && e.type)
  const codecs = new Set()
  const encodings = new Set()
  const pageTypes = new Set()
  const dataEncodings = new Set()
  const pagesPerGroup = []
  for (const group of metadata.row_groups) {
    const chunk = group.columns.find(c => c.meta_data.path_in_schema.join('.') === column)
      ?? group.columns.find(c => c.meta_data.path_in_schema[0] === column)
    codecs.add(chunk.meta_data.codec)
    for (const e of chunk.meta_data.encodings) encodings.add(e)
    const pages = chunkPages(bytes, chunk.meta_data)
    for (const p of pages) {
      pageTypes.add(p.type === 'DICTIONARY_PAGE' ? `DICTIONARY_PAGE(${p.encoding})` : p.type)
      if (p.type !== 'DICTIONARY_PAGE') dataEncodings.add(p.encoding)
    }
    pagesPerGroup.push(pages.length)
  }
  const writer = (metadata.created_by ?? '?').split(' ')[0]
  const columns = metadata.schema.slice(1).filter(e => e.num_children === undefined || e.name === column).map(e => e.name).join(',')
  const pagesText = Math.min(...pagesPerGroup) === Math.max(...pagesPerGroup) ? `${pagesPerGroup[0]}` : `${Math.min(...pagesPerGroup)}-${Math.max(...pagesPerGroup)}`
  console.log(`${name.padEnd(52)} ${writer.padEnd(16)} ${[...codecs].join('+').padEnd(12)} ${[...pageTypes].join('+').padEnd(46)} ` +
    `${[...dataEncodings].join('+').padEnd(40)} ${(leaf?.repetition_type ?? 'nested').padEnd(8)} ${metadata.row_groups.length} row groups x ${pagesText} pages  [${columns}]`)
  return { metadata, codecs, pageTypes, dataEncodings, pagesPerGroup, leaf }
}

function fail(name, message) {
  throw new Error(`${name}: ${message}`)
}

// What the name WRITER-PAGES-CODEC-ENCODING[-extra] promises, checked against the pages.
function checkPromises(name, d) {
  const [writer, pages, codec, encoding, extra] = name.split('-')
  const codecName = { none: 'UNCOMPRESSED', snappy: 'SNAPPY', gzip: 'GZIP', zstd: 'ZSTD' }[codec]
  if (d.codecs.size !== 1 || !d.codecs.has(codecName)) fail(name, `codec ${[...d.codecs]}, expected ${codecName}`)
  const dataPage = pages === 'v1' ? 'DATA_PAGE' : 'DATA_PAGE_V2'
  const dict = encoding.startsWith('dict') || encoding === 'plain_dictionary'
  const dictionaryPage = `DICTIONARY_PAGE(${encoding === 'plain_dictionary' ? 'PLAIN_DICTIONARY' : 'PLAIN'})`
  for (const t of d.pageTypes) if (t !== dataPage && t !== dictionaryPage) fail(name, `a ${t} page`)
  if (!d.pageTypes.has(dataPage)) fail(name, `no ${dataPage} page`)
  if (d.pageTypes.has(dictionaryPage) !== dict) fail(name, dict ? 'no dictionary page' : 'a dictionary page')
  const expected = new Set()
  if (dict) {
    expected.add(encoding === 'plain_dictionary' ? 'PLAIN_DICTIONARY' : 'RLE_DICTIONARY')
    if (encoding.startsWith('dict_fallback_')) expected.add(encoding.slice('dict_fallback_'.length).toUpperCase())
  } else {
    expected.add(encoding.toUpperCase())
  }
  if ([...expected].sort().join() !== [...d.dataEncodings].sort().join()) {
    fail(name, `data page encodings ${[...d.dataEncodings]}, expected ${[...expected]}`)
  }
  // Several row groups, each but the last (the rows left over) of several pages. parquet-wasm
  // writes the dictionary indices of an optional column's chunk as one data page, whatever
  // the page size limit; hyparquet-writer splits them.
  if (small) return
  const onePage = extra === 'one_page'
  if (onePage && (d.metadata.row_groups.length !== 1 || d.pagesPerGroup[0] !== 1)) fail(name, 'expected one row group of one page')
  if (!onePage && (d.metadata.row_groups.length < 2 || Math.min(...d.pagesPerGroup.slice(0, -1)) < (dict && writer === 'hyp' ? 3 : 2))) {
    fail(name, `${d.metadata.row_groups.length} row groups of ${d.pagesPerGroup} pages: expected several of several`)
  }
}

async function readBack(name, bytes, expectedTexts, column = 'text') {
  const file = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength)
  zstdAhead(bytes, parquetMetadata(file))
  const rows = await parquetReadObjects({ file, compressors: decompressors })
  zstdPages.clear()
  if (rows.length !== expectedTexts.length) fail(name, `${rows.length} rows, expected ${expectedTexts.length}`)
  let id = 0
  for (let i = 0; i < rows.length; ++i) {
    const got = rows[i][column]
    if (got !== expectedTexts[i]) fail(name, `row ${i}: ${JSON.stringify(got)?.slice(0, 80)}, expected ${JSON.stringify(expectedTexts[i])?.slice(0, 80)}`)
    if ('id' in rows[i]) {
      if (expectedTexts[i] === null) continue
      if (Number(rows[i].id) !== id) fail(name, `row ${i}: id ${rows[i].id}, expected ${id}`)
      if ('url' in rows[i] && rows[i].url !== urls[id]) fail(name, `row ${i}: url ${rows[i].url}`)
      ++id
    }
  }
}

function save(relative, bytes) {
  fs.writeFileSync(path.join(outDir, relative), bytes)
}

console.log(`${'file'.padEnd(52)} ${'writer'.padEnd(16)} ${'codec'.padEnd(12)} ${'page types (text)'.padEnd(46)} ${'data page encodings (text)'.padEnd(40)} text`)
for (const [name, columns, o] of fixtures) {
  const bytes = name.startsWith('wasm-') ? writeWasm(columns, o) : writeHyp(columns, o)
  const d = describe(name, bytes)
  checkPromises(name, d)
  await readBack(name, bytes, texts)
  save(`${name}.parquet`, bytes)
}
fs.writeFileSync(path.join(outDir, 'fixtures.txt'), fixtures.map(([name]) => `${name}.parquet\n`).join(''))
fs.writeFileSync(path.join(outDir, 'texts.jsonl'), texts.map(text => `${JSON.stringify({ text })}\n`).join(''))

// The files of bad rows (nulls, invalid-utf8): hyparquet-writer, an INT32 id and the text
// column given, PLAIN in SNAPPY, row groups of 16 rows, then 600, so that a bad row early in
// the documents lies in row group 0 and a later one in row group 1.
function writeBadRows(ids, text) {
  return parquetWriteBuffer({
    columnData: [
      { name: 'id', data: ids, type: 'INT32', nullable: false, encoding: 'PLAIN' },
      { name: 'text', encoding: 'PLAIN', ...text },
    ],
    codec: 'SNAPPY',
    rowGroupSize: [16, 600],
    pageSize: 8192,
    createdBy: 'hyparquet-writer',
  })
}

// nulls: null rows inserted before documents 7 and 20, so rows 7 and 21 of the file; the first
// row group 16 rows (row 7 in row group 0), then 600 (row 21 is row 5 of row group 1).
{
  const withNulls = [...texts.slice(0, 7), null, ...texts.slice(7, 20), null, ...texts.slice(20)]
  let id = 0
  const ids = Int32Array.from(withNulls, t => (t === null ? -1 : id++))
  const buffer = writeBadRows(ids, { data: withNulls, type: 'STRING', nullable: true })
  const bytes = new Uint8Array(buffer)
  const d = describe('nulls', bytes)
  const rows = await parquetReadObjects({ file: buffer })
  if (rows.length !== n + 2 || rows[7].text !== null || rows[21].text !== null || rows.filter(r => r.text === null).length !== 2) fail('nulls', 'null rows misplaced')
  if (d.metadata.row_groups[0].num_rows !== 16n && d.metadata.row_groups[0].num_rows !== 16) fail('nulls', 'row group 0 is not 16 rows')
  await readBack('nulls', bytes, withNulls)
  save('nulls.parquet', bytes)
  fs.writeFileSync(path.join(outDir, 'nulls.jsonl'), withNulls.map(text => `${JSON.stringify({ text })}\n`).join(''))
}

// invalid-utf8: the documents with document 3 replaced by bytes that are not UTF-8 ("a", 0xff,
// "b"), in a BYTE_ARRAY column; row groups of 16 rows, then 600 (row 3 of row group 0), and
// invalid-utf8.jsonl: the same records with those raw bytes inside the JSON string.
{
  const encoder = new TextEncoder()
  const invalid = Uint8Array.from([0x61, 0xff, 0x62])
  const values = texts.map((t, i) => (i === 3 ? invalid : encoder.encode(t)))
  const buffer = writeBadRows(Int32Array.from(texts, (_, i) => i), { data: values, type: 'BYTE_ARRAY', nullable: false })
  const bytes = new Uint8Array(buffer)
  describe('invalid-utf8', bytes)
  const rows = await parquetReadObjects({ file: buffer, utf8: false })
  const third = rows[3].text
  if (!(third instanceof Uint8Array) || Buffer.compare(Buffer.from(third), Buffer.from(invalid)) !== 0) fail('invalid-utf8', 'row 3 is not the invalid bytes')
  save('invalid-utf8.parquet', bytes)
  const lines = texts.map((text, i) => (i === 3 ? Buffer.concat([Buffer.from('{"text": "'), Buffer.from(invalid), Buffer.from('"}\n')]) : Buffer.from(`${JSON.stringify({ text })}\n`)))
  fs.writeFileSync(path.join(outDir, 'invalid-utf8.jsonl'), Buffer.concat(lines))
}

// body-column: columns id, body; no `text`.
{
  const bytes = writeWasm(['id', 'body'], { version: 1, codec: 'SNAPPY', encoding: 'PLAIN', rows: 400, page: 8192 })
  describe('body-column', bytes, 'body')
  await readBack('body-column', bytes, texts, 'body')
  save('body-column.parquet', bytes)
}

// Refused: codecs outside the reader's (UNCOMPRESSED, SNAPPY, GZIP, ZSTD) and a nested `text`.
for (const [name, codec] of [['lz4_raw', 'LZ4_RAW'], ['lz4', 'LZ4'], ['brotli', 'BROTLI']]) {
  const bytes = writeWasm(['id', 'text'], { version: 1, codec, encoding: 'PLAIN', rows: 400, page: 8192 })
  const d = describe(`unsupported/${name}`, bytes)
  if (!d.codecs.has(codec)) fail(name, `codec ${[...d.codecs]}, expected ${codec}`)
  save(`unsupported/${name}.parquet`, bytes)
}
for (const [name, column] of [['nested-list', 'text:list'], ['nested-struct', 'text:struct']]) {
  const bytes = writeWasm(['id', column], { version: 1, codec: 'SNAPPY', encoding: 'PLAIN', rows: 400, page: 8192 })
  const d = describe(`unsupported/${name}`, bytes)
  const top = d.metadata.schema.find(e => e.name === 'text')
  if (!top || top.num_children === undefined) fail(name, '`text` is not a group')
  const rows = await parquetReadObjects({ file: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) })
  const got = rows.map(r => (Array.isArray(r.text) ? r.text[0] : r.text.value))
  if (got.some((t, i) => t !== texts[i])) fail(name, 'does not read back to the documents')
  save(`unsupported/${name}.parquet`, bytes)
}
console.log(`make_parquet_fixtures: ${fixtures.length} files of the ${n} documents, nulls, invalid-utf8, body-column and 5 unsupported files in ${outDir}`)

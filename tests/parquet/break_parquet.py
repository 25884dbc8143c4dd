#!/usr/bin/env python3
"""Hostile Parquet files for the tests of `llmtrain prepare`, each broken in one way.

usage: break_parquet.py SRC_DIR OUT_DIR

SRC_DIR holds the files of make_parquet_fixtures.mjs. Each variant is a copy of one of them
with one thing changed; integers inside Thrift structures (page headers, the footer) are
patched in place: the compact protocol is parsed with each value's byte offset and length
kept, and the new value is written as a varint of the same length (non-minimal continuation
bytes where it is smaller), so that nothing else in the file moves.

  truncated-footer.parquet               hyp-v2-snappy-dict: the last 20 bytes of the footer
                                         metadata cut out, its length field lowered to match,
                                         so the metadata ends before its last fields and stop
  footer-length-past-start.parquet       wasm-v1-none-plain: the footer length larger than the
                                         file
  wrong-magic-head.parquet               wasm-v2-zstd-plain: the first 4 bytes PAR0
  wrong-magic-tail.parquet               wasm-v2-zstd-plain: the last 4 bytes PAR0
  page-past-chunk.parquet                wasm-v1-none-plain (uncompressed; text first, then
                                         id): the first text data page's compressed (and
                                         uncompressed) size run 1000 bytes past the end of its
                                         column chunk, into the id chunk, inside the file
  dictionary-index-out-of-range.parquet  wasm-v1-snappy-dict: row group 0's text dictionary
                                         page says 1 value, so the data pages' indices exceed it
  definition-level-past-max.parquet      hyp-v2-none-delta_byte_array (optional text, v2 pages,
                                         levels uncompressed): the value of the first RLE run
                                         of the first text page's definition levels set to 3
                                         (the maximum definition level is 1)
  decompressed-size-lies.parquet         wasm-v2-zstd-plain: the first text data page's
                                         uncompressed_page_size halved
  decompressed-size-lies-gzip.parquet    hyp-v2-gzip-delta_length_byte_array: the first text
                                         data page's uncompressed_page_size + 1000

The files with codecs the reader refuses and with a nested `text` are written by
make_parquet_fixtures.mjs, in its unsupported/ folder.
"""
import os
import struct
import sys

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = range(4)


class Value:
    """A Thrift value and where it lies: data[start:end]. A struct's value is a dict of its
    fields by id, a list's a list of Values, an integer's an int, a binary's bytes."""

    def __init__(self, kind, start, end, value):
        self.kind, self.start, self.end, self.value = kind, start, end, value

    def __getitem__(self, field_id):
        return self.value[field_id]

    def get(self, field_id):
        return self.value.get(field_id)


def read_varint(data, pos):
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("thrift: varint runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def unzigzag(z):
    return (z >> 1) ^ -(z & 1)


def read_struct(data, pos):
    start, fields, field_id = pos, {}, 0
    while True:
        header = data[pos]
        pos += 1
        kind = header & 0x0F
        if kind == STOP:
            return Value(STRUCT, start, pos, fields)
        if header >> 4:
            field_id += header >> 4
        else:
            z, pos = read_varint(data, pos)
            field_id = unzigzag(z)
        if kind in (TRUE, FALSE):  # a struct's booleans live in the field header
            node = Value(kind, pos, pos, kind == TRUE)
        else:
            node = read_value(data, pos, kind)
        fields[field_id] = node
        pos = node.end


def read_value(data, pos, kind):
    start = pos
    if kind in (TRUE, FALSE):  # a boolean element of a list: one byte
        return Value(kind, start, pos + 1, data[pos] == 1)
    if kind == BYTE:
        return Value(kind, start, pos + 1, data[pos])
    if kind in (I16, I32, I64):
        z, pos = read_varint(data, pos)
        return Value(kind, start, pos, unzigzag(z))
    if kind == DOUBLE:
        return Value(kind, start, pos + 8, struct.unpack_from("<d", data, pos)[0])
    if kind == BINARY:
        length, pos = read_varint(data, pos)
        return Value(kind, start, pos + length, bytes(data[pos:pos + length]))
    if kind in (LIST, SET):
        header = data[pos]
        pos += 1
        size = header >> 4
        if size == 15:
            size, pos = read_varint(data, pos)
        items = []
        for _ in range(size):
            item = read_value(data, pos, header & 0x0F)
            items.append(item)
            pos = item.end
        return Value(kind, start, pos, items)
    if kind == MAP:
        size, pos = read_varint(data, pos)
        kinds = data[pos] if size else 0
        pos += 1 if size else 0
        items = []
        for _ in range(size):
            key = read_value(data, pos, kinds >> 4)
            value = read_value(data, key.end, kinds & 0x0F)
            items.append((key, value))
            pos = value.end
        return Value(kind, start, pos, items)
    if kind == STRUCT:
        return read_struct(data, pos)
    raise ValueError(f"thrift: unknown type {kind} at byte {start}")


def set_int(data, node, value, what):
    """Writes an integer over `node` in place: a zigzag varint of the same byte length."""
    length = node.end - node.start
    z = (value << 1) ^ (value >> 63)
    if node.kind not in (I16, I32, I64) or z >= 1 << (7 * length):
        raise ValueError(f"{what}: {value} does not fit the {length} byte(s) at {node.start}")
    encoded = bytes(((z >> (7 * i)) & 0x7F) | (0x80 if i < length - 1 else 0) for i in range(length))
    old = node.value
    data[node.start:node.end] = encoded
    print(f"    {what}: {old} -> {value} at byte {node.start} ({length}-byte varint {encoded.hex()})")


def footer(data):
    length = struct.unpack_from("<I", data, len(data) - 8)[0]
    start = len(data) - 8 - length
    return start, length, read_struct(data, start)


def column_chunks(data, name):
    """(row group index, ColumnMetaData) of the column `name` in each row group."""
    _, _, meta = footer(data)
    for g, group in enumerate(meta[4].value):  # FileMetaData.row_groups
        for chunk in group[1].value:  # RowGroup.columns
            column = chunk[3]  # ColumnChunk.meta_data
            if ".".join(p.value.decode() for p in column[3].value) == name:  # path_in_schema
                yield g, column


def chunk_pages(data, column):
    """(header, start of the page's data) for each page of a column chunk."""
    pos = (column.get(11) or column[9]).value  # dictionary_page_offset, else data_page_offset
    end = pos + column[7].value  # total_compressed_size
    while pos < end:
        header = read_struct(data, pos)
        yield header, header.end
        pos = header.end + header[3].value  # compressed_page_size


def first_text_chunk(data):
    return next(column_chunks(data, "text"))[1]


def first_data_page(data, column):
    for header, body in chunk_pages(data, column):
        if header[1].value in (DATA_PAGE, DATA_PAGE_V2):
            return header, body
    raise ValueError("no data page")


def truncated_footer(data):
    start, length, _ = footer(data)
    cut = 20
    out = data[:start + length - cut] + struct.pack("<I", length - cut) + b"PAR1"
    print(f"    footer metadata at bytes {start}..{start + length}: its last {cut} bytes cut out; "
          f"length field {length} -> {length - cut}")
    return out


def footer_length_past_start(data):
    _, length, _ = footer(data)
    new = len(data) + 1000
    data[len(data) - 8:len(data) - 4] = struct.pack("<I", new)
    print(f"    footer length field at byte {len(data) - 8}: {length} -> {new} (the file is {len(data)} bytes)")
    return data


def wrong_magic(at_head):
    def patch(data):
        pos = 0 if at_head else len(data) - 4
        print(f"    magic at byte {pos}: {bytes(data[pos:pos + 4])} -> b'PAR0'")
        data[pos:pos + 4] = b"PAR0"
        return data
    return patch


def page_past_chunk(data):
    column = first_text_chunk(data)
    chunk_end = (column.get(11) or column[9]).value + column[7].value
    header, body = first_data_page(data, column)
    if header[2].value != header[3].value:
        raise ValueError("expected an uncompressed page")
    new = chunk_end - body + 1000
    if body + new > len(data):
        raise ValueError("expected a page end inside the file")
    print(f"    first text data page at byte {header.start}, its data {body}..{body + header[3].value}; "
          f"the chunk ends at {chunk_end}, the file at {len(data)}")
    set_int(data, header[3], new, "compressed_page_size")
    set_int(data, header[2], new, "uncompressed_page_size")
    return data


def dictionary_index_out_of_range(data):
    column = first_text_chunk(data)
    header, _ = next(chunk_pages(data, column))
    if header[1].value != DICTIONARY_PAGE:
        raise ValueError("expected a dictionary page first")
    set_int(data, header[7][1], 1, f"dictionary page at byte {header.start}: num_values")  # DictionaryPageHeader.num_values
    return data


def definition_level_past_max(data):
    column = first_text_chunk(data)
    header, body = first_data_page(data, column)
    if header[1].value != DATA_PAGE_V2:
        raise ValueError("expected a v2 data page (uncompressed levels)")
    v2 = header[8]
    rep_len, def_len = v2[6].value, v2[5].value
    pos, end = body + rep_len, body + rep_len + def_len  # repetition levels, then definition levels
    while pos < end:  # RLE / bit-packed hybrid, bit width 1
        run_header, value_pos = read_varint(data, pos)
        if run_header & 1 == 0:  # an RLE run: its count, then the value in one byte
            print(f"    first text data page (v2) at byte {header.start}: definition levels at {pos}..{end}, "
                  f"an RLE run of {run_header >> 1} x {data[value_pos]}: its value byte at {value_pos} -> 3")
            data[value_pos] = 3
            return data
        pos = value_pos + (run_header >> 1)  # bit-packed: groups of 8 values, 1 byte each at width 1
    raise ValueError("no RLE run in the definition levels")


def decompressed_size(change):
    def patch(data):
        column = first_text_chunk(data)
        header, _ = first_data_page(data, column)
        old = header[2].value
        codec = column[4].value  # 1 SNAPPY, 2 GZIP, 6 ZSTD
        print(f"    first text data page at byte {header.start}, codec {codec}")
        set_int(data, header[2], change(old), "uncompressed_page_size")
        return data
    return patch


VARIANTS = [
    ("truncated-footer.parquet", "hyp-v2-snappy-dict.parquet", truncated_footer),
    ("footer-length-past-start.parquet", "wasm-v1-none-plain.parquet", footer_length_past_start),
    ("wrong-magic-head.parquet", "wasm-v2-zstd-plain.parquet", wrong_magic(True)),
    ("wrong-magic-tail.parquet", "wasm-v2-zstd-plain.parquet", wrong_magic(False)),
    ("page-past-chunk.parquet", "wasm-v1-none-plain.parquet", page_past_chunk),
    ("dictionary-index-out-of-range.parquet", "wasm-v1-snappy-dict.parquet", dictionary_index_out_of_range),
    ("definition-level-past-max.parquet", "hyp-v2-none-delta_byte_array.parquet", definition_level_past_max),
    ("decompressed-size-lies.parquet", "wasm-v2-zstd-plain.parquet", decompressed_size(lambda size: size // 2)),
    ("decompressed-size-lies-gzip.parquet", "hyp-v2-gzip-delta_length_byte_array.parquet", decompressed_size(lambda size: size + 1000)),
]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: break_parquet.py SRC_DIR OUT_DIR")
    src, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    for name, source, patch in VARIANTS:
        with open(os.path.join(src, source), "rb") as f:
            data = bytearray(f.read())
        if data[:4] != b"PAR1" or data[-4:] != b"PAR1":
            sys.exit(f"break_parquet: {source} is not a Parquet file")
        print(f"{name} (from {source}):")
        broken = patch(data)
        with open(os.path.join(out, name), "wb") as f:
            f.write(broken)
    print(f"break_parquet: {len(VARIANTS)} files in {out}")


if __name__ == "__main__":
    main()

// Writes the "text" of each line of a JSONL file into a Parquet file laid out as a web-text
// corpus is: a string column "text" beside an int64 "id", ROWS rows per row group, data
// pages v1, the codec given (default SNAPPY), dictionary encoding left to the writer (it falls
// back to PLAIN when the texts do not repeat). Writer: parquet-wasm (the Rust parquet crate).
//
// usage: node scripts/prepare-bench/jsonl-to-parquet.mjs IN.jsonl OUT.parquet [ROWS] [CODEC]
import { readFileSync, writeFileSync } from 'node:fs';
import * as arrow from 'apache-arrow';
import * as parquet from 'parquet-wasm/node';

const [input, output, rowsArg = '10000', codecArg = 'SNAPPY'] = process.argv.slice(2);
if (!input || !output) {
    console.error('usage: jsonl-to-parquet.mjs IN.jsonl OUT.parquet [ROWS_PER_ROW_GROUP] [CODEC]');
    process.exit(2);
}
const codec = parquet.Compression[codecArg];
if (codec === undefined) {
    console.error(`jsonl-to-parquet: no codec '${codecArg}' (${Object.keys(parquet.Compression).filter((k) => isNaN(k)).join(', ')})`);
    process.exit(2);
}
const texts = readFileSync(input, 'utf8').split('\n').filter((line) => line.length > 0).map((line) => JSON.parse(line).text);
const table = arrow.tableFromArrays({ id: BigInt64Array.from(texts, (_, i) => BigInt(i)), text: texts });
const properties = new parquet.WriterPropertiesBuilder()
    .setCompression(codec)
    .setMaxRowGroupSize(Number(rowsArg))
    .build();
writeFileSync(output, parquet.writeParquet(parquet.Table.fromIPCStream(arrow.tableToIPC(table, 'stream')), properties));
console.log(`jsonl-to-parquet: ${texts.length} texts -> ${output} (${codecArg}, ${rowsArg} rows per row group)`);

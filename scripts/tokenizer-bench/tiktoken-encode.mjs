// Times tiktoken (the npm package: Rust compiled to WebAssembly, one thread) encoding a file,
// and optionally writes the ids. Special tokens in the text are encoded as such, as llmtrain
// does with added tokens.
//
// usage: node tiktoken-encode.mjs ENCODING FILE [IDS_OUT]
// prints: tiktoken ENCODING: BYTES bytes, TOKENS tokens, SECONDS s, MB/s
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [encoding, file, idsOut] = process.argv.slice(2);
if (!encoding || !file) {
  console.error("usage: node tiktoken-encode.mjs ENCODING FILE [IDS_OUT]");
  process.exit(2);
}
const require = createRequire(path.join(process.cwd(), "noop.js"));
const searchPaths = [...(process.env.NODE_PATH ?? "").split(":").filter(Boolean), path.join(path.dirname(new URL(import.meta.url).pathname), "../../node_modules")];
const { get_encoding } = require(require.resolve("tiktoken", { paths: searchPaths }));
const bytes = readFileSync(file);
const text = bytes.toString("utf8");
const enc = get_encoding(encoding);
enc.encode("warm up the WebAssembly module", "all");
const start = process.hrtime.bigint();
const ids = enc.encode(text, "all");
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
enc.free();
if (idsOut) writeFileSync(idsOut, Array.from(ids).join(" ") + "\n");
console.log(`tiktoken ${encoding}: ${bytes.length} bytes, ${ids.length} tokens, ${seconds.toFixed(3)} s, ${(bytes.length / 1e6 / seconds).toFixed(2)} MB/s`);

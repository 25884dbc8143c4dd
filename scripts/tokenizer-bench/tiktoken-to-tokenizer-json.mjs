// Writes a Hugging Face tokenizer.json holding the vocabulary of one of tiktoken's encodings
// (the npm package `tiktoken` ships their ranks), so llmtrain and tiktoken can be run on the
// same vocabulary. gpt2 is GPT-2's own tokenizer; cl100k_base is the vocabulary and split
// pattern that Llama 3 extends (Llama 3 = cl100k_base + 28k tokens, ignore_merges = true).
//
// tiktoken stores ranks only: a token's rank is its id, and BPE merges the adjacent pair whose
// concatenation has the lowest rank. The merge list is recovered one per token, in rank
// order: the two parts that BPE over the token's own bytes, restricted to lower ranks, stops
// at (for GPT-2 this is exactly its vocab.bpe).
//
// usage: node tiktoken-to-tokenizer-json.mjs ENCODING OUTPUT   (ENCODING: gpt2 | cl100k_base)
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [encoding, output] = process.argv.slice(2);
if (!encoding || !output) {
  console.error("usage: node tiktoken-to-tokenizer-json.mjs gpt2|cl100k_base OUTPUT");
  process.exit(2);
}
const require = createRequire(path.join(process.cwd(), "noop.js"));
const searchPaths = [...(process.env.NODE_PATH ?? "").split(":").filter(Boolean), path.join(path.dirname(new URL(import.meta.url).pathname), "../../node_modules")];
const spec = JSON.parse(readFileSync(require.resolve(`tiktoken/encoders/${encoding}.json`, { paths: searchPaths }), "utf8"));

// "<ignored> <first rank> <base64 token> <base64 token> ..." per line; ranks run on.
const tokens = [];  // rank -> bytes as a latin1 string
for (const line of spec.bpe_ranks.split("\n")) {
  const [, first, ...encoded] = line.split(" ");
  if (first === undefined) continue;
  encoded.forEach((b64, i) => { tokens[Number(first) + i] = Buffer.from(b64, "base64").toString("latin1"); });
}
const rankOf = new Map(tokens.map((t, rank) => [t, rank]));

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest map to U+0100 on.
const byteChar = [];
for (let b = 0, extra = 256; b < 256; b++) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  byteChar[b] = String.fromCodePoint(printable ? b : extra++);
}
const byteLevel = (latin1) => Array.from(latin1, (c) => byteChar[c.charCodeAt(0)]).join("");

// tiktoken's merge loop over `bytes`, allowing only tokens ranked below `limit`.
function bpeParts(bytes, limit) {
  const parts = Array.from(bytes);
  for (;;) {
    let best = -1, bestRank = limit;
    for (let i = 0; i + 1 < parts.length; i++) {
      const rank = rankOf.get(parts[i] + parts[i + 1]);
      if (rank !== undefined && rank < bestRank) { best = i; bestRank = rank; }
    }
    if (best < 0) return parts;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
  }
}

const vocab = {};
const merges = [];
tokens.forEach((bytes, rank) => {
  if (bytes === undefined) return;
  vocab[byteLevel(bytes)] = rank;
  if (bytes.length < 2) return;
  const parts = bpeParts(bytes, rank);
  if (parts.length !== 2) throw new Error(`token ${rank} does not split into two lower-ranked tokens`);
  merges.push(`${byteLevel(parts[0])} ${byteLevel(parts[1])}`);
});
const added = Object.entries(spec.special_tokens).map(([content, id]) =>
  ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
const byteLevelStep = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
const tokenizer = {
  version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: spec.pat_str }, behavior: "Isolated", invert: false }, byteLevelStep] },
  post_processor: null, decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: encoding !== "gpt2", vocab, merges },
};
writeFileSync(output, JSON.stringify(tokenizer));
console.log(`${encoding}: ${Object.keys(vocab).length} tokens, ${merges.length} merges, ${added.length} special -> ${output}`);

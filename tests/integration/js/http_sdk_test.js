// The official SDKs against the frontend's HTTP API ($MOE_HTTP, started by http_sdk_test.py):
// `openai` (chat, streaming, completions, models, a 404) and `@anthropic-ai/sdk` (messages,
// streaming). With $MOE_SCRIPTED_MODEL (a model whose greedy output is a Hermes tool call), the
// tool-call round trip through both SDKs.
'use strict';
const assert = require('node:assert/strict');
const {OpenAI, NotFoundError} = require('openai');
const {Anthropic} = require('@anthropic-ai/sdk');

const baseURL = process.env.MOE_HTTP;  // http://127.0.0.1:PORT
const model = process.env.MOE_MODEL;
const openai = new OpenAI({baseURL: baseURL + '/v1', apiKey: 'unused', maxRetries: 0});
const anthropic = new Anthropic({baseURL, apiKey: 'unused', maxRetries: 0});
// Lengths are exact on random weights.
const extra = {ignore_eos: true};

async function openaiBasics() {
  const list = await openai.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);

  const chat = await openai.chat.completions.create({
    model,
    messages: [{role: 'user', content: 'Hello'}],
    max_tokens: 5,
    temperature: 0,
    ...extra
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].finish_reason, 'length');
  assert.equal(chat.usage.completion_tokens, 5);

  const stream = await openai.chat.completions.create({
    model,
    messages: [{role: 'user', content: 'Hello'}],
    max_tokens: 5,
    temperature: 0,
    stream: true,
    stream_options: {include_usage: true},
    ...extra
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 5);
  assert.equal(text, chat.choices[0].message.content);  // greedy: the same text

  const cmpl = await openai.completions.create(
      {model, prompt: 'Once upon', max_tokens: 4, temperature: 0, ...extra});
  assert.equal(cmpl.object, 'text_completion');
  assert.equal(cmpl.usage.completion_tokens, 4);

  await assert.rejects(
      openai.chat.completions.create(
          {model: 'no-such-model', messages: [{role: 'user', content: 'x'}]}),
      (e) => e instanceof NotFoundError && e.status === 404 && /no-such-model/.test(e.message));
}

async function anthropicBasics() {
  const msg = await anthropic.messages.create({
    model,
    max_tokens: 5,
    system: 'Be brief.',
    messages: [{role: 'user', content: 'Hello'}],
    temperature: 0,
    ...extra
  });
  assert.equal(msg.type, 'message');
  assert.equal(msg.stop_reason, 'max_tokens');
  assert.equal(msg.usage.output_tokens, 5);

  const stream = anthropic.messages.stream({
    model,
    max_tokens: 5,
    system: 'Be brief.',
    messages: [{role: 'user', content: 'Hello'}],
    temperature: 0,
    ...extra
  });
  let text = '';
  stream.on('text', (t) => {
    text += t;
  });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 5);
  assert.ok(final.usage.input_tokens > 0);
  const whole = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(text, whole);
}

// The scripted model answers every chat with
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
async function toolRoundTrip(scripted) {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: {type: 'object', properties: {city: {type: 'string'}}, required: ['city']}
    }
  }];
  const messages = [{role: 'user', content: 'Weather in Paris?'}];
  const r = await openai.chat.completions.create(
      {model: scripted, messages, tools, temperature: 0, max_tokens: 64});
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(r));
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), {city: 'Paris'});
  assert.match(call.id, /^call_/);

  // Streamed: one delta per call.
  const stream = await openai.chat.completions.create(
      {model: scripted, messages, tools, temperature: 0, max_tokens: 64, stream: true});
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    for (const tc of c.delta.tool_calls ?? []) calls.push(tc);
    finish = c.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_weather');

  // The round trip: the call and its result go back as turns, rendered by Qwen3's template
  // (the assistant's <tool_call> and the result's <tool_response>), so the prompt grows by them.
  // The scripted model then calls again: its answer does not depend on the prompt.
  const r2 = await openai.chat.completions.create({
    model: scripted,
    tools,
    temperature: 0,
    max_tokens: 64,
    messages: [
      ...messages, choice.message,
      {role: 'tool', tool_call_id: call.id, content: '{"temp_c": 18}'}
    ]
  });
  assert.equal(r2.choices[0].finish_reason, 'tool_calls');
  assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens + 20,
            `the call and its result were rendered: ${r.usage.prompt_tokens} -> ` +
            `${r2.usage.prompt_tokens} prompt tokens`);
  // The tools themselves are rendered into Qwen3's system prompt.
  const bare = await openai.chat.completions.create(
      {model: scripted, messages, temperature: 0, max_tokens: 64});
  assert.ok(r.usage.prompt_tokens > bare.usage.prompt_tokens + 20,
            `tools rendered: ${bare.usage.prompt_tokens} -> ${r.usage.prompt_tokens}`);

  const atools = [{
    name: 'get_weather',
    description: 'Weather of a city',
    input_schema: tools[0].function.parameters
  }];
  const m = await anthropic.messages.create({
    model: scripted,
    max_tokens: 64,
    temperature: 0,
    tools: atools,
    messages: [{role: 'user', content: 'Weather in Paris?'}]
  });
  assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, {city: 'Paris'});
  const s = anthropic.messages.stream({
    model: scripted,
    max_tokens: 64,
    temperature: 0,
    tools: atools,
    messages: [{role: 'user', content: 'Weather in Paris?'}]
  });
  const sf = await s.finalMessage();
  assert.equal(sf.stop_reason, 'tool_use');
  assert.deepEqual(sf.content.find((b) => b.type === 'tool_use').input, {city: 'Paris'});
  console.log('tool calls parsed (openai, anthropic; whole and streamed): ok');
  const m2 = await anthropic.messages.create({
    model: scripted,
    max_tokens: 64,
    temperature: 0,
    tools: atools,
    messages: [
      {role: 'user', content: 'Weather in Paris?'}, {role: 'assistant', content: m.content},
      {role: 'user', content: [{type: 'tool_result', tool_use_id: use.id, content: '18 C'}]}
    ]
  });
  assert.equal(m2.stop_reason, 'tool_use');
  // Prompt sizes: input_tokens leaves out the prefix the cache already held (m's prompt).
  const size = (u) => u.input_tokens + u.cache_read_input_tokens;
  assert.ok(size(m2.usage) > size(m.usage) + 20,
            `tool_use and tool_result rendered: ${size(m.usage)} -> ${size(m2.usage)}`);
  console.log('tool round trip (openai, anthropic): ok');
}

async function main() {
  await openaiBasics();
  await anthropicBasics();
  if (process.env.MOE_SCRIPTED_MODEL) await toolRoundTrip(process.env.MOE_SCRIPTED_MODEL);
  console.log('http sdk: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

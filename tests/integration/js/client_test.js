// JavaScript client test (@grpc/grpc-js + @grpc/proto-loader): streams a generation from the
// frontend at $MOE_FRONTEND and checks its tokens against $MOE_EXPECTED (the offline engine's),
// then checks a cancelled call and a bad request. Started by js_test.py with a running cluster.
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const protoDir = path.join(process.env.MOE_SOURCE_DIR, 'proto');
const def = protoLoader.loadSync('moe/v1/moe.proto', {
  includeDirs: [protoDir], keepCase: true, longs: Number, enums: String, defaults: true,
});
const moe = grpc.loadPackageDefinition(def).moe.v1;
const client = new moe.Inference(process.env.MOE_FRONTEND, grpc.credentials.createInsecure());
const model = process.env.MOE_MODEL;
const prompt = JSON.parse(process.env.MOE_PROMPT);
const expected = JSON.parse(process.env.MOE_EXPECTED);

function generate(request, {cancelAfter} = {}) {
  return new Promise((resolve) => {
    const ids = [];
    let last = null;
    const deadline = new Date(Date.now() + 60000);
    const call = client.Generate(request, {deadline});
    call.on('data', (msg) => {
      ids.push(...msg.token_ids);
      last = msg;
      if (cancelAfter !== undefined && ids.length >= cancelAfter) call.cancel();
    });
    call.on('error', (err) => resolve({ids, last, code: err.code, details: err.details}));
    call.on('end', () => resolve({ids, last, code: grpc.status.OK}));
  });
}

async function main() {
  const params = JSON.parse(process.env.MOE_PARAMS);
  const r = await generate({
    model, token_ids: {ids: prompt}, max_tokens: expected.length,
    sampling: {temperature: params.temperature, seed: params.seed},
    stop: {ignore_eos: true},
  });
  assert.equal(r.code, grpc.status.OK, r.details);
  assert.deepEqual(r.ids, expected);
  assert.equal(r.last.completion.finish_reason, 'FINISH_REASON_LENGTH');
  assert.equal(r.last.completion.usage.completion_tokens, expected.length);

  const c = await generate({model, token_ids: {ids: prompt}, max_tokens: 1000,
                            stop: {ignore_eos: true}}, {cancelAfter: 2});
  assert.equal(c.code, grpc.status.CANCELLED);

  const bad = await generate({model, token_ids: {ids: prompt},
                              sampling: {top_p: 2.0}});
  assert.equal(bad.code, grpc.status.INVALID_ARGUMENT);
  assert.match(bad.details, /sampling\.top_p/);
  console.log('js client: ok');
  client.close();
}

main().catch((e) => { console.error(e); process.exit(1); });

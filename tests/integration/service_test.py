"""Integration tests of the service through its public API, with the Python client (Debian's
grpcio): a frontend and two workers on the CPU backend, all real processes on loopback."""

import math
import os
import subprocess
import threading
import time
import unittest

import grpc

import harness
from harness import MODEL_NAME, generate, metric, wait_for

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


class ServiceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = harness.Cluster(workers=2)
        cls.pb = cls.c.pb
        try:
            cls.fe = cls.c.add_frontend()
            cls.stub = cls.c.stub(cls.fe)
        except Exception:
            cls.c.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def info(self):
        return self.stub.GetModel(self.pb.GetModelRequest(model=MODEL_NAME), timeout=5)

    def assertCode(self, code, words, call):
        with self.assertRaises(grpc.RpcError) as cm:
            call()
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        for w in words:
            self.assertIn(w, cm.exception.details())

    def gen_error(self, code, words, **fields):
        self.assertCode(code, words, lambda: generate(self.stub, self.pb, **fields))

    # --- models, tokenizer, health, reflection -------------------------------------------

    def test_models(self):
        models = self.stub.ListModels(self.pb.ListModelsRequest(), timeout=5).models
        self.assertEqual([m.name for m in models], [MODEL_NAME])
        info = self.info()
        self.assertEqual(info.ready_workers, 2)
        self.assertGreater(info.context_length, 0)
        self.assertGreater(info.vocab_size, 0)
        self.assertEqual(info.architecture, "qwen3_moe")
        self.assertCode(grpc.StatusCode.NOT_FOUND, ["nope"],
                        lambda: self.stub.GetModel(self.pb.GetModelRequest(model="nope"), timeout=5))

    def test_tokenize_detokenize(self):
        ids = self.stub.Tokenize(self.pb.TokenizeRequest(model=MODEL_NAME, text="hello world"),
                                 timeout=5).token_ids
        self.assertGreater(len(ids), 0)
        text = self.stub.Detokenize(self.pb.DetokenizeRequest(model=MODEL_NAME, token_ids=ids),
                                    timeout=5).text
        self.assertEqual(text, "hello world")

    def test_health(self):
        h = self.c.health_grpc.HealthStub(self.c.channel(self.fe))
        serving = self.c.health_pb.HealthCheckResponse.SERVING
        for service in ["", "moe.v1.Inference", "model/" + MODEL_NAME, "liveness", "readiness"]:
            self.assertEqual(h.Check(self.c.health_pb.HealthCheckRequest(service=service),
                                     timeout=5).status, serving, service)
        self.assertCode(grpc.StatusCode.NOT_FOUND, [], lambda: h.Check(
            self.c.health_pb.HealthCheckRequest(service="model/nope"), timeout=5))
        wh = self.c.health_grpc.HealthStub(grpc.insecure_channel(self.c.workers[0].address))
        self.assertEqual(wh.Check(self.c.health_pb.HealthCheckRequest(service=""),
                                  timeout=5).status, serving)

    def test_reflection(self):
        # What grpcurl/ghz do: list services, then fetch the descriptor of moe.v1.Inference.
        from grpc_std import reflection_pb2, reflection_pb2_grpc
        from google.protobuf import descriptor_pb2
        stub = reflection_pb2_grpc.ServerReflectionStub(self.c.channel(self.fe))
        reqs = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="moe.v1.Inference")]
        responses = list(stub.ServerReflectionInfo(iter(reqs), timeout=5))
        names = [s.name for s in responses[0].list_services_response.service]
        self.assertIn("moe.v1.Inference", names)
        self.assertIn("grpc.health.v1.Health", names)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in responses[1].file_descriptor_response.file_descriptor_proto]
        services = {s.name: [m.name for m in s.method] for f in files for s in f.service}
        self.assertIn("Generate", services["Inference"])

    # --- generation ------------------------------------------------------------------------

    def test_tokens_equal_offline_engine(self):
        for temperature, seed in [(0.0, 0), (0.9, 1234)]:
            want = harness.offline_tokens(PROMPT, 12, temperature=temperature, seed=seed)
            ids, _, last = generate(
                self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=12,
                sampling=self.pb.SamplingParams(temperature=temperature, seed=seed),
                stop=self.pb.StopParams(ignore_eos=True))
            self.assertEqual(ids, want, f"temperature {temperature}")
            self.assertEqual(last.completion.finish_reason, self.pb.FINISH_REASON_LENGTH)
            self.assertEqual(last.completion.usage.prompt_tokens, len(PROMPT))
            self.assertEqual(last.completion.usage.completion_tokens, 12)
            t = last.completion.timings
            self.assertGreater(t.time_to_first_token_seconds, 0)
            self.assertGreaterEqual(t.total_seconds, t.time_to_first_token_seconds)

    def test_text_chat_and_logprobs(self):
        ids, text, last = generate(self.stub, self.pb, text="Once upon a time", max_tokens=8,
                                   logprobs=True, top_logprobs=3)
        self.assertGreater(len(ids), 0)
        self.assertEqual(last.request_id != "", True)
        ids2, _, last2 = generate(self.stub, self.pb, max_tokens=4, request_id="my-id",
                                  chat=self.pb.ChatMessages(messages=[
                                      self.pb.ChatMessage(role="user", content="Hi there")]))
        self.assertEqual(last2.request_id, "my-id")
        self.assertGreater(last2.completion.usage.prompt_tokens, 3)
        # logprobs: one per token, top alternatives sorted
        req = self.pb.GenerateRequest(model=MODEL_NAME, token_ids=self.pb.TokenIds(ids=PROMPT),
                                      max_tokens=4, logprobs=True, top_logprobs=3,
                                      stop=self.pb.StopParams(ignore_eos=True))
        n_ids = n_lp = 0
        for msg in self.stub.Generate(req, timeout=30):
            n_ids += len(msg.token_ids)
            n_lp += len(msg.logprobs)
            for lp in msg.logprobs:
                self.assertLessEqual(lp.logprob, 0.0)
                self.assertEqual(len(lp.top), 3)
        self.assertEqual(n_ids, n_lp)

    def test_chat_tools_and_tool_turns_render_with_the_template(self):
        # The default model's ChatML template (Jinja, as any checkpoint's) renders every turn,
        # tool calls and tool results included; its prompt opens no <think> block.
        pb = self.pb
        chat = pb.ChatMessages(
            messages=[pb.ChatMessage(role="user", content="Weather?"),
                      pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(
                          id="c1", name="get_weather", arguments='{"city": "Paris"}')]),
                      pb.ChatMessage(role="tool", content="sunny", tool_call_id="c1")],
            tools_json='[{"type": "function", "function": {"name": "get_weather"}}]',
            template_kwargs_json='{"enable_thinking": false}')
        ids = self.stub.Tokenize(pb.TokenizeRequest(model=MODEL_NAME, chat=chat), timeout=30)
        text = self.stub.Detokenize(pb.DetokenizeRequest(model=MODEL_NAME,
                                                         token_ids=ids.token_ids), timeout=30)
        self.assertEqual(text.text, "<|im_start|>user\nWeather?<|im_end|>\n"
                                    "<|im_start|>assistant\n<|im_end|>\n"
                                    "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
        req = pb.GenerateRequest(model=MODEL_NAME, chat=chat, max_tokens=2)
        first = next(iter(self.stub.Generate(req, timeout=30)))
        self.assertFalse(first.prompt_opens_thinking)

    def test_session_reports_cached_prompt_tokens(self):
        first, _, last = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                  max_tokens=6, session_id="conv-1",
                                  stop=self.pb.StopParams(ignore_eos=True))
        self.assertEqual(last.completion.usage.cached_prompt_tokens, 0)
        turn2 = PROMPT + first + [9, 10, 11]
        _, _, last2 = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=turn2),
                               max_tokens=4, session_id="conv-1",
                               stop=self.pb.StopParams(ignore_eos=True))
        self.assertEqual(last2.completion.worker, last.completion.worker)  # session affinity
        self.assertGreater(last2.completion.usage.cached_prompt_tokens, len(PROMPT) - 1)
        # Dropping it frees its KV; a second drop, or an unknown session, is NOT_FOUND.
        worker = next(w for w in self.c.workers if w.name == last2.completion.worker)
        sessions = metric(worker.metrics(), "moe_kv_cache_sessions")
        drop = self.pb.DropSessionRequest(model=MODEL_NAME, session_id="conv-1")
        self.stub.DropSession(drop, timeout=5)
        self.assertEqual(metric(worker.metrics(), "moe_kv_cache_sessions"), sessions - 1)
        self.assertCode(grpc.StatusCode.NOT_FOUND, ["conv-1", "not known"],
                        lambda: self.stub.DropSession(drop, timeout=5))

    def prefix_family(self, stub, first_id, n=5):
        """A request with a 64-token prompt, then n more sharing it (each with its own 5-token
        tail), no session; returns (worker, cached_prompt_tokens) per request."""
        self.assertGreater(self.info().vocab_size, first_id + 80)
        shared = list(range(first_id, first_id + 64))
        out = []
        for i in range(n + 1):
            ids = shared + [first_id + 64 + i] * 5
            _, _, last = generate(stub, self.pb, token_ids=self.pb.TokenIds(ids=ids), max_tokens=2,
                                  stop=self.pb.StopParams(ignore_eos=True))
            out.append((last.completion.worker, last.completion.usage.cached_prompt_tokens))
        return out

    def test_prefix_routing(self):
        # Prefix routing sends every request sharing the prefix to the worker that cached it.
        before = metric(self.fe.metrics(), "moe_frontend_routing_decisions_total",
                        {"reason": "prefix"})
        runs = self.prefix_family(self.stub, 300)
        self.assertEqual(runs[0][1], 0, runs)
        self.assertTrue(all(w == runs[0][0] and cached >= 48 for w, cached in runs[1:]), runs)
        self.assertGreaterEqual(metric(self.fe.metrics(), "moe_frontend_routing_decisions_total",
                                       {"reason": "prefix"}) - before, 5)
        # Text: the frontend hashes the bytes; the worker's tokenizer finds the same prefix.
        shared = "The quick brown fox jumps over the lazy dog near the riverbank. " * 6
        _, _, first = generate(self.stub, self.pb, text=shared + "Zero", max_tokens=2)
        for tail in ["One more", "Two more", "Three more"]:
            _, _, last = generate(self.stub, self.pb, text=shared + tail, max_tokens=2)
            self.assertEqual(last.completion.worker, first.completion.worker)
            self.assertGreater(last.completion.usage.cached_prompt_tokens, 0)
        # Least load alone (--prefix_routing=false) alternates idle workers: some miss the cache.
        fe = self.c.add_frontend(["--prefix_routing=false"])
        runs = self.prefix_family(self.c.stub(fe), 400)
        self.assertEqual(len({w for w, _ in runs}), 2, runs)
        self.assertIn(0, [cached for _, cached in runs[1:]], runs)
        self.assertEqual(metric(fe.metrics(), "moe_frontend_routing_decisions_total",
                                {"reason": "prefix"}), 0)
        self.assertEqual(metric(fe.metrics(), "moe_frontend_routing_decisions_total",
                                {"reason": "least_load"}), len(runs))

    def test_cancel_mid_stream_frees_kv(self):
        # KV kept for other tests' sessions stays; the cancelled sequence's must go.
        before = [metric(w.metrics(), "moe_kv_cache_used_bytes") for w in self.c.workers]
        req = self.pb.GenerateRequest(model=MODEL_NAME, token_ids=self.pb.TokenIds(ids=PROMPT),
                                      max_tokens=self.long_tokens(),
                                      stop=self.pb.StopParams(ignore_eos=True))
        call = self.stub.Generate(req, timeout=60)
        next(call)
        wait_for(lambda: any(metric(w.metrics(), "moe_kv_cache_used_bytes") > b
                             for w, b in zip(self.c.workers, before)), what="KV in use")
        cancelled_before = sum(metric(w.metrics(), "moe_requests_total", {"outcome": "cancelled"})
                               for w in self.c.workers)
        call.cancel()
        wait_for(lambda: sum(metric(w.metrics(), "moe_requests_total", {"outcome": "cancelled"})
                             for w in self.c.workers) == cancelled_before + 1, what="cancel seen")
        for w, b in zip(self.c.workers, before):
            wait_for(lambda: metric(w.metrics(), "moe_num_requests_running") == 0 and
                     metric(w.metrics(), "moe_kv_cache_used_bytes") == b, timeout=5,
                     what="the cancelled sequence's KV to be freed")

    def long_tokens(self):
        return 400  # a few seconds on the CPU backend; cancelled long before the end

    def test_deadline_exceeded(self):
        t0 = time.time()
        self.gen_error(grpc.StatusCode.DEADLINE_EXCEEDED, [], timeout=0.3,
                       token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=self.long_tokens(),
                       stop=self.pb.StopParams(ignore_eos=True))
        self.assertLess(time.time() - t0, 5)
        for w in self.c.workers:
            wait_for(lambda: metric(w.metrics(), "moe_num_requests_running") == 0,
                     what="the expired request to leave the engine")

    # --- bad input ---------------------------------------------------------------------------

    def test_bad_inputs(self):
        pb = self.pb
        INVALID = grpc.StatusCode.INVALID_ARGUMENT
        ids = pb.TokenIds(ids=PROMPT)
        info = self.info()
        self.gen_error(INVALID, ["model", "required"], model="", token_ids=ids)
        self.gen_error(grpc.StatusCode.NOT_FOUND, ["nope", "not served"], model="nope",
                       token_ids=ids)
        self.gen_error(INVALID, ["input", "required"])
        self.gen_error(INVALID, ["text", "empty"], text="")
        self.gen_error(INVALID, ["token_ids", "empty"], token_ids=pb.TokenIds())
        self.gen_error(INVALID, ["chat.messages"], chat=pb.ChatMessages())
        user = pb.ChatMessage(role="user", content="hi")
        self.gen_error(INVALID, ["chat.tools_json", "not a JSON array"],
                       chat=pb.ChatMessages(messages=[user], tools_json="{}"))
        self.gen_error(INVALID, ["chat.template_kwargs_json", "not valid JSON"],
                       chat=pb.ChatMessages(messages=[user], template_kwargs_json="{"))
        self.gen_error(INVALID, ["max_tokens", "at least 1"], token_ids=ids, max_tokens=0)
        self.gen_error(INVALID, ["max_tokens", "context length"], token_ids=ids,
                       max_tokens=4_000_000_000)
        self.gen_error(INVALID, ["sampling.temperature", "finite"], token_ids=ids,
                       sampling=pb.SamplingParams(temperature=math.nan))
        self.gen_error(INVALID, ["sampling.temperature", "negative"], token_ids=ids,
                       sampling=pb.SamplingParams(temperature=-0.5))
        self.gen_error(INVALID, ["sampling.top_p", "(0, 1]"], token_ids=ids,
                       sampling=pb.SamplingParams(top_p=1.5))
        self.gen_error(INVALID, ["sampling.top_p"], token_ids=ids,
                       sampling=pb.SamplingParams(top_p=0.0))
        self.gen_error(INVALID, ["sampling.min_p"], token_ids=ids,
                       sampling=pb.SamplingParams(min_p=math.inf))
        self.gen_error(INVALID, ["token_ids.ids[1]", "vocabulary"],
                       token_ids=pb.TokenIds(ids=[1, info.vocab_size + 5]))
        self.gen_error(INVALID, ["context length"],
                       token_ids=pb.TokenIds(ids=[1] * info.context_length))
        self.gen_error(INVALID, ["context length"],
                       text="hello " * (info.context_length + 10))
        self.gen_error(INVALID, ["stop.strings[0]"], token_ids=ids,
                       stop=pb.StopParams(strings=[""]))
        self.gen_error(INVALID, ["top_logprobs"], token_ids=ids, top_logprobs=50)

    def test_wrong_shape_message(self):
        # Bytes that are not a GenerateRequest: the server cannot parse them.
        call = self.c.channel(self.fe).unary_stream(
            "/moe.v1.Inference/Generate", request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, ["not a moe.v1.GenerateRequest"],
                        lambda: list(call(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)))
        # A varint where the string `model` belongs: protobuf keeps it as an unknown field, so
        # the message parses and has no model.
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, ["model", "required"],
                        lambda: list(call(b"\x08\x01", timeout=5)))

    def test_oversize_message(self):
        self.gen_error(grpc.StatusCode.RESOURCE_EXHAUSTED, [], text="x" * (5 << 20))

    # --- overload and auth (more frontends on the same workers) ------------------------------

    def test_burst_beyond_queue(self):
        fe = self.c.add_frontend(["--max_running=2", "--max_queued=2"])
        stub = self.c.stub(fe)
        results = [None] * 8
        n = 100

        def run(i):
            try:
                ids, _, last = generate(stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                        max_tokens=n, stop=self.pb.StopParams(ignore_eos=True))
                results[i] = ("ok", len(ids))
            except grpc.RpcError as e:
                results[i] = (e.code(), e.details())

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [r for r in results if r[0] == "ok"]
        rejected = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
        self.assertEqual(len(ok) + len(rejected), 8, results)
        self.assertGreaterEqual(len(ok), 4, results)  # 2 running + 2 queued always get through
        self.assertGreaterEqual(len(rejected), 1, results)
        self.assertIn("queue is full", rejected[0][1])
        self.assertTrue(all(r[1] == n for r in ok), results)
        self.assertEqual(metric(fe.metrics(), "moe_frontend_requests_total",
                                {"outcome": "resource_exhausted"}), len(rejected))
        # Nothing else broke: the main frontend still serves.
        ids, _, _ = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                             max_tokens=3, stop=self.pb.StopParams(ignore_eos=True))
        self.assertEqual(len(ids), 3)

    def test_auth_token(self):
        fe = self.c.add_frontend(["--auth_token=s3cret"])
        stub = self.c.stub(fe)
        kw = dict(token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=2)
        self.assertCode(grpc.StatusCode.UNAUTHENTICATED, ["authorization"],
                        lambda: generate(stub, self.pb, **kw))
        self.assertCode(grpc.StatusCode.UNAUTHENTICATED, ["wrong"],
                        lambda: generate(stub, self.pb, metadata=[("authorization", "Bearer no")],
                                         **kw))
        ids, _, _ = generate(stub, self.pb, metadata=[("authorization", "Bearer s3cret")], **kw)
        self.assertGreater(len(ids), 0)

    def test_loadgen(self):
        out = os.path.join(self.c.log_dir, "loadgen.json")
        r = subprocess.run([os.path.join(harness.BUILD_DIR, "bin", "moe-loadgen"),
                            f"--target={self.fe.address}", f"--model={MODEL_NAME}",
                            "--concurrency=2", "--duration_seconds=1", "--prompt_tokens=8",
                            "--max_tokens=8", f"--json={out}"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("TTFT", r.stdout)
        import json
        with open(out) as f:
            report = json.load(f)
        self.assertGreater(report["calls_ok"], 0)
        self.assertGreaterEqual(report["tokens"], 8 * report["calls_ok"])
        self.assertEqual(report["errors"], {})

    def test_tls(self):
        key, cert, root = harness.self_signed_cert(self.c.log_dir, "tls")
        fe = self.c.add_frontend([f"--tls_cert={cert}", f"--tls_key={key}"], tls_root=root)
        ids, _, _ = generate(self.c.stub(fe), self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                             max_tokens=2)
        self.assertEqual(len(ids), 2)
        # A plaintext client cannot talk to it.
        plain = self.pb_grpc().InferenceStub(grpc.insecure_channel(fe.address))
        self.assertCode(grpc.StatusCode.UNAVAILABLE, [], lambda: plain.ListModels(
            self.pb.ListModelsRequest(), timeout=2))

    def test_workers_from_dns(self):
        # "localhost" stands in for a Kubernetes headless Service name.
        port = self.c.workers[0].port
        fe = self.c.add_frontend([f"--workers_dns=localhost:{port}", "--dns_refresh_seconds=1"],
                                 ready_workers=1, static=False)
        _, _, last = generate(self.c.stub(fe), self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                              max_tokens=2)
        self.assertEqual(last.completion.worker, self.c.workers[0].name)

    def test_expert_store(self):
        # The worker serves experts from a tiered store written by moe-import; its counters
        # reach /metrics, and the tokens are the checkpoint's (bf16 experts either way).
        store = os.path.join(self.c.log_dir, "store")
        subprocess.run([os.path.join(harness.BUILD_DIR, "bin", "moe-import"),
                        f"--model_dir={harness.MODEL_DIR}", f"--store_dir={store}"],
                       check=True, capture_output=True)
        # The last --model wins: the worker serves the store, under the checkpoint's name.
        c2 = harness.Cluster(workers=1, worker_args=[
            f"--model={store}", f"--model_name={MODEL_NAME}", "--device_budget=2MiB",
            "--host_budget=4MiB"])
        try:
            fe = c2.add_frontend()
            stub = c2.stub(fe)
            info = stub.GetModel(self.pb.GetModelRequest(model=MODEL_NAME), timeout=5)
            self.assertEqual(info.expert_format, "bf16")  # the import's default format
            self.assertEqual(info.device_budget_bytes, 2 << 20)
            want = harness.offline_tokens(PROMPT, 6)
            ids, _, _ = generate(stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                 max_tokens=6, sampling=self.pb.SamplingParams(temperature=0),
                                 stop=self.pb.StopParams(ignore_eos=True))
            self.assertEqual(ids, want)
            m = c2.workers[0].metrics()
            lookups = sum(metric(m, "moe_store_lookups_total", {"tier": t, "result": r})
                          for t in ("device", "host") for r in ("hit", "miss"))
            self.assertGreater(lookups, 0)
            self.assertGreater(metric(m, "moe_store_blob_reads_total"), 0)
            r = subprocess.run(["promtool", "check", "metrics"], input=m, text=True,
                               capture_output=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            c2.close()

    def test_hybrid_model_from_a_store(self):
        # A Qwen3.5-MoE hybrid in the layout of real checkpoints (moe_offline_tokens
        # --write_hybrid_model), imported by moe-import and served from the store: the tokens are
        # the offline engine's, a session's second turn continues from its kept recurrent state
        # and gives the tokens a cold run of the whole conversation gives, and the state's gauges
        # reach /metrics.
        model = os.path.join(self.c.log_dir, "hybrid")
        store = os.path.join(self.c.log_dir, "hybrid_store")
        subprocess.run([harness.OFFLINE_BIN, f"--write_hybrid_model={model}"], check=True,
                       capture_output=True)
        subprocess.run([os.path.join(harness.BUILD_DIR, "bin", "moe-import"),
                        f"--model_dir={model}", f"--store_dir={store}"],
                       check=True, capture_output=True)
        c2 = harness.Cluster(workers=1, worker_args=[f"--model={store}",
                                                     f"--model_name={MODEL_NAME}"])
        try:
            fe = c2.add_frontend()
            stub = c2.stub(fe)
            greedy = dict(sampling=self.pb.SamplingParams(temperature=0),
                          stop=self.pb.StopParams(ignore_eos=True))
            want = harness.offline_tokens(PROMPT, 6, model_dir=model)
            ids, _, _ = generate(stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                 max_tokens=6, session_id="hybrid-1", **greedy)
            self.assertEqual(ids, want)
            turn2 = PROMPT + ids + [9, 10, 11]
            ids2, _, last2 = generate(stub, self.pb, token_ids=self.pb.TokenIds(ids=turn2),
                                      max_tokens=5, session_id="hybrid-1", **greedy)
            self.assertGreater(last2.completion.usage.cached_prompt_tokens, len(PROMPT) - 1)
            self.assertEqual(ids2, harness.offline_tokens(turn2, 5, model_dir=model))
            m = c2.workers[0].metrics()
            self.assertGreater(metric(m, "moe_state_budget_bytes"), 0)
            self.assertGreater(metric(m, "moe_state_slots_used"), 0)  # the kept session
            r = subprocess.run(["promtool", "check", "metrics"], input=m, text=True,
                               capture_output=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            c2.close()

    def pb_grpc(self):
        return self.c.pb_grpc

    # --- metrics -------------------------------------------------------------------------------

    def test_metrics_are_promtool_clean(self):
        generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=3)
        for name, text in [("frontend", self.fe.metrics()),
                           ("worker", self.c.workers[0].metrics())]:
            r = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True)
            self.assertEqual(r.returncode, 0, f"{name}: {r.stdout}{r.stderr}")
        w = "".join(x.metrics() for x in self.c.workers)
        for name in ["moe_time_to_first_token_seconds_bucket", "moe_generation_tokens_total",
                     "moe_kv_cache_bytes_per_token", "moe_state_budget_bytes",
                     "moe_engine_phase_seconds_total",
                     "moe_store_lookups_total", "moe_store_load_latency_seconds_bucket",
                     "moe_model_info"]:
            self.assertIn(name, w)
        self.assertGreater(metric(self.fe.metrics(), "moe_frontend_workers", {"state": "up"}), 1)
        self.assertIn('le="0.001"', self.fe.metrics())  # vLLM's TTFT buckets


if __name__ == "__main__":
    unittest.main(verbosity=2)

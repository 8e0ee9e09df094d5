"""Issue 29's remaining service items (RELIABILITY.md, "Service, remaining items"): a deadline
mid-stream has its own outcome; oversized requests and worker failures are counted; Tokenize
validates as Generate; invalid UTF-8 names its field; both drains end cut-off streams alike;
GetModel's expert_format is the format; special tokens stay out of streamed text by default.
Real processes on loopback (harness.py); run with /usr/bin/python3."""

import glob
import os
import unittest

import grpc

import harness
from harness import generate, metric, wait_for

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
LONG = 4000  # tokens: seconds of generation on the CPU build (context 4096)


class ReliabilityServiceTest(harness.ClusterTestCase):
    def long_stream(self, stub, timeout=60):
        req = self.c.pb.GenerateRequest(
            model=harness.MODEL_NAME, token_ids=self.c.pb.TokenIds(ids=PROMPT), max_tokens=LONG,
            stop=self.c.pb.StopParams(ignore_eos=True))
        return stub.Generate(req, timeout=timeout)

    def test_deadline_mid_stream_is_its_own_outcome_on_the_worker(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()
        stream = self.long_stream(c.stub(fe), timeout=1.5)
        next(stream)  # mid-stream: tokens are flowing when the deadline passes
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in stream:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        w = c.workers[0]
        wait_for(lambda: metric(w.metrics(), "moe_requests_total",
                                {"outcome": "deadline_exceeded"}) == 1,
                 what=f"the worker to count deadline_exceeded\n{w.metrics()}")
        self.assertEqual(metric(w.metrics(), "moe_requests_total", {"outcome": "cancelled"}), 0)
        wait_for(lambda: metric(fe.metrics(), "moe_frontend_requests_total",
                                {"outcome": "deadline_exceeded"}) == 1,
                 what=f"the frontend to count deadline_exceeded\n{fe.metrics()}")

    def test_oversized_requests_and_worker_failures_are_counted(self):
        store = self.import_store()
        # Garbage over every blob: every expert read fails its checksum (DATA_LOSS).
        for path in glob.glob(os.path.join(store, "blobs", "*.blob")):
            with open(path, "r+b") as f:
                for offset in range(0, os.path.getsize(path), 4096):
                    f.seek(offset)
                    f.write(b"garbage!" * 64)
        c = self.cluster(workers=1)
        bad = harness.Worker(1, c.log_dir, [f"--model={store}",
                                            f"--model_name={harness.MODEL_NAME}",
                                            "--max_consecutive_faults=100"])
        c.workers.append(bad)
        fe = c.add_frontend(["--max_request_bytes=4096"])
        stub = c.stub(fe)
        big = "x" * 6000  # over the flag, under gRPC's own limit (twice the flag)
        with self.assertRaises(grpc.RpcError) as cm:
            generate(stub, c.pb, text=big)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        with self.assertRaises(grpc.RpcError) as cm:
            stub.Tokenize(c.pb.TokenizeRequest(model=harness.MODEL_NAME, text=big), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        m = fe.metrics()
        self.assertEqual(metric(m, "moe_frontend_oversized_requests_total",
                                {"method": "Generate"}), 1, m)
        self.assertEqual(metric(m, "moe_frontend_oversized_requests_total",
                                {"method": "Tokenize"}), 1, m)
        self.assertEqual(metric(m, "moe_frontend_requests_total",
                                {"outcome": "resource_exhausted"}), 1, m)
        # The bad worker fails the calls routed to it; each is retried on the good one, so only
        # the frontend's worker failure counter (and the worker's own) shows it.
        for i in range(6):
            _, _, last = generate(stub, c.pb, token_ids=c.pb.TokenIds(ids=PROMPT[i:]),
                                  max_tokens=2)
            self.assertEqual(last.completion.worker, c.workers[0].name)
        failed = metric(bad.metrics(), "moe_requests_total", {"outcome": "data_loss"})
        self.assertGreater(failed or 0, 0, bad.metrics())
        self.assertEqual(metric(fe.metrics(), "moe_frontend_worker_failures_total",
                                {"code": "data_loss"}), failed)

    def test_tokenize_validates_the_fields_it_shares_with_generate(self):
        c = self.cluster(workers=1)
        stub = c.stub(c.add_frontend())
        pb = c.pb
        cases = [
            (pb.TokenizeRequest(model=harness.MODEL_NAME, chat=pb.ChatMessages(messages=[
                pb.ChatMessage(role="system", content="be brief"),
                pb.ChatMessage(role="user", content="")])),
             "chat.messages[1].content"),
            (pb.TokenizeRequest(model=harness.MODEL_NAME, text=""), "text"),
            (pb.TokenizeRequest(model=harness.MODEL_NAME), "input"),
            (pb.TokenizeRequest(model=harness.MODEL_NAME, chat=pb.ChatMessages(messages=[
                pb.ChatMessage(role="", content="hi")])), "chat.messages[0].role"),
        ]
        for request, field in cases:
            with self.assertRaises(grpc.RpcError, msg=field) as cm:
                stub.Tokenize(request, timeout=5)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, field)
            self.assertTrue(cm.exception.details().startswith(field + ":"),
                            cm.exception.details())
        ok = stub.Tokenize(pb.TokenizeRequest(model=harness.MODEL_NAME, text="hello"), timeout=5)
        self.assertGreater(len(ok.token_ids), 0)

    def test_invalid_utf8_names_the_field(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()
        pb = c.pb
        req = pb.GenerateRequest(model=harness.MODEL_NAME, chat=pb.ChatMessages(messages=[
            pb.ChatMessage(role="system", content="fine"),
            pb.ChatMessage(role="user", content="say MARK")]))
        raw = req.SerializeToString()
        self.assertEqual(raw.count(b"MARK"), 1)
        raw = raw.replace(b"MARK", b"\xff\xfe\xc0\x80")  # same length: lengths stay right
        call = c.channel(fe).unary_stream("/moe.v1.Inference/Generate",
                                          request_serializer=lambda b: b,
                                          response_deserializer=pb.GenerateResponse.FromString)
        with self.assertRaises(grpc.RpcError) as cm:
            list(call(raw, timeout=5))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(cm.exception.details(), "chat.messages[1].content: is not valid UTF-8")

    def test_drains_end_cut_off_streams_alike(self):
        outcomes = {}
        for who in ("frontend", "worker"):
            c = self.cluster(workers=1, worker_args=["--drain_seconds=1"])
            fe = c.add_frontend(["--drain_seconds=1"])
            pb = c.pb
            stream = self.long_stream(c.stub(fe))
            first = next(stream)
            proc = fe.process if who == "frontend" else c.workers[0].process
            proc.signal(15)  # SIGTERM: the drain's second runs out while tokens flow
            msgs = [first] + list(stream)  # ends with OK: no RpcError
            last = msgs[-1]
            self.assertTrue(last.HasField("completion"), who)
            self.assertEqual(last.completion.finish_reason, pb.FINISH_REASON_CANCELLED, who)
            sent = sum(len(m.token_ids) for m in msgs)
            self.assertGreater(sent, 0, who)
            self.assertLess(sent, LONG, who)
            self.assertEqual(last.completion.usage.completion_tokens, sent, who)
            self.assertEqual(proc.wait(timeout=30), 0, who)
            outcomes[who] = (last.completion.finish_reason, last.request_id != "")
            self.c.close()
            self.c = None
        self.assertEqual(outcomes["frontend"], outcomes["worker"])

    def test_get_model_expert_format_is_the_format(self):
        store = self.import_store("--format=int4", "--group_size=64")
        c = self.cluster(workers=1)
        stored = harness.Worker(1, c.log_dir, [f"--model={store}", "--model_name=stored"])
        c.workers.append(stored)
        stub = c.stub(c.add_frontend())
        info = stub.GetModel(c.pb.GetModelRequest(model=harness.MODEL_NAME), timeout=5)
        self.assertEqual(info.expert_format, "bf16")  # the default model's config.json dtype
        info = stub.GetModel(c.pb.GetModelRequest(model="stored"), timeout=5)
        self.assertEqual(info.expert_format, "int4-g64")

    def test_special_tokens_stay_out_of_streamed_text_by_default(self):
        c = self.cluster(workers=1)
        stub = c.stub(c.add_frontend())
        pb = c.pb
        # Seed 4 at temperature 50 generates <|endoftext|> (id 652) within 50 tokens on the
        # built-in model (checked with moe_offline_tokens); ignore_eos keeps it from stopping.
        fields = dict(token_ids=pb.TokenIds(ids=PROMPT), max_tokens=50,
                      sampling=pb.SamplingParams(temperature=50, seed=4),
                      stop=pb.StopParams(ignore_eos=True))
        ids, text, _ = generate(stub, pb, **fields)
        self.assertIn(652, ids)

        def detok(skip):
            return stub.Detokenize(pb.DetokenizeRequest(model=harness.MODEL_NAME, token_ids=ids,
                                                        skip_special_tokens=skip),
                                   timeout=5).text
        self.assertNotIn("<|endoftext|>", text)
        self.assertEqual(text, detok(True))
        ids2, text2, _ = generate(stub, pb, skip_special_tokens=False, **fields)
        self.assertEqual(ids2, ids)
        self.assertIn("<|endoftext|>", text2)
        self.assertEqual(text2, detok(False))


if __name__ == "__main__":
    unittest.main(verbosity=2)

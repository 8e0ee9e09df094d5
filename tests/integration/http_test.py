"""The frontend's OpenAI- and Anthropic-compatible HTTP API (--http_listen) against real
processes: response and event shapes (curl -N for the streams), the same tokens as gRPC, every
error path with its status and body shape, auth, a full queue (429 + retry-after), no worker
(503), and a client that disconnects mid-stream freeing the worker's KV."""

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from harness import MODEL_NAME, metric, wait_for

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def request(port, method, path, body=None, headers=None, raw=None, timeout=60):
    """One HTTP request; returns (status, headers dict (lower-case), body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    h = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, text


def curl_sse(port, path, body, headers=()):
    """curl -N of a streaming request; returns its output lines."""
    argv = ["curl", "-sS", "-N", f"http://127.0.0.1:{port}{path}", "-H",
            "Content-Type: application/json", "-d", json.dumps(body)]
    for h in headers:
        argv += ["-H", h]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout
    return out.split("\n")


class HttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = harness.Cluster(workers=1)
        try:
            cls.http_port = harness.free_port()
            cls.fe = cls.c.add_frontend([f"--http_listen=127.0.0.1:{cls.http_port}"])
            cls.stub = cls.c.stub(cls.fe)
        except Exception:
            cls.c.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def post(self, path, body, **kw):
        return request(self.http_port, "POST", path, body, **kw)

    def openai_error(self, status, text, want_status, words, param=None):
        self.assertEqual(status, want_status, text)
        err = json.loads(text)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, err)
        for w in words:
            self.assertIn(w, err["message"])
        if param is not None:
            self.assertEqual(err["param"], param)
        return err

    def anthropic_error(self, status, text, want_status, want_type, words=()):
        self.assertEqual(status, want_status, text)
        body = json.loads(text)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], want_type)
        for w in words:
            self.assertIn(w, body["error"]["message"])

    # --- shapes --------------------------------------------------------------------------

    def test_models(self):
        status, _, text = request(self.http_port, "GET", "/v1/models")
        self.assertEqual(status, 200, text)
        body = json.loads(text)
        self.assertEqual(body["object"], "list")
        self.assertEqual([m["id"] for m in body["data"]], [MODEL_NAME])
        self.assertEqual(body["data"][0]["object"], "model")

    def test_chat_completion(self):
        status, _, text = self.post("/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": True,
            "top_logprobs": 2, "unknown_field": {"is": "ignored"}})
        self.assertEqual(status, 200, text)
        body = json.loads(text)
        self.assertEqual(body["object"], "chat.completion")
        self.assertTrue(body["id"].startswith("chatcmpl-"))
        choice = body["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertIsInstance(choice["message"]["content"], str)
        lp = choice["logprobs"]["content"]
        self.assertEqual(len(lp), 5)
        self.assertEqual(len(lp[0]["top_logprobs"]), 2)
        self.assertEqual(bytes(lp[0]["bytes"]).decode(errors="replace"), lp[0]["token"])
        u = body["usage"]
        self.assertEqual(u["completion_tokens"], 5)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 5)

    def test_completion_tokens_equal_grpc(self):
        n = 12
        status, _, text = self.post("/v1/completions", {
            "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": n, "temperature": 0,
            "ignore_eos": True})
        self.assertEqual(status, 200, text)
        body = json.loads(text)
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["usage"]["completion_tokens"], n)
        _, grpc_text, _ = harness.generate(
            self.stub, self.c.pb, token_ids=self.c.pb.TokenIds(ids=PROMPT), max_tokens=n,
            sampling=self.c.pb.SamplingParams(temperature=0),
            stop=self.c.pb.StopParams(ignore_eos=True))
        self.assertEqual(body["choices"][0]["text"], grpc_text)

    def test_chat_stream_curl(self):
        lines = curl_sse(self.http_port, "/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
        events = [l for l in lines if l]
        self.assertTrue(all(l.startswith("data: ") for l in events), lines)
        self.assertEqual(events[-1], "data: [DONE]")
        chunks = [json.loads(l[6:]) for l in events[:-1]]
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "length")
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 6)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
        status, _, body = self.post("/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 6, "ignore_eos": True, "temperature": 1.0, "seed": 0})
        self.assertEqual(status, 200)
        # Same defaults, same seed (0): the stream's text is the whole response's.
        self.assertEqual(text, json.loads(body)["choices"][0]["message"]["content"])

    def test_completion_stream_curl(self):
        lines = curl_sse(self.http_port, "/v1/completions", {
            "model": MODEL_NAME, "prompt": "Once", "max_tokens": 4, "ignore_eos": True,
            "stream": True})
        events = [l for l in lines if l]
        self.assertEqual(events[-1], "data: [DONE]")
        chunks = [json.loads(l[6:]) for l in events[:-1]]
        self.assertTrue(all(c["object"] == "text_completion" for c in chunks))
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")

    def test_messages(self):
        status, _, text = self.post("/v1/messages", {
            "model": MODEL_NAME, "max_tokens": 5, "system": "Be brief.", "ignore_eos": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]})
        self.assertEqual(status, 200, text)
        body = json.loads(text)
        self.assertEqual(body["type"], "message")
        self.assertEqual(body["role"], "assistant")
        self.assertTrue(body["id"].startswith("msg_"))
        self.assertEqual(body["stop_reason"], "max_tokens")
        self.assertEqual(body["usage"]["output_tokens"], 5)
        self.assertGreater(body["usage"]["input_tokens"], 0)
        self.assertTrue(all(b["type"] == "text" for b in body["content"]), body)

    def test_messages_stream_curl(self):
        lines = curl_sse(self.http_port, "/v1/messages", {
            "model": MODEL_NAME, "max_tokens": 6, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]})
        names, datas = [], []
        for l in lines:
            if l.startswith("event: "):
                names.append(l[7:])
            elif l.startswith("data: "):
                datas.append(json.loads(l[6:]))
            else:
                self.assertEqual(l, "", lines)
        self.assertEqual(len(names), len(datas))
        self.assertEqual([d["type"] for d in datas], names)
        self.assertEqual(names[0], "message_start")
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        middle = names[1:-2]
        if middle:  # random weights may emit only special tokens
            self.assertEqual(middle[0], "content_block_start")
            self.assertEqual(middle[-1], "content_block_stop")
            self.assertTrue(set(middle[1:-1]) <= {"content_block_delta"}, middle)
        self.assertEqual(datas[-2]["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(datas[-2]["usage"]["output_tokens"], 6)

    def test_sessions(self):
        # x-session-id (header) and session_id (body) both reach GenerateRequest.session_id:
        # the worker keeps one more session for each.
        w = self.c.workers[0]
        body = {"model": MODEL_NAME, "prompt": "a b c d e f g h", "max_tokens": 2,
                "ignore_eos": True}
        sessions = metric(w.metrics(), "moe_kv_cache_sessions")
        s, _, t = self.post("/v1/completions", body, headers={"x-session-id": "http-s1"})
        self.assertEqual(s, 200, t)
        self.assertEqual(metric(w.metrics(), "moe_kv_cache_sessions"), sessions + 1)
        s, _, t = self.post("/v1/messages", {
            "model": MODEL_NAME, "max_tokens": 2, "session_id": "http-s2",
            "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(s, 200, t)
        self.assertEqual(metric(w.metrics(), "moe_kv_cache_sessions"), sessions + 2)

    # --- errors --------------------------------------------------------------------------

    def test_errors(self):
        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]}
        s, _, t = self.post("/v1/chat/completions", None, raw="{not json")
        self.openai_error(s, t, 400, ["not valid JSON"], "body")
        s, _, t = self.post("/v1/chat/completions", {**chat, "temperature": "hot"})
        self.openai_error(s, t, 400, ["temperature"], "temperature")
        s, _, t = self.post("/v1/chat/completions", {**chat, "n": 2})
        self.openai_error(s, t, 400, ["n: only 1"], "n")
        s, _, t = self.post("/v1/chat/completions", {**chat, "messages": []})
        self.openai_error(s, t, 400, ["messages"], "messages")
        s, _, t = self.post("/v1/chat/completions", {**chat, "top_p": 2.0})
        err = self.openai_error(s, t, 400, ["sampling.top_p"])
        self.assertEqual(err["type"], "invalid_request_error")
        s, _, t = self.post("/v1/chat/completions", {**chat, "tool_choice": {
            "type": "function", "function": {"name": "nope"}}, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {}}}]})
        self.openai_error(s, t, 400, ["tool_choice.function.name"])
        s, _, t = self.post("/v1/chat/completions", {**chat, "model": "nope"})
        err = self.openai_error(s, t, 404, ["nope"])
        self.assertEqual(err["code"], "model_not_found")
        s, _, t = self.post("/v1/completions", {"model": MODEL_NAME, "prompt": {"x": 1}})
        self.openai_error(s, t, 400, ["prompt"], "prompt")
        s, _, t = self.post("/v1/messages", {"model": MODEL_NAME,
                                             "messages": [{"role": "user", "content": "x"}]})
        self.anthropic_error(s, t, 400, "invalid_request_error", ["max_tokens"])
        s, _, t = self.post("/v1/messages", None, raw="[1,")
        self.anthropic_error(s, t, 400, "invalid_request_error", ["JSON"])
        s, _, t = self.post("/v1/messages", {"model": "nope", "max_tokens": 3,
                                             "messages": [{"role": "user", "content": "x"}]})
        self.anthropic_error(s, t, 404, "not_found_error", ["nope"])
        s, _, t = self.post("/v1/messages", {"model": MODEL_NAME, "max_tokens": 3, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]})
        self.anthropic_error(s, t, 400, "invalid_request_error", ["messages[0].content[0].type"])
        s, _, t = request(self.http_port, "GET", "/v2/nothing")
        self.assertEqual(s, 404, t)
        m = self.fe.metrics()
        self.assertGreaterEqual(metric(m, "moe_http_requests_total",
                                       {"api": "chat_completions", "code": "400"}), 6)
        self.assertGreaterEqual(metric(m, "moe_http_requests_total",
                                       {"api": "messages", "code": "404"}), 1)

    def test_auth(self):
        port = harness.free_port()
        self.c.add_frontend([f"--http_listen=127.0.0.1:{port}", "--auth_token=s3cret"])
        body = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}
        msg = {"model": MODEL_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        s, _, t = request(port, "POST", "/v1/completions", body)
        err = self.openai_error(s, t, 401, ["missing"])
        self.assertEqual(err["type"], "authentication_error")
        s, _, t = request(port, "POST", "/v1/completions", body,
                          headers={"Authorization": "Bearer wrong"})
        self.openai_error(s, t, 401, ["wrong"])
        s, _, t = request(port, "GET", "/v1/models", headers={"Authorization": "Basic s3cret"})
        self.openai_error(s, t, 401, ["Bearer"])
        s, _, t = request(port, "POST", "/v1/messages", msg, headers={"x-api-key": "nope"})
        self.anthropic_error(s, t, 401, "authentication_error", ["wrong"])
        s, _, t = request(port, "POST", "/v1/completions", body,
                          headers={"Authorization": "Bearer s3cret"})
        self.assertEqual(s, 200, t)
        s, _, t = request(port, "POST", "/v1/messages", msg, headers={"x-api-key": "s3cret"})
        self.assertEqual(s, 200, t)

    def test_tls(self):
        # The gRPC listener's --tls_cert/--tls_key serve HTTPS too; plain HTTP is refused.
        import ssl
        key, cert, root = harness.self_signed_cert(self.c.log_dir, "http-tls")
        port = harness.free_port()
        self.c.add_frontend([f"--http_listen=127.0.0.1:{port}", f"--tls_cert={cert}",
                             f"--tls_key={key}"], tls_root=root)
        ctx = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(json.loads(r.read())["usage"]["completion_tokens"], 2)
        conn.close()
        with self.assertRaises((ConnectionError, http.client.HTTPException, OSError)):
            request(port, "GET", "/v1/models", timeout=5)

    def open_stream(self, port, max_tokens=2000):
        """A streaming chat completion left open after its first event; returns the socket."""
        body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                           "max_tokens": max_tokens, "ignore_eos": True, "stream": True})
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n"
                      + body).encode())
        got = b""
        # Plain "data: " although gzip was offered: events are never held in a compressor.
        while b"data: " not in got:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, got)
            got += chunk
        self.assertIn(b"200 OK", got.split(b"\r\n")[0])
        return sock

    def test_queue_full_is_429(self):
        port = harness.free_port()
        fe = self.c.add_frontend([f"--http_listen=127.0.0.1:{port}", "--max_running=1",
                                  "--max_queued=1"])
        held = [self.open_stream(port)]
        # The queued one waits (its headers come only with its first token): a thread holds it.
        queued = threading.Thread(target=lambda: request(
            port, "POST", "/v1/completions",
            {"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}, timeout=120))
        queued.start()
        wait_for(lambda: metric(fe.metrics(), "moe_frontend_requests_queued") == 1,
                 what="one queued call")
        s, h, t = request(port, "POST", "/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
        err = self.openai_error(s, t, 429, ["queue is full"])
        self.assertEqual(err["type"], "rate_limit_error")
        self.assertGreaterEqual(int(h["retry-after"]), 1)
        s, h, t = request(port, "POST", "/v1/messages", {
            "model": MODEL_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
        self.anthropic_error(s, t, 429, "rate_limit_error", ["queue is full"])
        self.assertIn("retry-after", h)
        for sock in held:
            sock.close()
        queued.join(timeout=60)
        self.assertGreaterEqual(metric(fe.metrics(), "moe_http_requests_total",
                                       {"api": "chat_completions", "code": "429"}), 1)

    def test_draining_is_503(self):
        port = harness.free_port()
        fe = self.c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
        sock = self.open_stream(port)  # keeps the drain going
        fe.process.signal(signal.SIGTERM)
        wait_for(lambda: "draining" in fe.process.tail(), what="the drain to start")
        s, _, t = request(port, "POST", "/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
        self.openai_error(s, t, 503, [])
        s, _, t = request(port, "POST", "/v1/messages", {
            "model": MODEL_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
        self.anthropic_error(s, t, 503, "overloaded_error")
        sock.close()
        self.assertEqual(fe.process.wait(timeout=20), 0)

    # --- cancellation --------------------------------------------------------------------

    def test_disconnect_frees_kv(self):
        w = self.c.workers[0]
        wait_for(lambda: metric(w.metrics(), "moe_num_requests_running") == 0, what="idle")
        before = metric(w.metrics(), "moe_kv_cache_used_bytes")
        cancelled = metric(w.metrics(), "moe_requests_total", {"outcome": "cancelled"})
        sock = self.open_stream(self.http_port)
        self.assertEqual(metric(w.metrics(), "moe_num_requests_running"), 1)
        self.assertGreater(metric(w.metrics(), "moe_kv_cache_used_bytes"), before)
        sock.close()
        t0 = time.time()
        wait_for(lambda: metric(w.metrics(), "moe_num_requests_running") == 0 and
                 metric(w.metrics(), "moe_kv_cache_used_bytes") == before, timeout=5,
                 what="the disconnected stream's KV to be freed")
        print(f"KV freed {time.time() - t0:.3f} s after the disconnect")
        self.assertEqual(metric(w.metrics(), "moe_requests_total", {"outcome": "cancelled"}),
                         cancelled + 1)


class ScriptedOutputTest(unittest.TestCase):
    """Models whose greedy output is a given text (moe_offline_tokens --write_scripted_model):
    reasoning and a malformed tool call, through both APIs, whole and streamed."""

    def serve(self, script):
        tmp = tempfile.mkdtemp(prefix="moe-scripted-")
        model = os.path.join(tmp, "scripted")
        subprocess.run([harness.OFFLINE_BIN, f"--write_scripted_model={model}",
                        f"--script={script}"], check=True)
        c = harness.Cluster(workers=1, worker_args=[f"--model={model}"])
        self.addCleanup(c.close)
        port = harness.free_port()
        c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
        return port


    def chat(self, port, stream, **extra):
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Weather?"}],
                "temperature": 0, "max_tokens": 64, "stream": stream, **extra}
        if not stream:
            s, _, t = request(port, "POST", "/v1/chat/completions", body)
            self.assertEqual(s, 200, t)
            return json.loads(t)
        lines = curl_sse(port, "/v1/chat/completions", body)
        return [json.loads(l[6:]) for l in lines if l.startswith("data: {")]

    def messages(self, port, stream, **extra):
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Weather?"}],
                "temperature": 0, "max_tokens": 64, "stream": stream, **extra}
        if not stream:
            s, _, t = request(port, "POST", "/v1/messages", body)
            self.assertEqual(s, 200, t)
            return json.loads(t)
        lines = curl_sse(port, "/v1/messages", body)
        return [json.loads(l[6:]) for l in lines if l.startswith("data: ")]

    def test_growing_conversation_pays_for_the_new_turn_only(self):
        # An agent resends the whole conversation each turn (as Claude Code does through
        # /v1/messages). With a session id the worker keeps turn 1's KV (prompt and answer), and
        # turn 2's prompt continues it: only the new turn is prefilled. (The scripted model's
        # answer tokenizes back to the same ids, as a trained model's does.)
        port = self.serve("The sea is wide and deep.")
        headers = {"x-session-id": "http-growing"}
        turn1 = [{"role": "user", "content": "Tell me about the sea."}]
        body = {"model": "scripted", "max_tokens": 64, "temperature": 0, "messages": turn1}
        s, _, t = request(port, "POST", "/v1/messages", body, headers=headers)
        self.assertEqual(s, 200, t)
        first = json.loads(t)
        self.assertEqual(first["usage"]["cache_read_input_tokens"], 0)
        turn2 = turn1 + [{"role": "assistant", "content": first["content"]},
                         {"role": "user", "content": "And about the land?"}]
        s, _, t = request(port, "POST", "/v1/messages", dict(body, messages=turn2),
                          headers=headers)
        self.assertEqual(s, 200, t)
        second = json.loads(t)["usage"]
        # Turn 1's prompt and answer come from the cache, all but the answer's last token
        # (<|im_end|>: sampled, never run through the model); Anthropic's input_tokens are the
        # rest: that token, "\n", the new user turn and the generation prompt.
        kept = first["usage"]["input_tokens"] + first["usage"]["output_tokens"] - 1
        self.assertEqual(second["cache_read_input_tokens"], kept)
        self.assertGreater(second["input_tokens"], 0)
        self.assertLess(second["input_tokens"], kept)

    def test_reasoning(self):
        port = self.serve("<think>\nIt is sunny there.\n</think>\n\nParis: sunny.")
        r = self.chat(port, False)
        msg = r["choices"][0]["message"]
        self.assertEqual(msg["reasoning_content"], "\nIt is sunny there.\n")
        self.assertEqual(msg["content"], "Paris: sunny.")
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        chunks = self.chat(port, True)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas),
                         "\nIt is sunny there.\n")
        self.assertEqual("".join(d.get("content", "") for d in deltas), "Paris: sunny.")
        m = self.messages(port, False, thinking={"type": "enabled", "budget_tokens": 1024})
        self.assertEqual([b["type"] for b in m["content"]], ["thinking", "text"])
        self.assertEqual(m["content"][0]["thinking"], "\nIt is sunny there.\n")
        self.assertEqual(m["content"][1]["text"], "Paris: sunny.")
        self.assertEqual(m["stop_reason"], "end_turn")
        events = self.messages(port, True)
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        self.assertEqual(starts, ["thinking", "text"])
        kinds = {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"}
        self.assertEqual(kinds, {"thinking_delta", "text_delta"})

    def test_malformed_tool_call_is_text(self):
        script = '<tool_call>\n{"name": "get_weather", "arguments": {city}}\n</tool_call>'
        port = self.serve(script)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        r = self.chat(port, False, tools=tools)
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertEqual(r["choices"][0]["message"]["content"], script)
        self.assertNotIn("tool_calls", r["choices"][0]["message"])
        chunks = self.chat(port, True, tools=tools)
        self.assertEqual("".join(c["choices"][0]["delta"].get("content", "")
                                 for c in chunks if c["choices"]), script)
        m = self.messages(port, False, tools=[{"name": "get_weather", "input_schema": {}}])
        self.assertEqual(m["stop_reason"], "end_turn")
        self.assertEqual(m["content"], [{"type": "text", "text": script}])


if __name__ == "__main__":
    unittest.main(verbosity=2)

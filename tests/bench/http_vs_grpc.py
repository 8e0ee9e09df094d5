"""Streaming tokens/s through the frontend's HTTP API (/v1/completions, SSE) against its gRPC
API (moe.v1 Generate), same requests, at 1 and 64 concurrent streams, on one worker with the
built-in model. Both stream the same token-id prompt with ignore_eos and the same max_tokens,
so every stream generates exactly max_tokens tokens. Prints both rates and HTTP/gRPC.

Usage (the integration tests' model, written by `ctest -R integration_model`):
  MOE_BUILD_DIR=build /usr/bin/python3 tests/bench/http_vs_grpc.py [max_tokens] [rounds]
"""

import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

PROMPT = list(range(1, 33))


def grpc_stream(stub, pb, max_tokens):
    n = 0
    req = pb.GenerateRequest(model=harness.MODEL_NAME, token_ids=pb.TokenIds(ids=PROMPT),
                             max_tokens=max_tokens, stop=pb.StopParams(ignore_eos=True),
                             sampling=pb.SamplingParams(temperature=0))
    for msg in stub.Generate(req, timeout=600):
        n += len(msg.token_ids)
    return n


def http_stream(port, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps({
        "model": harness.MODEL_NAME, "prompt": PROMPT, "max_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}),
        headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    n = 0
    for line in r:  # chunked transfer decoded by http.client
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    conn.close()
    return n


def rate(fn, concurrency, rounds):
    """Tokens/s over `rounds` waves of `concurrency` streams started together."""
    total = [0] * concurrency

    def run(i):
        for _ in range(rounds):
            total[i] += fn()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(total) / (time.time() - t0), sum(total)


def main():
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    c = harness.Cluster(workers=1, worker_args=["--max_running=128"])
    try:
        port = harness.free_port()
        fe = c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
        stub = c.stub(fe)
        grpc_stream(stub, c.pb, 4)  # warm up both paths
        http_stream(port, 4)
        rows = []
        for conc in (1, 64):
            g, gn = rate(lambda: grpc_stream(stub, c.pb, max_tokens), conc, rounds)
            h, hn = rate(lambda: http_stream(port, max_tokens), conc, rounds)
            assert gn == hn == conc * rounds * max_tokens, (gn, hn)
            rows.append((conc, g, h))
        print(f"max_tokens={max_tokens} rounds={rounds} prompt={len(PROMPT)} tokens")
        print("| streams | gRPC tokens/s | HTTP tokens/s | HTTP / gRPC |")
        print("| --- | --- | --- | --- |")
        for conc, g, h in rows:
            print(f"| {conc} | {g:.1f} | {h:.1f} | {h / g:.3f} |")
    finally:
        c.close()


if __name__ == "__main__":
    main()

"""The deployment on the loopback: a frontend and two workers started from the rendered manifests
(their arguments and environment, see manifests.Launch for what differs off a cluster), probed
the way the kubelet probes them (grpc.health.v1 Check on the probe's port and service), used
through the public API with the ghz data file, and drained the way pods are terminated (preStop,
then SIGTERM, then exit within terminationGracePeriodSeconds).

Usage: loopback_test.py --kubectl K --overlay deploy/k8s/overlays/cpu
                        --binary moe-worker=PATH --binary moe-frontend=PATH
                        --proto-dir proto --protoc protoc --grpc-python-plugin P --data FILE"""
import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import health  # noqa: E402
import manifests  # noqa: E402

RESULTS = []


def step(name, ok, detail=""):
    RESULTS.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def load_stubs(args):
    out = tempfile.mkdtemp(prefix="deploy-stubs-")
    subprocess.run([args.protoc, f"-I{args.proto_dir}", f"--python_out={out}",
                    f"--grpc_out={out}", f"--plugin=protoc-gen-grpc={args.grpc_python_plugin}",
                    "moe/v1/moe.proto"], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("moe.v1.moe_pb2"), importlib.import_module("moe.v1.moe_pb2_grpc")


def request_from(data_file, pb, number, max_tokens=None):
    with open(data_file) as f:
        text = re.sub(r"\{\{[^}]*\}\}", str(number), f.read())
    request = json_format.Parse(text, pb.GenerateRequest())
    if max_tokens:
        request.max_tokens = max_tokens
    return request


def generate(stub, request, timeout=120):
    """Streams one Generate; returns (tokens, completion or None, status code, first-message
    event for callers that act mid-stream)."""
    tokens, completion = 0, None
    try:
        for response in stub.Generate(request, timeout=timeout):
            tokens += len(response.token_ids)
            if response.HasField("completion"):
                completion = response.completion
        return tokens, completion, grpc.StatusCode.OK
    except grpc.RpcError as e:
        return tokens, completion, e.code()


def reflection_lists(channel, symbol):
    """What ghz does without a .proto: server reflection v1alpha (Debian's gRPC serves only that
    one), list_services then file_containing_symbol. Returns (services listed, descriptor
    served), by looking for the names in the raw responses (no reflection stubs needed)."""
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    name = symbol.encode()
    # ServerReflectionRequest: list_services = 7 (string), file_containing_symbol = 4 (string).
    requests = [b"\x3a\x00", b"\x22" + bytes([len(name)]) + name]
    responses = list(call(iter(requests), timeout=10))
    return name in responses[0], b"GenerateRequest" in responses[1]


def probe_target(proc, container, kind):
    return f"127.0.0.1:{proc.port(container[kind]['grpc']['port'])}"


def drain(proc, pod_spec, container, name):
    """preStop (only `sleep N` is used by the manifests), SIGTERM, and the checks a pod's end
    must pass: readiness fails within 2 s, exit status 0 within the grace period."""
    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    pre = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    start = time.monotonic()
    if pre[:1] == ["sleep"]:
        time.sleep(float(pre[1]))
    target = probe_target(proc, container, "readinessProbe")
    proc.proc.send_signal(15)
    dropped = None
    while time.monotonic() - start < grace:
        if health.check(target, container["readinessProbe"]["grpc"].get("service", ""),
                        timeout=0.5) != health.SERVING:
            dropped = time.monotonic() - start
            break
        time.sleep(0.05)
    step(f"{name}: readiness fails after SIGTERM", dropped is not None and dropped < 2 + (float(pre[1]) if pre[:1] == ["sleep"] else 0),
         f"after {dropped:.2f} s" if dropped is not None else "never")
    try:
        code = proc.proc.wait(timeout=max(0.1, grace - (time.monotonic() - start)))
        took = time.monotonic() - start
        step(f"{name}: exits 0 within terminationGracePeriodSeconds {grace}", code == 0,
             f"status {code} after {took:.1f} s")
    except subprocess.TimeoutExpired:
        proc.proc.kill()
        step(f"{name}: exits within terminationGracePeriodSeconds {grace}", False,
             "still running: the kubelet would SIGKILL it")


def check_dns_frontend(args, pb, pb_grpc, binaries, logs, worker_port):
    """The multi-GPU overlay's frontend, which resolves the workers' headless Service: here its
    --workers_dns names localhost (127.0.0.1, where worker-0 listens) instead of
    moe-worker.<namespace>.svc.cluster.local. It must find the worker through DNS."""
    objects = manifests.render(args.kubectl, args.dns_overlay)
    (_, spec, c), = manifests.containers(objects, "moe-frontend")[:1]
    proc = manifests.Launch(c, objects, binaries, logs, "frontend-dns")
    dns = manifests.flag(proc.args, "workers_dns")
    proc.args = manifests.set_flag(proc.args, "workers_dns", f"localhost:{worker_port}")
    print(f"frontend-dns: --workers_dns={dns} -> localhost:{worker_port}")
    try:
        proc.start()
        ok, _, last = health.wait_until_passes(probe_target(proc, c, "startupProbe"), c["startupProbe"])
        if not step("frontend-dns: startupProbe passes", ok, f"last {last}"):
            print(proc.tail())
            return
        with grpc.insecure_channel(f"127.0.0.1:{proc.port(c['startupProbe']['grpc']['port'])}") as ch:
            stub = pb_grpc.InferenceStub(ch)
            found, deadline = [], time.monotonic() + 30
            while time.monotonic() < deadline:
                found = [(m.name, m.ready_workers) for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models]
                if any(ready > 0 for _, ready in found):
                    break
                time.sleep(0.5)
            step("frontend-dns: finds the worker through --workers_dns", any(r > 0 for _, r in found),
                 f"ListModels {found}")
        drain(proc, spec, c, "frontend-dns")
    finally:
        proc.stop()


def main():
    parser = argparse.ArgumentParser()
    for a in ("kubectl", "overlay", "proto-dir", "protoc", "grpc-python-plugin", "data"):
        parser.add_argument(f"--{a}", required=True)
    parser.add_argument("--binary", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--dns-overlay", help="overlay whose frontend finds workers by DNS "
                        "(--workers_dns): started too, pointed at localhost")
    args = parser.parse_args()
    pb, pb_grpc = load_stubs(args)

    objects = manifests.render(args.kubectl, args.overlay)
    (_, wspec, wc), = manifests.containers(objects, "moe-worker")[:1]
    (_, fspec, fc), = manifests.containers(objects, "moe-frontend")[:1]
    logs = tempfile.mkdtemp(prefix="deploy-loopback-")
    binaries = manifests.parse_binaries(args.binary)
    workers = [manifests.Launch(wc, objects, binaries, logs, f"worker-{i}") for i in (0, 1)]
    frontend = manifests.Launch(fc, objects, binaries, logs, "frontend")
    worker_port = wc["readinessProbe"]["grpc"]["port"]
    # The one flag that cannot be the manifests' own: on a cluster the frontend resolves the
    # headless Service (or, in the CPU pod, its neighbour at 127.0.0.1); here the two workers
    # listen on two free ports of one address.
    frontend.args = manifests.set_flag(
        frontend.args, "workers", ",".join(f"127.0.0.1:{w.port(worker_port)}" for w in workers))
    print("frontend:", " ".join(frontend.args))
    print("worker:  ", " ".join(workers[0].args))

    try:
        for proc, c in [(w, wc) for w in workers] + [(frontend, fc)]:
            proc.start()
        for proc, c in [(w, wc) for w in workers] + [(frontend, fc)]:
            ok, waited, last = health.wait_until_passes(probe_target(proc, c, "startupProbe"),
                                                        c["startupProbe"])
            if not step(f"{proc.name}: startupProbe passes", ok, f"{waited:.1f} s, last {last}"):
                print(proc.tail())
                return 1
            for kind in ("readinessProbe", "livenessProbe"):
                ok, waited, last = health.wait_until_passes(probe_target(proc, c, kind), c[kind])
                step(f"{proc.name}: {kind} passes (service '{c[kind]['grpc'].get('service', '')}')",
                     ok, f"last {last}")

        channel = grpc.insecure_channel(f"127.0.0.1:{frontend.port(fc['readinessProbe']['grpc']['port'])}")
        stub = pb_grpc.InferenceStub(channel)
        served_by = set()
        for n in range(4):
            tokens, completion, code = generate(stub, request_from(args.data, pb, n + 1))
            step(f"Generate #{n + 1} through the frontend", code == grpc.StatusCode.OK and
                 completion is not None and tokens > 0,
                 f"{code.name}, {tokens} tokens, worker {completion.worker if completion else '?'}")
            if completion:
                served_by.add(completion.worker)
        print(f"served by {sorted(served_by)}")
        try:
            listed, described = reflection_lists(channel, "moe.v1.Inference")
            step("reflection lists moe.v1.Inference and serves its descriptor (ghz *-reflect)",
                 listed and described, f"listed {listed}, descriptor {described}")
        except grpc.RpcError as e:
            step("reflection answers (ghz *-reflect)", False, e.code().name)

        if args.dns_overlay:
            check_dns_frontend(args, pb, pb_grpc, binaries, logs, workers[0].port(worker_port))

        drain(workers[1], wspec, wc, "worker-1")
        ok, _, last = health.wait_until_passes(probe_target(frontend, fc, "readinessProbe"),
                                               fc["readinessProbe"])
        step("frontend stays ready with one worker left", ok, f"last {last}")
        tokens, completion, code = generate(stub, request_from(args.data, pb, 11))
        step("Generate after worker-1 left", code == grpc.StatusCode.OK and completion is not None,
             f"{code.name}, {tokens} tokens")

        # Drain the frontend with a stream in flight: it must finish, new calls are refused.
        first = threading.Event()
        outcome = {}

        def long_stream():
            tokens = 0
            try:
                for response in stub.Generate(request_from(args.data, pb, 21, max_tokens=512),
                                              timeout=120):
                    tokens += len(response.token_ids)
                    first.set()
                    if response.HasField("completion"):
                        outcome["completion"] = response.completion
                outcome["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                outcome["code"] = e.code()
            outcome["tokens"] = tokens
            first.set()

        thread = threading.Thread(target=long_stream)
        thread.start()
        first.wait(60)
        drain_thread = threading.Thread(target=drain, args=(frontend, fspec, fc, "frontend"))
        drain_thread.start()
        time.sleep(0.2)
        _, _, refused = generate(stub, request_from(args.data, pb, 31), timeout=10)
        # Only meaningful while the drain waits for the long stream (once it has ended the
        # server shuts down and a late call may see that instead).
        streaming = "code" not in outcome
        step("frontend refuses new calls while draining (UNAVAILABLE)",
             refused == grpc.StatusCode.UNAVAILABLE and streaming,
             f"{refused.name}" + ("" if streaming else "; the long stream had already ended: "
                                  "the check needs a longer one"))
        thread.join(120)
        drain_thread.join()
        step("in-flight stream completes during the frontend's drain",
             outcome.get("code") == grpc.StatusCode.OK and "completion" in outcome,
             f"{outcome.get('code')}, {outcome.get('tokens')} tokens")
        channel.close()

        drain(workers[0], wspec, wc, "worker-0")
    finally:
        for proc in [frontend] + workers:
            proc.stop()
    failed = [r for r in RESULTS if not r[1]]
    if failed:
        for proc in [frontend] + workers:
            print(f"--- {proc.name} log tail ---\n{proc.tail()}")
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Process harness for the integration tests: starts real moe-worker and moe-frontend binaries
on loopback with free ports, generates Python stubs at test time (protoc + Debian's
grpc_python_plugin), and reads /metrics. Run with /usr/bin/python3 (Debian's grpcio)."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

BUILD_DIR = os.environ.get("MOE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
SOURCE_DIR = os.environ.get("MOE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
WORKER_BIN = os.path.join(BUILD_DIR, "bin", "moe-worker")
FRONTEND_BIN = os.path.join(BUILD_DIR, "bin", "moe-frontend")
OFFLINE_BIN = os.path.join(BUILD_DIR, "tests", "integration", "moe_offline_tokens")
MODEL_DIR = os.environ.get("MOE_TEST_MODEL", os.path.join(BUILD_DIR, "tests", "integration", "model"))
MODEL_NAME = "model"  # the directory's base name, as moe-worker names it

_STUBS_DIR = None


def load_stubs():
    """Generates moe.v1, the worker API, health and reflection stubs once; returns modules."""
    global _STUBS_DIR
    if _STUBS_DIR is None:
        _STUBS_DIR = tempfile.mkdtemp(prefix="moe-stubs-")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run(
            ["protoc", "-I", os.path.join(SOURCE_DIR, "proto"), "-I", os.path.join(here, "protos"),
             "--python_out", _STUBS_DIR, "--grpc_python_out", _STUBS_DIR,
             "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
             "moe/v1/moe.proto", "moe/internal/v1/worker.proto", "grpc_std/health.proto",
             "grpc_std/reflection.proto"], check=True)
        sys.path.insert(0, _STUBS_DIR)
    from moe.v1 import moe_pb2, moe_pb2_grpc  # noqa: E402
    # Under grpc_std/ (proto package grpc.health.v1): a grpc/ folder would shadow grpcio.
    from grpc_std import health_pb2, health_pb2_grpc  # noqa: E402
    return moe_pb2, moe_pb2_grpc, health_pb2, health_pb2_grpc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed_cert(directory, name):
    """A key and a certificate for localhost (one day) in `directory`: (key, cert, cert bytes)."""
    key, cert = os.path.join(directory, name + ".key"), os.path.join(directory, name + ".crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    with open(cert, "rb") as f:
        return key, cert, f.read()


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def metric(text, name, labels=None):
    """Value of one sample in Prometheus text format (labels: dict that must match), or None."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in (labels or {}).items()):
            return float(m.group(3))
    return None


def wait_for(predicate, timeout=20, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # the process may still be starting
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Process:
    def __init__(self, name, argv, log_dir):
        self.name, self.argv = name, argv
        self.log_path = os.path.join(log_dir, name + ".log")
        self.start()

    def start(self):
        if getattr(self, "log", None) is not None:
            self.log.close()
        self.log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)

    def signal(self, sig):
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait(self, timeout):
        return self.popen.wait(timeout=timeout)

    def stop(self):
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self.log.close()

    def tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


class Worker:
    def __init__(self, index, log_dir, extra_args=(), wrap=()):
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.name = f"worker{index}"
        self.argv = [WORKER_BIN, f"--model={MODEL_DIR}", f"--listen={self.address}",
                     f"--metrics_listen=127.0.0.1:{self.metrics_port}", f"--name={self.name}",
                     "--threads=1", "--drain_seconds=10", *extra_args]
        # wrap: a command the worker runs under (env, unshare ...), which must exec it.
        self.process = Process(self.name, [*wrap, *self.argv], log_dir)

    def metrics(self):
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")


class Frontend:
    def __init__(self, name, workers, log_dir, extra_args=()):
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.argv = [FRONTEND_BIN, f"--listen={self.address}",
                     f"--metrics_listen=127.0.0.1:{self.metrics_port}", "--health_seconds=0.2",
                     "--drain_seconds=10", *extra_args]
        if workers:
            self.argv.append("--workers=" + ",".join(w.address for w in workers))
        self.process = Process(name, self.argv, log_dir)

    def metrics(self):
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")


class Cluster:
    """Workers on loopback and any number of frontends in front of them."""

    def __init__(self, workers=2, worker_args=(), worker_wrap=()):
        import grpc
        self.grpc = grpc
        self.pb, self.pb_grpc, self.health_pb, self.health_grpc = load_stubs()
        self.log_dir = tempfile.mkdtemp(prefix="moe-it-")
        print(f"process logs: {self.log_dir}", file=sys.stderr)
        self.workers = [Worker(i, self.log_dir, worker_args, worker_wrap) for i in range(workers)]
        self.frontends = []

    def add_frontend(self, extra_args=(), ready_workers=None, tls_root=None, static=True):
        fe = Frontend(f"frontend{len(self.frontends)}", self.workers if static else [],
                      self.log_dir, extra_args)
        fe.tls_root = tls_root  # PEM of the CA that signed --tls_cert, for clients
        self.frontends.append(fe)
        self.wait_ready(fe, len(self.workers) if ready_workers is None else ready_workers)
        return fe

    def channel(self, fe, **options):
        opts = [("grpc.max_send_message_length", 64 << 20)] + list(options.items())
        if getattr(fe, "tls_root", None):
            creds = self.grpc.ssl_channel_credentials(root_certificates=fe.tls_root)
            opts.append(("grpc.ssl_target_name_override", "localhost"))
            return self.grpc.secure_channel(fe.address, creds, options=opts)
        return self.grpc.insecure_channel(fe.address, options=opts)

    def stub(self, fe):
        return self.pb_grpc.InferenceStub(self.channel(fe))

    def ready_workers(self, fe):
        models = self.stub(fe).ListModels(self.pb.ListModelsRequest(), timeout=2).models
        return sum(m.ready_workers for m in models if m.name == MODEL_NAME)

    def wait_ready(self, fe, n, timeout=60):
        # From /metrics and health, which need no auth token.
        def ready():
            up = metric(fe.metrics(), "moe_frontend_workers", {"state": "up"})
            health = self.health_grpc.HealthStub(self.channel(fe)).Check(
                self.health_pb.HealthCheckRequest(service=""), timeout=2)
            return up is not None and up >= n and health.status == 1
        wait_for(ready, timeout=timeout,
                 what=f"{n} ready workers behind {fe.address}\n{self.logs()}")

    def logs(self):
        procs = [w.process for w in self.workers] + [f.process for f in self.frontends]
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.tail()}" for p in procs)

    def close(self):
        for p in [f.process for f in self.frontends] + [w.process for w in self.workers]:
            p.stop()


def offline_tokens(prompt_ids, max_tokens, temperature=0.0, seed=0, ignore_eos=True, top_p=1.0,
                   model_dir=None):
    """The offline engine's tokens for the same input (moe_offline_tokens)."""
    import json
    out = subprocess.run(
        [OFFLINE_BIN, f"--model={model_dir or MODEL_DIR}", "--prompt_ids=" + ",".join(map(str, prompt_ids)),
         f"--max_tokens={max_tokens}", f"--temperature={temperature}", f"--seed={seed}",
         f"--top_p={top_p}", f"--ignore_eos={'true' if ignore_eos else 'false'}"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["token_ids"]


def generate(stub, pb, timeout=30, metadata=None, **fields):
    """Runs one Generate call; returns (token_ids, text, last message)."""
    req = pb.GenerateRequest(model=fields.pop("model", MODEL_NAME), **fields)
    ids, text, last = [], "", None
    for msg in stub.Generate(req, timeout=timeout, metadata=metadata):
        ids.extend(msg.token_ids)
        text += msg.text
        last = msg
    return ids, text, last


class ClusterTestCase(unittest.TestCase):
    """A test case with a scratch directory (self.tmp, removed after) and at most one Cluster
    (self.c, closed after)."""

    def setUp(self):
        self.c = None
        self.tmp = tempfile.mkdtemp(prefix="moe-it-case-")

    def tearDown(self):
        if self.c is not None:
            self.c.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def cluster(self, workers=1, worker_args=(), worker_wrap=()):
        self.c = Cluster(workers=workers, worker_args=worker_args, worker_wrap=worker_wrap)
        return self.c

    def import_store(self, *args, name="store"):
        """moe-import of the test model into self.tmp/name; returns the store's path."""
        store = os.path.join(self.tmp, name)
        subprocess.run([os.path.join(BUILD_DIR, "bin", "moe-import"), f"--model_dir={MODEL_DIR}",
                        f"--store_dir={store}", *args], check=True, capture_output=True)
        return store

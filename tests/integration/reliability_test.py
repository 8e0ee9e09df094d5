"""Reliability and security (issue 29): the processes fail closed and never report ready while
unable to serve. A worker that cannot serve does not start or turns NOT_SERVING; the frontend
retries a worker fault once elsewhere; empty token files, ports in use and idle /metrics
connections are handled; the worker API takes a token the frontend presents."""

import glob
import os
import socket
import subprocess
import time
import unittest

import grpc

import harness
from harness import generate, metric, wait_for

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def run_to_exit(argv, timeout=60):
    """Runs a process that must refuse to start; returns (exit code, output)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


class ReliabilityTest(harness.ClusterTestCase):
    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def health(self, address, service):
        c = self.c
        h = c.health_grpc.HealthStub(grpc.insecure_channel(address))
        return h.Check(c.health_pb.HealthCheckRequest(service=service), timeout=2).status

    def test_worker_whose_kv_budget_holds_no_block_exits_nonzero(self):
        code, out = run_to_exit([harness.WORKER_BIN, f"--model={harness.MODEL_DIR}",
                                 "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                 "--threads=1", "--kv_budget=1KiB"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("holds no block", out)

    def test_empty_auth_token_file_refuses_to_start(self):
        for name, text in (("empty", ""), ("blank", " \n\t\n")):
            path = self.write(name, text)
            code, out = run_to_exit([harness.FRONTEND_BIN, "--listen=127.0.0.1:0",
                                     "--metrics_listen=127.0.0.1:0", "--workers=127.0.0.1:1",
                                     f"--auth_token_file={path}"])
            self.assertEqual(code, 1, out)
            self.assertIn("holds no token", out)
            code, out = run_to_exit([harness.WORKER_BIN, f"--model={harness.MODEL_DIR}",
                                     "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                     "--threads=1", f"--auth_token_file={path}"])
            self.assertEqual(code, 1, out)
            self.assertIn("holds no token", out)

    def test_second_process_on_a_port_in_use_fails_to_start(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()
        code, out = run_to_exit([harness.WORKER_BIN, f"--model={harness.MODEL_DIR}",
                                 f"--listen={c.workers[0].address}",
                                 "--metrics_listen=127.0.0.1:0", "--threads=1"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("cannot listen", out)
        code, out = run_to_exit([harness.FRONTEND_BIN, f"--listen={fe.address}",
                                 "--metrics_listen=127.0.0.1:0",
                                 f"--workers={c.workers[0].address}"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("cannot listen", out)

    def test_idle_connections_do_not_block_metrics(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()
        for port in (c.workers[0].metrics_port, fe.metrics_port):
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
            try:
                start = time.time()
                text = harness.http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                self.assertLess(time.time() - start, 3.0)
                self.assertIn("# TYPE", text)
            finally:
                for s in idle:
                    s.close()

    def test_corrupt_store_worker_turns_not_serving_and_requests_retry(self):
        store = self.import_store()
        # Garbage over every blob's bytes: every expert read fails its checksum (DATA_LOSS).
        for path in glob.glob(os.path.join(store, "blobs", "*.blob")):
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                for offset in range(0, size, 4096):
                    f.seek(offset)
                    f.write(b"garbage!" * 64)
        c = self.cluster(workers=1)
        bad = harness.Worker(1, c.log_dir, [f"--model={store}",
                                            f"--model_name={harness.MODEL_NAME}",
                                            "--max_consecutive_faults=2"])
        c.workers.append(bad)
        fe = c.add_frontend()
        stub = c.stub(fe)
        # Every call succeeds: a call that the bad worker fails is retried once on the good one.
        for _ in range(6):
            _, _, last = generate(stub, c.pb, token_ids=c.pb.TokenIds(ids=PROMPT), max_tokens=2)
            self.assertEqual(last.completion.worker, c.workers[0].name)
        self.assertGreater(metric(fe.metrics(), "moe_frontend_retries_total"), 0)
        # The bad worker says it cannot serve, with the reason, and the frontend stops using it.
        serving = c.health_pb.HealthCheckResponse.SERVING
        wait_for(lambda: self.health(bad.address, "readiness") != serving,
                 what="the corrupt worker's readiness to drop")
        self.assertNotEqual(self.health(bad.address, ""), serving)
        self.assertEqual(self.health(bad.address, "liveness"), serving)
        self.assertEqual(metric(bad.metrics(), "moe_worker_serving"), 0)
        wait_for(lambda: metric(fe.metrics(), "moe_frontend_workers", {"state": "down"}) == 1,
                 what="the frontend to mark the corrupt worker down")
        with open(bad.process.log_path, "rb") as f:
            self.assertIn(b"not serving", f.read())

    def test_worker_token(self):
        token = self.write("token", "s3cret\n")
        c = self.cluster(workers=1, worker_args=[f"--auth_token_file={token}"])
        # Without the token the frontend cannot even poll the worker.
        fe = c.add_frontend(ready_workers=0)
        time.sleep(1.0)
        self.assertEqual(metric(fe.metrics(), "moe_frontend_workers", {"state": "up"}), 0)
        fe2 = c.add_frontend(extra_args=[f"--worker_token_file={token}"])
        _, _, last = generate(c.stub(fe2), c.pb, token_ids=c.pb.TokenIds(ids=PROMPT), max_tokens=2)
        self.assertEqual(last.completion.worker, c.workers[0].name)
        # Straight to the worker without it: refused.
        from moe.internal.v1 import worker_pb2, worker_pb2_grpc
        stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(c.workers[0].address))
        with self.assertRaises(grpc.RpcError) as cm:
            stub.GetInfo(worker_pb2.GetInfoRequest(), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        info = stub.GetInfo(worker_pb2.GetInfoRequest(), timeout=5,
                            metadata=[("authorization", "bearer s3cret")])
        self.assertTrue(info.serving)

    def test_bearer_scheme_is_case_insensitive(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend(extra_args=["--auth_token=tok"])
        stub = c.stub(fe)
        for scheme in ("Bearer", "bearer", "BEARER"):
            _, _, last = generate(stub, c.pb, token_ids=c.pb.TokenIds(ids=PROMPT), max_tokens=1,
                                  metadata=[("authorization", f"{scheme} tok")])
            self.assertTrue(last.HasField("completion"), scheme)
        with self.assertRaises(grpc.RpcError) as cm:
            generate(stub, c.pb, token_ids=c.pb.TokenIds(ids=PROMPT), max_tokens=1,
                     metadata=[("authorization", "Basic tok")])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


    def test_store_served_under_its_import_name(self):
        store = self.import_store("--model=imported-name", name="some-dir")
        c = self.cluster(workers=0)
        c.workers.append(harness.Worker(0, c.log_dir, [f"--model={store}"]))
        fe = c.add_frontend()
        info = c.stub(fe).GetModel(c.pb.GetModelRequest(model="imported-name"), timeout=5)
        self.assertEqual(info.name, "imported-name")

    def test_top_logprobs_without_logprobs_returns_none(self):
        c = self.cluster(workers=1)
        stub = c.stub(c.add_frontend())
        got = []
        for msg in stub.Generate(c.pb.GenerateRequest(
                model=harness.MODEL_NAME, token_ids=c.pb.TokenIds(ids=PROMPT), max_tokens=3,
                logprobs=False, top_logprobs=5), timeout=30):
            got.extend(msg.logprobs)
        self.assertEqual(len(got), 0)

    def test_get_model_is_not_found_while_no_worker_is_up(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()
        stub = c.stub(fe)
        stub.GetModel(c.pb.GetModelRequest(model=harness.MODEL_NAME), timeout=5)
        c.workers[0].process.stop()
        wait_for(lambda: metric(fe.metrics(), "moe_frontend_workers", {"state": "up"}) == 0,
                 what="the frontend to see the worker down")
        with self.assertRaises(grpc.RpcError) as cm:
            stub.GetModel(c.pb.GetModelRequest(model=harness.MODEL_NAME), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)


    def test_health_watch_sends_only_changes(self):
        c = self.cluster(workers=1)
        fe = c.add_frontend()  # polls every 0.2 s
        h = c.health_grpc.HealthStub(c.channel(fe))
        seen = []
        try:
            for msg in h.Watch(c.health_pb.HealthCheckRequest(service="readiness"), timeout=1.5):
                seen.append(msg.status)
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertEqual(seen, [c.health_pb.HealthCheckResponse.SERVING])


if __name__ == "__main__":
    unittest.main(verbosity=2)

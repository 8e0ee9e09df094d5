"""Fault tests: a worker killed mid-run fails only its own streams (UNAVAILABLE), the frontend
routes around it and takes it back when it returns; SIGTERM drains a worker and a frontend."""

import signal
import threading
import time
import unittest

import grpc

import harness
from harness import generate, metric, wait_for

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


class FaultTest(unittest.TestCase):
    def setUp(self):
        self.c = harness.Cluster(workers=2)
        self.pb = self.c.pb
        try:
            self.fe = self.c.add_frontend()
            self.stub = self.c.stub(self.fe)
            info = self.stub.GetModel(self.pb.GetModelRequest(model=harness.MODEL_NAME), timeout=5)
            self.long = min(300, info.context_length - len(PROMPT) - 1)
        except Exception:
            self.c.close()
            raise

    def tearDown(self):
        self.c.close()

    def start_streams(self, n, max_tokens):
        """Starts n streams in threads; returns (results, threads, first-token events)."""
        results, started = [None] * n, [threading.Event() for _ in range(n)]

        def run(i):
            req = self.pb.GenerateRequest(model=harness.MODEL_NAME,
                                          token_ids=self.pb.TokenIds(ids=PROMPT),
                                          max_tokens=max_tokens,
                                          stop=self.pb.StopParams(ignore_eos=True))
            count, last = 0, None
            try:
                for msg in self.stub.Generate(req, timeout=120):
                    count += len(msg.token_ids)
                    last = msg
                    started[i].set()
                results[i] = ("ok", count, last.completion.worker)
            except grpc.RpcError as e:
                results[i] = (e.code(), count, e.details())
            started[i].set()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        return results, threads, started

    def test_killed_worker_fails_only_its_streams_and_comes_back(self):
        results, threads, started = self.start_streams(4, self.long)
        for e in started:
            self.assertTrue(e.wait(30))
        victim = self.c.workers[0]
        victim.process.signal(signal.SIGKILL)
        for t in threads:
            t.join(120)
        failed = [r for r in results if r[0] != "ok"]
        ok = [r for r in results if r[0] == "ok"]
        # Least-loaded routing spreads 4 streams 2 + 2: the victim's fail, the others finish.
        self.assertEqual(len(failed), 2, results)
        for code, _, details in failed:
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, details)
        for _, count, worker in ok:
            self.assertEqual(count, self.long)
            self.assertEqual(worker, self.c.workers[1].name)
        # Routed around: new calls succeed while the victim is down.
        for _ in range(3):
            _, _, last = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                  max_tokens=2)
            self.assertEqual(last.completion.worker, self.c.workers[1].name)
        wait_for(lambda: metric(self.fe.metrics(), "moe_frontend_workers", {"state": "down"}) == 1,
                 what="the frontend to see the worker down")
        # The worker returns on the same address and is taken back.
        victim.process.start()
        self.c.wait_ready(self.fe, 2)
        seen = set()
        for _ in range(6):
            _, _, last = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                  max_tokens=2)
            seen.add(last.completion.worker)
        self.assertEqual(seen, {w.name for w in self.c.workers})

    def test_retry_before_first_token(self):
        # A worker that is down but not yet noticed: the call goes elsewhere, not to the client.
        self.c.workers[0].process.signal(signal.SIGKILL)
        self.c.workers[0].process.wait(10)
        for _ in range(4):
            _, _, last = generate(self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT),
                                  max_tokens=2)
            self.assertEqual(last.completion.worker, self.c.workers[1].name)

    def test_sigterm_drains_worker(self):
        results, threads, started = self.start_streams(2, self.long)
        for e in started:
            self.assertTrue(e.wait(30))
        for w in self.c.workers:
            w.process.signal(signal.SIGTERM)
        # Draining: readiness drops (liveness stays) and the frontend stops routing there.
        h = self.c.health_grpc.HealthStub(grpc.insecure_channel(self.c.workers[0].address))
        check = lambda s: h.Check(self.c.health_pb.HealthCheckRequest(service=s), timeout=2).status
        wait_for(lambda: check("readiness") == self.c.health_pb.HealthCheckResponse.NOT_SERVING,
                 what="worker readiness to drop")
        self.assertEqual(check("liveness"), self.c.health_pb.HealthCheckResponse.SERVING)
        wait_for(lambda: metric(self.fe.metrics(), "moe_frontend_workers", {"state": "up"}) == 0,
                 what="workers to report draining")
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: generate(
            self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=2))
        for t in threads:
            t.join(60)
        self.assertTrue(all(r[0] == "ok" and r[1] == self.long for r in results), results)
        for w in self.c.workers:
            self.assertEqual(w.process.wait(15), 0)

    def test_sigterm_drains_frontend(self):
        results, threads, started = self.start_streams(1, 200)
        self.assertTrue(started[0].wait(30))
        self.fe.process.signal(signal.SIGTERM)
        time.sleep(0.3)
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: generate(
            self.stub, self.pb, token_ids=self.pb.TokenIds(ids=PROMPT), max_tokens=2, timeout=5))
        threads[0].join(60)
        self.assertEqual(results[0][:2], ("ok", 200))
        self.assertEqual(self.fe.process.wait(15), 0)

    def assertCode(self, code, call):
        with self.assertRaises(grpc.RpcError) as cm:
            call()
        self.assertEqual(cm.exception.code(), code, cm.exception.details())


if __name__ == "__main__":
    unittest.main(verbosity=2)

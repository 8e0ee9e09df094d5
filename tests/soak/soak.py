"""Soak: 64 Generate streams through moe-frontend -> moe-worker (CPU build, loopback) for a while,
with random cancels and deadlines. Every SAMPLE seconds it records both processes' RSS and the
worker's KV cache bytes in use (/metrics). Passes when no call ends with an unexpected status,
every OK call ends with a completion, RSS is flat after warm-up (growth over the measured window
below max(8 MiB, 5 %)), and the KV in use returns to 0 once the load stops.

The worker's KV budget is small (--kv_budget, 4 MiB) so that warm-up fills it; preemptions and
prefix-cache evictions are part of the load.

Usage (Debian's /usr/bin/python3; the integration model must exist, see tests/integration):
  MOE_BUILD_DIR=build MOE_TEST_MODEL=build/tests/integration/model \\
    /usr/bin/python3 tests/soak/soak.py --seconds=600 --sample=10 --out=/tmp/soak
Writes <out>/samples.csv and, when matplotlib is installed, <out>/soak.png."""

import argparse
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

ACCEPTED = {"OK", "CANCELLED", "DEADLINE_EXCEEDED"}


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def stream_loop(cluster, fe, vocab, seed, stop, stats, lock):
    rng = random.Random(seed)
    stub = cluster.stub(fe)
    pb = cluster.pb
    while not stop.is_set():
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 48))]
        req = pb.GenerateRequest(model=harness.MODEL_NAME, token_ids=pb.TokenIds(ids=ids),
                                 max_tokens=rng.randrange(1, 48),
                                 sampling=pb.SamplingParams(temperature=rng.choice([0.0, 0.8]),
                                                            seed=rng.randrange(1 << 30)),
                                 stop=pb.StopParams(ignore_eos=True))
        kind = rng.random()
        timeout = rng.uniform(0.05, 1.0) if kind < 0.2 else 60.0  # 20 %: a short deadline
        call = stub.Generate(req, timeout=timeout)
        timer = None
        if 0.2 <= kind < 0.4:  # 20 %: the client cancels mid-stream
            timer = threading.Timer(rng.uniform(0.0, 0.5), call.cancel)
            timer.start()
        code, completed = "OK", False
        try:
            for msg in call:
                if msg.HasField("completion"):
                    completed = True
        except cluster.grpc.RpcError as e:
            code = e.code().name
        if timer:
            timer.cancel()
        with lock:
            stats[code] = stats.get(code, 0) + 1
            if code == "OK" and not completed:
                stats["OK_WITHOUT_COMPLETION"] = stats.get("OK_WITHOUT_COMPLETION", 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=None, help="seconds; default a third")
    ap.add_argument("--out", default=None)
    # Small, so that the prefix cache has filled the KV pool (touched every page of it) during
    # warm-up: a 1 GiB pool fills at the rate new prompts arrive and reads as RSS growth for hours.
    ap.add_argument("--kv_budget", default="4MiB")
    args = ap.parse_args()
    warmup = args.seconds / 3 if args.warmup is None else args.warmup
    out = args.out or os.path.join(os.environ.get("MOE_BUILD_DIR", "build"), "soak")
    os.makedirs(out, exist_ok=True)

    cluster = harness.Cluster(workers=1, worker_args=[f"--kv_budget={args.kv_budget}"])
    failures = []
    try:
        # The production health interval (the harness polls every 0.2 s): one missed poll still
        # marks the worker down (issue 29, item 4), the soak counts what that costs.
        fe = cluster.add_frontend(extra_args=["--health_seconds=1"])
        worker, frontend = cluster.workers[0], fe
        vocab = next(m.vocab_size for m in cluster.stub(fe).ListModels(
            cluster.pb.ListModelsRequest(), timeout=5).models if m.name == harness.MODEL_NAME)
        stop, lock, stats = threading.Event(), threading.Lock(), {}
        threads = [threading.Thread(target=stream_loop,
                                    args=(cluster, fe, vocab, i, stop, stats, lock),
                                    daemon=True) for i in range(args.streams)]
        for t in threads:
            t.start()
        samples = []  # (t, worker rss, frontend rss, kv bytes in use)
        start = time.time()
        while True:
            now = time.time() - start
            kv = harness.metric(worker.metrics(), "moe_kv_cache_used_bytes") or 0
            samples.append((now, rss_bytes(worker.process.popen.pid),
                            rss_bytes(frontend.process.popen.pid), kv))
            print(f"t={now:6.1f}s worker_rss={samples[-1][1] >> 20}MiB "
                  f"frontend_rss={samples[-1][2] >> 20}MiB kv_used={int(kv)}B calls={dict(stats)}",
                  flush=True)
            if now >= args.seconds:
                break
            time.sleep(min(args.sample, max(0.0, args.seconds - now)))
        stop.set()
        for t in threads:
            t.join(timeout=90)
        harness.wait_for(
            lambda: (harness.metric(worker.metrics(), "moe_kv_cache_used_bytes") or 0) == 0,
            timeout=30, what="KV in use back to 0 after the load")

        with open(os.path.join(out, "samples.csv"), "w") as f:
            f.write("seconds,worker_rss_bytes,frontend_rss_bytes,kv_used_bytes\n")
            for s in samples:
                f.write(",".join(str(int(v)) if i else f"{v:.1f}" for i, v in enumerate(s)) + "\n")
        bad = {k: v for k, v in stats.items() if k not in ACCEPTED}
        if bad:
            failures.append(f"unexpected call outcomes: {bad}")
        if stats.get("OK", 0) == 0:
            failures.append("no call completed")
        measured = [s for s in samples if s[0] >= warmup]
        if len(measured) < 2:
            failures.append("too few samples after warm-up")
        for i, name in ((1, "worker"), (2, "frontend")):
            if not measured:
                break
            base, peak = measured[0][i], max(s[i] for s in measured)
            growth = peak - base
            allowed = max(8 << 20, base // 20)
            print(f"{name}: RSS {base >> 20} MiB after warm-up, peak {peak >> 20} MiB "
                  f"(growth {growth >> 10} KiB, allowed {allowed >> 10} KiB)")
            if growth > allowed:
                failures.append(f"{name} RSS grew {growth >> 20} MiB after warm-up")
        print(f"calls: {stats}; KV in use back to 0 after the load")
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
            ts = [s[0] for s in samples]
            ax[0].plot(ts, [s[1] / 2**20 for s in samples], label="moe-worker")
            ax[0].plot(ts, [s[2] / 2**20 for s in samples], label="moe-frontend")
            ax[0].set_ylabel("RSS (MiB)")
            ax[0].axvline(warmup, color="gray", linestyle=":")
            ax[0].legend()
            ax[1].plot(ts, [s[3] / 2**20 for s in samples], color="tab:green")
            ax[1].set_ylabel("KV in use (MiB)")
            ax[1].set_xlabel("seconds")
            fig.savefig(os.path.join(out, "soak.png"), dpi=80)
        except ImportError:
            pass
    finally:
        cluster.close()
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures) + "\n" + cluster.logs())
        sys.exit(1)
    print("soak: ok")


if __name__ == "__main__":
    main()

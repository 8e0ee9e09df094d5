"""Checks the PromQL of deploy/ against the tools and against the service.

  check_queries.py syntax --promtool P --dashboard D --rules R...
      Every dashboard query (Grafana variables replaced) parses: promtool check rules on a
      rules file made of them.
  check_queries.py names --dashboard D --rules R... --kubectl K --overlay O [--hpa-overlay O...]
                         (--binary moe-worker=PATH --binary moe-frontend=PATH | --registry SOURCE...)
      Every metric name that a dashboard query, a rule or the HPA reads is one the service
      exports, or a recording rule's output, or one Prometheus makes itself (up).
      --binary: start the overlay's moe-worker and moe-frontend from the build tree with the
      manifests' arguments and read their /metrics (the real thing). --registry: read the names
      from the sources that register them instead (service/metrics/worker_metrics.cc and
      frontend_metrics.cc; when the binaries are not built)."""
import argparse
import os
import subprocess
import sys
import tempfile
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import health  # noqa: E402
import manifests  # noqa: E402
import queries  # noqa: E402


def check_syntax(args):
    found = queries.dashboard_queries(args.dashboard)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(found)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    try:
        result = subprocess.run([args.promtool, "check", "rules", f.name], capture_output=True,
                                text=True)
    finally:
        os.unlink(f.name)
    print(result.stdout + result.stderr)
    if result.returncode != 0:
        for i, (where, expr) in enumerate(found):
            print(f"dashboard:query_{i} = {where}: {expr}")
        return 1
    print(f"{len(found)} dashboard queries parse")
    return 0


def scrape_launched(args):
    """Starts one worker and one frontend as the overlay runs them; returns their /metrics."""
    objects = manifests.render(args.kubectl, args.overlay)
    (_, wspec, wc), = manifests.containers(objects, "moe-worker")[:1]
    (_, fspec, fc), = manifests.containers(objects, "moe-frontend")[:1]
    logs = tempfile.mkdtemp(prefix="deploy-metrics-")
    binaries = manifests.parse_binaries(args.binary)
    worker = manifests.Launch(wc, objects, binaries, logs, "worker")
    frontend = manifests.Launch(fc, objects, binaries, logs, "frontend")
    worker_grpc = wc["startupProbe"]["grpc"]["port"]
    frontend.args = manifests.set_flag(frontend.args, "workers",
                                       f"127.0.0.1:{worker.port(worker_grpc)}")
    texts = []
    try:
        for proc, c in ((worker.start(), wc), (frontend.start(), fc)):
            target = f"127.0.0.1:{proc.port(c['startupProbe']['grpc']['port'])}"
            ok, waited, last = health.wait_until_passes(target, c["startupProbe"])
            if not ok:
                raise RuntimeError(f"{proc.name} never passed its startup probe ({last}):\n"
                                   f"{proc.tail()}")
        # One scrape after the frontend has seen the worker, so its gauges are set.
        health.wait_until_passes(f"127.0.0.1:{frontend.port(fc['readinessProbe']['grpc']['port'])}",
                                 fc["readinessProbe"], deadline_seconds=30)
        for proc, c in ((worker, wc), (frontend, fc)):
            listen = manifests.flag(manifests.argv(c, proc.env), "metrics_listen")
            port = proc.port(int(listen.rsplit(":", 1)[1]))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                texts.append(r.read().decode())
            print(f"scraped {proc.name} /metrics on 127.0.0.1:{port}")
    finally:
        for proc in (frontend, worker):
            proc.stop()
    return texts


def check_names(args):
    found = queries.dashboard_queries(args.dashboard)
    rules, recorded = queries.rule_queries(args.rules)
    found += rules
    for overlay in [args.overlay] + (args.hpa_overlay or []):
        objects = manifests.render(args.kubectl, overlay)
        found += [(f"{overlay} HPA {name}", metric)
                  for name, metric in queries.hpa_metric_names(objects)]

    if args.binary:
        exported = set()
        for text in scrape_launched(args):
            exported |= queries.exposed_names(text)
        source = "the running moe-worker and moe-frontend"
    else:
        exported = set()
        for path in args.registry:
            with open(path) as f:
                exported |= queries.registry_names(f.read())
        source = " and ".join(args.registry)
    print(f"{len(exported)} series names from {source}")

    known = exported | recorded | queries.SYNTHETIC
    missing, used = [], set()
    for where, expr in found:
        for name in sorted(queries.metric_names(expr)):
            used.add(name)
            if name not in known:
                missing.append(f"{where}: {name}")
    for m in missing:
        print(f"FAIL not exported: {m}")
    print(f"{len(found)} queries read {len(used)} names: "
          f"{len(used & exported)} exported, {len(used & recorded)} recorded, "
          f"{len(used & queries.SYNTHETIC)} from Prometheus, {len(set(m.split(': ')[-1] for m in missing))} unknown")
    return 1 if missing else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["syntax", "names"])
    parser.add_argument("--promtool")
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--rules", nargs="+", default=[])
    parser.add_argument("--kubectl")
    parser.add_argument("--overlay")
    parser.add_argument("--hpa-overlay", nargs="*", help="more overlays whose HPA metrics to check")
    parser.add_argument("--binary", action="append", help="NAME=PATH of a built binary")
    parser.add_argument("--registry", action="append", help="a source file registering metrics")
    args = parser.parse_args()
    return check_syntax(args) if args.mode == "syntax" else check_names(args)


if __name__ == "__main__":
    sys.exit(main())

"""Debian's real Prometheus server scrapes a running frontend and worker; a metric comes back
through its HTTP query API."""

import json
import os
import shutil
import tempfile
import unittest
import urllib.parse

import harness
from harness import free_port, generate, http_get, wait_for


@unittest.skipIf(shutil.which("prometheus") is None, "prometheus is not installed")
class PrometheusTest(unittest.TestCase):
    def test_prometheus_scrapes_the_service(self):
        c = harness.Cluster(workers=1)
        prom = None
        try:
            fe = c.add_frontend()
            generate(c.stub(fe), c.pb, token_ids=c.pb.TokenIds(ids=[1, 2, 3]), max_tokens=4,
                     stop=c.pb.StopParams(ignore_eos=True))
            d = tempfile.mkdtemp(prefix="moe-prom-")
            config = os.path.join(d, "prometheus.yml")
            with open(config, "w") as f:
                f.write(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: moe-frontend
    static_configs: [{{targets: ['127.0.0.1:{fe.metrics_port}']}}]
  - job_name: moe-worker
    static_configs: [{{targets: ['127.0.0.1:{c.workers[0].metrics_port}']}}]
""")
            port = free_port()
            prom = harness.Process("prometheus", [
                "prometheus", f"--config.file={config}", f"--storage.tsdb.path={d}/data",
                f"--web.listen-address=127.0.0.1:{port}"], c.log_dir)

            def query(q):
                url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
                return json.loads(http_get(url))["data"]["result"]

            def tokens():
                r = query('moe_generation_tokens_total{job="moe-worker"}')
                return r and float(r[0]["value"][1]) >= 4

            def finished():
                r = query('moe_frontend_requests_total{outcome="length"}')
                return r and float(r[0]["value"][1]) >= 1

            # Each target is scraped on its own schedule: wait for both to have seen the call.
            wait_for(tokens, timeout=40, interval=0.5, what="Prometheus to scrape the worker")
            wait_for(finished, timeout=40, interval=0.5, what="Prometheus to scrape the frontend")
            up = query('up{job="moe-frontend"}')
            self.assertEqual(up[0]["value"][1], "1")
        finally:
            if prom is not None:
                prom.stop()
            c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""Runs the official `openai` and `@anthropic-ai/sdk` npm clients (js/http_sdk_test.js) against
the frontend's HTTP API. The tool-call round trip needs a model whose greedy output is a tool
call: `moe_offline_tokens --write_scripted_model=DIR --script=TEXT`; where that binary has no
such flag the round trip is skipped (reported as a skip, not a pass)."""

import os
import subprocess
import tempfile
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def run_js(fe_port, model, scripted=None):
    env = dict(os.environ, MOE_HTTP=f"http://127.0.0.1:{fe_port}", MOE_MODEL=model)
    if scripted:
        env["MOE_SCRIPTED_MODEL"] = scripted
    return subprocess.run(["node", os.path.join(HERE, "js", "http_sdk_test.js")], env=env,
                          capture_output=True, text=True, timeout=300)


def has_scripted_model():
    out = subprocess.run([harness.OFFLINE_BIN, "--help"], capture_output=True, text=True)
    return "write_scripted_model" in out.stdout + out.stderr


class HttpSdkTest(unittest.TestCase):
    def test_sdks(self):
        c = harness.Cluster(workers=1)
        try:
            port = harness.free_port()
            c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
            r = run_js(port, harness.MODEL_NAME)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + c.logs())
        finally:
            c.close()

    def test_tool_round_trip(self):
        if not has_scripted_model():
            self.skipTest("moe_offline_tokens has no --write_scripted_model yet: NOT RUN")
        tmp = tempfile.mkdtemp(prefix="moe-scripted-")
        scripted = os.path.join(tmp, "scripted")
        subprocess.run([harness.OFFLINE_BIN, f"--write_scripted_model={scripted}",
                        f"--script={SCRIPT}"], check=True)
        c = harness.Cluster(workers=1, worker_args=[f"--model={scripted}"])
        try:
            port = harness.free_port()
            c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
            r = run_js(port, "scripted", scripted="scripted")
            print(r.stdout)
            self.assertIn(r.returncode, (0, 3), r.stdout + r.stderr + c.logs())
            self.assertIn("tool calls parsed", r.stdout)
            if r.returncode == 3:
                # The calls were parsed; sending them back needs the worker's chat template.
                self.skipTest("tool turns NOT RUN: the worker's ChatML subset does not render "
                              "tool turns yet (501)")
            self.assertIn("tool round trip", r.stdout)
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

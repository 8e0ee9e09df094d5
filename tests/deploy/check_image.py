"""Keeps deploy/Dockerfile in step with deploy/make_bundle.sh and the Kubernetes manifests, since
the image cannot be built here (no Docker engine):
  - the build stage runs deploy/make_bundle.sh (so it builds with the bundle's CMake flags) and
    the runtime stage copies exactly the folder that script fills (bundle/, from the build
    stage's WORKDIR), and puts its bin/ on PATH;
  - every binary the manifests run (container commands and the moe-* programs their shell
    scripts call) is one the bundle script puts in bundle/bin: the script copies every
    executable the build makes, so each must be an add_executable() target of the tree (or be
    named in the script, should it ever list them);
  - the image's USER is the runAsUser/runAsGroup the manifests ask for.

Usage: check_image.py --repo ROOT --kubectl K [--skip-binaries] OVERLAY..."""
import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifests  # noqa: E402


def parse_dockerfile(path):
    stages, current = [], None
    with open(path) as f:
        lines = re.sub(r"\\\n", " ", f.read()).splitlines()
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            current = {"image": m.group(1), "name": m.group(2), "workdir": "/", "run": [],
                       "copy_from": [], "env": {}, "user": None}
            stages.append(current)
        elif op == "WORKDIR":
            current["workdir"] = os.path.join(current["workdir"], rest)
        elif op == "RUN":
            current["run"].append(rest)
        elif op == "COPY" and rest.startswith("--from="):
            src_from, src, dst = rest.split()[:3]
            current["copy_from"].append((src_from[len("--from="):], src, dst))
        elif op == "ENV":
            key, _, value = rest.partition("=")
            current["env"][key] = value
        elif op == "USER":
            current["user"] = rest
    return stages


def bundle_layout(script):
    """(bundle folder relative to the repository root, explicit binaries or None for 'all')."""
    with open(script) as f:
        text = f.read()
    m = re.search(r'^bundle="\$root/([^"]+)"', text, re.M)
    if not m:
        raise ValueError(f"{script}: no bundle=\"$root/...\" line")
    every = re.search(r"find [^\n]*-executable", text) is not None
    listed = set(re.findall(r"\bmoe-[a-z-]+\b", text))
    return m.group(1), None if every else listed


def executable_targets(repo):
    names = set()
    for path in glob.glob(os.path.join(repo, "**/CMakeLists.txt"), recursive=True):
        if "/build" in path or "node_modules" in path:
            continue
        with open(path) as f:
            names |= set(re.findall(r"add_executable\(\s*([A-Za-z0-9_.+-]+)", f.read()))
    return names


def manifest_binaries(objects):
    found = set()
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = o["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            command = c.get("command", [])
            if command and command[0].startswith("moe-"):
                found.add(command[0])
            for part in command[1:] + c.get("args", []):
                found |= set(re.findall(r"(?<![\w/.-])moe-[a-z]+(?:-[a-z]+)*(?=\s)", part + " "))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--skip-binaries", action="store_true")
    parser.add_argument("overlays", nargs="+")
    args = parser.parse_args()
    failures = []

    stages = parse_dockerfile(os.path.join(args.repo, "deploy/Dockerfile"))
    bundle_rel, listed = bundle_layout(os.path.join(args.repo, "deploy/make_bundle.sh"))
    build = next((s for s in stages if s["name"] == "build"), None)
    final = stages[-1]
    if build is None or not any("deploy/make_bundle.sh" in r for r in build["run"]):
        failures.append("the build stage does not run deploy/make_bundle.sh")
    if not any("deploy/install_deps.sh" in r for r in (build or {}).get("run", [])):
        failures.append("the build stage does not install deploy/install_deps.sh's packages")
    if "cuda" not in (build or {}).get("image", "") or "devel" not in build["image"]:
        failures.append("the build stage is not on a CUDA devel image")
    if "cuda" not in final["image"] or "runtime" not in final["image"]:
        failures.append("the runtime stage is not on a CUDA runtime image")
    want = os.path.normpath(os.path.join(build["workdir"] if build else "/", bundle_rel))
    copies = [(s, d) for f, s, d in final["copy_from"] if f == "build"]
    if [os.path.normpath(s) for s, _ in copies] != [want]:
        failures.append(f"runtime stage copies {[s for s, _ in copies]} from build; the bundle "
                        f"script fills {want}/")
    if copies:
        bin_dir = os.path.join(copies[0][1], "bin")
        if bin_dir.rstrip("/") not in final["env"].get("PATH", "").split(":"):
            failures.append(f"PATH {final['env'].get('PATH')} lacks {bin_dir}")
    print(f"Dockerfile copies {[s for s, _ in copies]}; make_bundle.sh fills {want}/")

    targets = executable_targets(args.repo) if listed is None else listed
    for overlay in args.overlays:
        objects = manifests.render(args.kubectl, overlay)
        binaries = manifest_binaries(objects)
        print(f"{overlay} runs {sorted(binaries)}")
        if not args.skip_binaries:
            for b in sorted(binaries - targets):
                failures.append(f"{overlay} runs {b}, which the bundle script does not put in "
                                f"{bundle_rel}/bin ({'no add_executable target' if listed is None else 'not listed'})")
        for o in objects:
            if o["kind"] in ("Deployment", "StatefulSet"):
                sc = o["spec"]["template"]["spec"].get("securityContext", {})
                user = f"{sc.get('runAsUser')}:{sc.get('runAsGroup')}"
                if final["user"] != user:
                    failures.append(f"{overlay} {o['kind']}/{o['metadata']['name']} runs as "
                                    f"{user}, the image as USER {final['user']}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

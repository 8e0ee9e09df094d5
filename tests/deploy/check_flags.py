"""The command lines of the manifests against the binaries and against each other:
  - every overlay gives moe-worker (and moe-frontend) the same flags, only the values differ
    (an overlay that drops or adds a flag is a deployment that behaves differently by accident);
  - with --binary NAME=PATH, every --flag the manifests pass to moe-worker, moe-frontend or moe-import
    (also inside the init container's shell script) is a flag that binary defines (its
    --helpfull), so a renamed flag fails here and not in a crash-looping pod.

Usage: check_flags.py --kubectl K [--binary moe-worker=PATH ...] OVERLAY...
A binary the manifests run but that is not given (its target does not exist yet) is noted."""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifests  # noqa: E402


def flags_by_binary(objects):
    """binary -> set of flag names the manifests pass it."""
    used = {}
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = o["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            command = c.get("command", [])
            if command and command[0].startswith("moe-"):
                names = {m for a in c.get("args", []) for m in re.findall(r"^--([A-Za-z0-9_]+)", a)}
                used.setdefault(command[0], set()).update(names)
            # Shell scripts: `moe-x --a=1 \ --b=2` up to the end of the (continued) line.
            for part in command[1:] + c.get("args", []):
                joined = re.sub(r"\\\n", " ", part)
                for m in re.finditer(r"(?<![\w/.-])(moe-[a-z]+(?:-[a-z]+)*)\s([^\n]*)", joined):
                    used.setdefault(m.group(1), set()).update(re.findall(r"--([A-Za-z0-9_]+)", m.group(2)))
    return used


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--binary", action="append", help="NAME=PATH of a built binary")
    parser.add_argument("overlays", nargs="+")
    args = parser.parse_args()
    binaries = manifests.parse_binaries(args.binary)
    failures = []
    per_overlay = {}
    for overlay in args.overlays:
        objects = manifests.render(args.kubectl, overlay)
        per_overlay[overlay] = {
            binary: {tuple(sorted(re.findall(r"^--([A-Za-z0-9_]+)", a)[0]
                                  for a in c.get("args", []) if a.startswith("--")))
                     for _, _, c in manifests.containers(objects, binary)}
            for binary in ("moe-worker", "moe-frontend")}
        used = flags_by_binary(objects)
        for binary, names in sorted(used.items()):
            print(f"{overlay}: {binary} --{' --'.join(sorted(names))}")
            if not binaries:
                continue
            path = binaries.get(binary)
            if not path:
                print(f"note: {binary} not given (no such target at configure time): not checked")
                continue
            if not os.access(path, os.X_OK):
                failures.append(f"{overlay}: {binary} is not built ({path})")
                continue
            out = subprocess.run([path, "--helpfull"], capture_output=True, text=True, timeout=60)
            known = set(re.findall(r"--([A-Za-z0-9_]+)", out.stdout + out.stderr))
            for name in sorted(names - known):
                failures.append(f"{overlay}: {binary} has no flag --{name} (not in its --helpfull)")
    # --workers (a static list: the CPU pod's neighbour) and --workers_dns (the headless
    # Service) are the frontend's two ways to the same thing.
    for overlay in per_overlay.values():
        for binary in overlay:
            overlay[binary] = {tuple(sorted("workers*" if f in ("workers", "workers_dns") else f
                                            for f in flags)) for flags in overlay[binary]}
    first, *rest = args.overlays
    for overlay in rest:
        for binary, flag_sets in per_overlay[overlay].items():
            for flags in flag_sets:
                for base in per_overlay[first][binary]:
                    if flags != base:
                        failures.append(f"{binary}: {overlay} passes --{' --'.join(flags)}, "
                                        f"{first} --{' --'.join(base)}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

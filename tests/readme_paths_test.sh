#!/usr/bin/env bash
# The top-level README's "Where things are" names only files that exist.
# Usage: tests/readme_paths_test.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
section=$(sed -n '/^## Where things are/,/^## /p' "$root/README.md")
mapfile -t paths < <(grep -o '`[a-z_./0-9-]*/[a-z_./0-9-]*\.[a-z]*`' <<<"$section" | tr -d '`' | sort -u)
[[ ${#paths[@]} -ge 10 ]] || { echo "README: expected at least 10 paths, found ${#paths[@]}"; exit 1; }
missing=0
for p in "${paths[@]}"; do
  [[ -e $root/$p ]] || { echo "README names $p, which does not exist"; missing=1; }
done
echo "${#paths[@]} paths checked"
exit $missing

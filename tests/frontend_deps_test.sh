#!/usr/bin/env bash
# moe-frontend builds without the engine: of engine/, expertstore/ and kernels/ it compiles only
# the base library (kernels/base/, moe_base). Reads the build graph, so it needs no build.
# Usage: tests/frontend_deps_test.sh SOURCE_DIR BUILD_DIR [NINJA]   (a Ninja build directory)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
ninja=${3:-ninja}
target=moe-frontend

# Every input of the target, recursively. `-t inputs` is ninja >= 1.11; older ones print the
# commands instead, whose source files are the same translation units.
if inputs=$("$ninja" -C "$build" -t inputs "$target" 2>/dev/null); then
  files=$(tr ' ' '\n' <<<"$inputs")
else
  files=$("$ninja" -C "$build" -t commands "$target" | tr ' ' '\n')
fi
sources=$(grep -E '\.(c|cc|cpp|cu)$' <<<"$files" | sort -u)
[[ -n $sources ]] || { echo "no sources found for $target in $build"; exit 1; }

# Paths relative to the tree they are in (generated sources are in the build tree), so that a
# checkout under a directory named engine/ does not match.
bad=0
while read -r f; do
  [[ $f = /* ]] || f=$build/$f
  case $f in
    "$build"/*) rel=${f#"$build"/} ;;
    "$src"/*) rel=${f#"$src"/} ;;
    *) continue ;;  # a system or third-party source
  esac
  case $rel in
    kernels/base/*) ;;
    engine/* | expertstore/* | kernels/*) echo "moe-frontend compiles $rel"; bad=1 ;;
  esac
done <<<"$sources"
echo "$(wc -l <<<"$sources") sources of $target checked"
exit $bad

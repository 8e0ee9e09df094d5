#!/usr/bin/env bash
# Builds Release for sm_90a into build-bundle/ and makes bundle/: bin/ (test and tool binaries,
# RPATH $ORIGIN/../lib as DT_RPATH) and lib/ (the non-system shared libraries they need, by ldd).
# The GPU machine (Ubuntu 24.04, glibc 2.39) lacks our Debian libraries; it has newer glibc,
# libstdc++ and libgcc_s, and the driver's libcuda, which are therefore left out.
# Our own libraries are shared here (BUILD_SHARED_LIBS) so the CUDA fatbin of moe_kernels is in
# the bundle once, not once per binary.
# Usage: deploy/make_bundle.sh [extra cmake -D options]   (from anywhere; -j2: shared build box)
# MOE_BUNDLE_TARGETS="parity_test matvec_bench": build and bundle only these executables (a full
# build takes long on the 2-core build box); unset: everything but the kernel tracer, which
# "moe_timeline" among them adds (tests/bench/kernel_timeline.cc).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-bundle"
bundle="$root/bundle"
# The device tool carries at most 64 MiB; the image has no such limit (MOE_BUNDLE_MAX_MIB there).
limit=$((${MOE_BUNDLE_MAX_MIB:-64} * 1024 * 1024))

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DMOE_WERROR=ON \
  -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
  "$@" >/dev/null
read -r -a targets <<<"${MOE_BUNDLE_TARGETS:-}"
ninja -C "$build" -j2 "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
# What runs on the GPU machine and in the image: the processes and tools (build/bin), the GPU
# test suites (ctest label gpu) and the benchmarks, or only MOE_BUNDLE_TARGETS when set. CPU-only
# unit tests stay in CI: each binary carries the CUDA fatbin, and all of them would not fit the
# 64 MiB limit.
if [[ ${#targets[@]} -gt 0 ]]; then
  mapfile -t bins < <(for t in "${targets[@]}"; do
    find "$build" -path '*/CMakeFiles' -prune -o -type f -executable -name "$t" -print; done | sort)
else
  mapfile -t bins < <({ find "$build/bin" -maxdepth 1 -type f -executable;
    find "$build/tests/bench" -maxdepth 1 -type f -executable -not -name '*.so';
    ls "$build/tests/parity/parity_test" "$build/tests/golden/golden_gpu_test" \
      "$build/tests/golden/golden_store_gpu_test" 2>/dev/null; } | sort)
fi
[[ ${#bins[@]} -gt 0 ]] || { echo "make_bundle: no executables in $build" >&2; exit 1; }
cp "${bins[@]}" "$bundle/bin/"

# glibc (libc, libm, libpthread, libdl, librt), the loader, libstdc++, libgcc_s and libcuda come
# from the GPU machine: mixing Debian's older copies with its newer glibc breaks.
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so)'
# Our own shared libraries are staged (ldd cannot find them from the build tree: their RPATH is
# the bundle's); then everything the binaries need, resolved against them, is copied, so a
# library no binary needs (the trained model's 12 MB when no server is bundled) stays out.
# The kernel tracer (libmoe_timeline.so and CUPTI, 4 MB) is preloaded, not linked: only when
# asked for by name.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
find "$build" -path '*/CMakeFiles' -prune -o -type f -name 'libmoe_*.so*' -print |
  xargs -r cp -t "$stage/"
needs=("${bins[@]}")
[[ " ${targets[*]} " == *" moe_timeline "* ]] && cp "$stage"/libmoe_timeline.so* "$bundle/lib/" &&
  needs+=("$bundle"/lib/libmoe_timeline.so*)
for b in "${needs[@]}"; do
  LD_LIBRARY_PATH="$stage" ldd "$b" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $system ]] && continue
  cp -L "$path" "$bundle/lib/$name"
done

# Checks: DT_RPATH (not RUNPATH) on every binary, every needed library found in the bundle.
for b in "$bundle"/bin/*; do
  readelf -d "$b" | grep -q 'RPATH.*\$ORIGIN/../lib' ||
    { echo "make_bundle: $b lacks DT_RPATH \$ORIGIN/../lib" >&2; exit 1; }
  if ldd "$b" | grep -q 'not found'; then
    echo "make_bundle: $b has unresolved libraries" >&2; ldd "$b" | grep 'not found' >&2; exit 1
  fi
done
size=$(du -sb "$bundle" | cut -f1)
echo "bundle: $(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries," \
  "$((size / 1024 / 1024)) MiB ($size bytes) in $bundle"
if (( size > limit )); then
  echo "make_bundle: bundle is over $((limit / 1024 / 1024)) MiB (MOE_BUNDLE_MAX_MIB)" >&2; exit 1
fi

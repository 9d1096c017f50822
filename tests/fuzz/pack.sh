#!/usr/bin/env bash
# pack.sh [FUZZ_BUILD_DIR] [OUT.tar.xz] — packs the libFuzzer harnesses of
# FUZZ_BUILD_DIR (default build/fuzz), the shared libraries they load (as
# ldd resolves them here; glibc and the C++ runtime are left to the target)
# and seeds made now by make_seeds.py, for a long run on another machine
# with more cores (the sanitizer runtimes are linked in statically):
#
#   bash tests/fuzz/pack.sh build/fuzz fuzz.tar.xz
#   # there, from a checkout of the same commit:
#   tar -C /tmp -xJf fuzz.tar.xz
#   LD_LIBRARY_PATH=/tmp/fz/lib FUZZ_SEEDS=/tmp/fz/seeds FUZZ_JOBS=$(nproc) \
#     bash tests/fuzz/run.sh long /tmp/fz/bin
#
# FUZZ_JOBS shares the 10 million executions of each harness among that many
# worker processes on one corpus (tests/fuzz/run.sh, docs/TESTING.md).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin_dir=$(cd "${1:-$here/../../build/fuzz}" && pwd)
out=${2:-$PWD/fuzz.tar.xz}
export TURBINE_SRC=${TURBINE_SRC:-$(cd "$here/../.." && pwd)}
export TURBINE_SHARED=${TURBINE_SHARED:-$(cd "$TURBINE_SRC/.." && pwd)/shared}
export TURBINE_BIN=${TURBINE_BIN:-$bin_dir/../turbine}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/fz/bin" "$stage/fz/lib"
n=0
for b in "$bin_dir"/fuzz_*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    cp "$b" "$stage/fz/bin/" && n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "pack: no harnesses in $bin_dir (build them first)" >&2; exit 1; }
ldd "$stage"/fz/bin/fuzz_* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
        *) cp -L "$lib" "$stage/fz/lib/" ;;
    esac
done
python3 "$here/make_seeds.py" "$stage/fz/seeds" > /dev/null
tar -C "$stage" -cJf "$out" fz
echo "pack: $out ($(du -h "$out" | cut -f1)): $n harnesses, $(ls "$stage/fz/lib" | wc -l) libraries, seeds"

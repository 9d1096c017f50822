#!/usr/bin/env bash
# cmake --install puts the binary, the CUDA module (when built) and the
# public header under a prefix, and the installed binary finds its module
# there (the dynamic loader's own trace shows which file it opened), also
# after the prefix is moved elsewhere.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
B=$(dirname "$TURBINE_BIN")
D="$TURBINE_TMP/install"
rm -rf "$D"
mkdir -p "$D"
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$B/cmake_install.cmake" ] || fail "$B is not a CMake build folder"

cmake --install "$B" --prefix "$D/p" > "$D/install.log" 2>&1 || { cat "$D/install.log"; fail "cmake --install"; }
[ -x "$D/p/bin/turbine" ] || fail "no bin/turbine under the prefix"
[ -f "$D/p/include/turbine/turbine.h" ] || fail "no include/turbine/turbine.h under the prefix"
cmp -s "$D/p/include/turbine/turbine.h" "$TURBINE_SRC/include/turbine/turbine.h" || fail "installed header differs"
"$D/p/bin/turbine" --help > /dev/null || fail "installed turbine --help"
echo "ok: binary and header installed; the installed binary runs"

if [ ! -f "$B/libturbine_cuda.so" ]; then
    echo "ok: no CUDA module in this build: nothing more to install"
    exit 0
fi
mod=$(find "$D/p" -name libturbine_cuda.so | head -1)
[ -n "$mod" ] || fail "the CUDA module was not installed"
echo "ok: module installed as ${mod#"$D/p/"}"

M="$TURBINE_SHARED/models/stories260K"
# loads_from PREFIX: the installed binary under PREFIX asks for CUDA; the
# module it opens must be the one under PREFIX
loads_from() {
    local p=$1
    set +e
    env -u TURBINE_MODULE_DIR LD_DEBUG=files "$p/bin/turbine" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" \
        -o "$D/c.engine" --device cuda > /dev/null 2> "$D/err.txt"
    set -e
    if grep -q "was not found" "$D/err.txt"; then grep "error" "$D/err.txt"; fail "installed binary under $p did not find its module"; fi
    grep -Eq "file=$p/.*libturbine_cuda.so .*dynamically loaded" "$D/err.txt" \
        || { grep -E "libturbine_cuda|error" "$D/err.txt"; fail "installed binary under $p did not open $p/.../libturbine_cuda.so"; }
}
loads_from "$D/p"
echo "ok: the installed binary opens the installed module"
mv "$D/p" "$D/moved"
loads_from "$D/moved"
echo "ok: after moving the prefix, the binary still opens the module beside it"

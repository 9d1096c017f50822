#!/usr/bin/env bash
# The CUDA backend is a module loaded on first use (src/backend/cuda/cuda_module.h):
# 1. the turbine binary does not link cuBLAS, the CUDA runtime, OpenBLAS,
#    libcurl or libmicrohttpd;
# 2. a CPU `turbine serve` answering requests has neither the CUDA module,
#    cuBLAS nor OpenBLAS mapped (libmicrohttpd, which serve loads, is: the
#    control that the maps show dlopen'd libraries);
# 3. --device cuda without the module (binary copied alone, or
#    TURBINE_MODULE_DIR elsewhere) fails with exit 1 naming the module and the
#    folders searched; with a module whose own dependency is missing, the
#    loader's message names that library; a module of another build is
#    refused. A build without CUDA says the backend was not built.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
D="$TURBINE_TMP/cuda_module"
rm -rf "$D"
mkdir -p "$D"
M="$TURBINE_SHARED/models/stories260K"
fail() { echo "FAIL: $*"; exit 1; }

# 1. what the binary links
needed=$(readelf -d "$TURBINE_BIN" | awk '/NEEDED/ {print $NF}' | tr -d '[]' | tr '\n' ' ')
for lib in libcublas libcublasLt libcudart libcuda.so libopenblas libcurl libmicrohttpd libgnutls libstdc++; do
    case " $needed" in *" $lib"*) fail "turbine links $lib (NEEDED: $needed)" ;; esac
done
echo "ok: turbine links only $needed"

# 2. a CPU server's mappings. The engine is built without OpenBLAS (its tuner
# may otherwise pick the BLAS tactic, e.g. in a sanitized build where the own
# kernels are slower, and then the server rightly loads it); the server runs
# where OpenBLAS is available and must not load it for this engine.
TURBINE_OPENBLAS="$D/no-openblas.so" "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" \
    -o "$D/s.engine" > "$D/build.log" 2>&1 || { cat "$D/build.log"; fail "engine build"; }
"$TURBINE_BIN" inspect "$D/s.engine" >"$D/inspect.txt" 2>&1; grep -Eq '"blas_decode_nodes": 0,' "$D/inspect.txt" || fail "the engine chose OpenBLAS without it"
D="$D" /usr/bin/python3 - <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["TURBINE_SRC"], "tests", "serve"))
from serve_util import Server, check, ok, request
s = Server(os.path.join(os.environ["D"], "s.engine"), "--threads", "1").start()
try:
    st, _, body = request(s.port, "POST", "/v1/completions",
                          json.dumps({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}))
    check(st == 200, "completion status %s: %s" % (st, body[:200]))
    with open("/proc/%d/maps" % s.proc.pid) as f:
        files = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line}
    check(any(n.startswith("libmicrohttpd") for n in files), "libmicrohttpd is not in the server's maps: %s" % sorted(files))
    for lib in ("libturbine_cuda", "libcublas", "libcudart", "libopenblas", "libcurl"):
        hit = [n for n in files if n.startswith(lib)]
        check(not hit, "a CPU server has %s mapped" % hit)
    ok("a CPU server maps libmicrohttpd and none of the CUDA module, cuBLAS, OpenBLAS, libcurl")
finally:
    s.kill()
PY

# 3. --device cuda without its module
# expect CODE REGEX CMD...: exit code and a stderr line matching REGEX
expect() {
    local code=$1 re=$2
    shift 2
    set +e
    "$@" > "$D/out.txt" 2> "$D/err.txt"
    local rc=$?
    set -e
    [ "$rc" = "$code" ] || { cat "$D/err.txt"; fail "exit $rc (want $code): $*"; }
    grep -Eq -- "$re" "$D/err.txt" || { cat "$D/err.txt"; fail "stderr lacks /$re/: $*"; }
}
BUILD_CUDA=("build" "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/c.engine" --device cuda)
mkdir -p "$D/alone" "$D/empty"
cp "$TURBINE_BIN" "$D/alone/turbine"
if [ ! -f "$(dirname "$TURBINE_BIN")/libturbine_cuda.so" ]; then
    expect 1 "built without the CUDA backend" "$D/alone/turbine" "${BUILD_CUDA[@]}"
    echo "ok: a build without CUDA says so (no module built here: the module checks are skipped)"
    exit 0
fi
expect 1 "CUDA backend module libturbine_cuda.so was not found \(searched $D/alone," \
    env -u TURBINE_MODULE_DIR "$D/alone/turbine" "${BUILD_CUDA[@]}"
expect 1 "libturbine_cuda.so was not found \(searched $D/empty;" \
    env TURBINE_MODULE_DIR="$D/empty" "$TURBINE_BIN" "${BUILD_CUDA[@]}"
echo "ok: without the module, --device cuda fails naming libturbine_cuda.so and where it looked"

CC=${CC:-cc}
if command -v "$CC" > /dev/null; then
    # a module that needs a library this machine lacks
    mkdir -p "$D/dep" "$D/broken" "$D/old"
    echo 'int tb_test_missing_dep(void) { return 1; }' > "$D/dep.c"
    "$CC" -shared -fPIC -o "$D/dep/libtb_missing_dep.so" "$D/dep.c"
    echo 'int tb_test_missing_dep(void); int tb_test_use(void) { return tb_test_missing_dep(); }' > "$D/use.c"
    "$CC" -shared -fPIC -o "$D/broken/libturbine_cuda.so" "$D/use.c" -L"$D/dep" -ltb_missing_dep
    rm "$D/dep/libtb_missing_dep.so"
    expect 1 "cannot load the CUDA backend module $D/broken/libturbine_cuda.so: libtb_missing_dep.so" \
        env TURBINE_MODULE_DIR="$D/broken" "$TURBINE_BIN" "${BUILD_CUDA[@]}"
    # a module of another build (its interface key differs)
    printf '%s\n' '#include <stdint.h>' \
        'uint64_t tb_cuda_module_init(const void *host, void *out) { (void)host; (void)out; return 12345; }' > "$D/old.c"
    "$CC" -shared -fPIC -o "$D/old/libturbine_cuda.so" "$D/old.c"
    expect 1 "built from another version of turbine" env TURBINE_MODULE_DIR="$D/old" "$TURBINE_BIN" "${BUILD_CUDA[@]}"
    echo "ok: a missing dependency of the module is named; a module of another build is refused"
else
    echo "note: no C compiler ($CC): the broken-module checks are skipped"
fi

# the real module loads; without a GPU the CUDA runtime's own error comes back
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    expect 1 "CUDA" env -u TURBINE_MODULE_DIR "$TURBINE_BIN" "${BUILD_CUDA[@]}"
    if grep -q "libturbine_cuda.so" "$D/err.txt"; then cat "$D/err.txt"; fail "the module beside the binary was not loaded"; fi
    echo "ok: no GPU here: the module loads and reports: $(head -1 "$D/err.txt")"
fi

#!/bin/bash
# test_llm_passes.sh — the Llama builder emits plain ops and the pass pipeline
# fuses them (src/opt/llm_fuse.c): an engine built now must hold the same
# "graph" and "weights" sections, byte for byte, as one built by a turbine
# whose builder emitted the fused ops itself. TURBINE_REF_BIN names that
# turbine (for instance built from commit bcbe448); without it the
# comparison is skipped and only the fused graph's op set is checked.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TURBINE_BIN:-$SRC/build/turbine}
SHARED=${TURBINE_SHARED:-/work/shared}
PY=/usr/bin/python3
S=$SHARED/models/stories260K
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fails=0
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
# BLAS off: the CPU tuner's timings would make the tactic words differ
export TURBINE_OPENBLAS=/nonexistent

build() { # bin model out [args]
    local bin=$1 model=$2 out=$3; shift 3
    "$bin" build "$model" --tokenizer "$S/tok512.bin" -o "$out" "$@" > /dev/null 2> "$D/err" || { cat "$D/err"; return 1; }
}

models=("$S/stories260K.bin")
for p in qwen2 llama-gqa llama3-rope; do
    "$PY" "$SRC/tests/gen_checkpoints.py" --preset $p --dtype f32 --out "$D/$p" > /dev/null && models+=("$D/$p")
done
for m in "${models[@]}"; do
    for dt in f32 bf16; do
        name="$(basename "$m") $dt"
        build "$BIN" "$m" "$D/new.engine" --dtype $dt || { fail "$name" "build failed"; continue; }
        # no plain op is left for a backend to run
        if strings "$D/new.engine" | grep -qE '^l[0-9]+\.(silu|q|k|v|g|u|hn|h2n)$'; then
            fail "$name" "the engine still holds a value of the plain graph"
        fi
        if [ -n "${TURBINE_REF_BIN:-}" ]; then
            build "$TURBINE_REF_BIN" "$m" "$D/ref.engine" --dtype $dt || { fail "$name" "reference build failed"; continue; }
            if out=$("$PY" "$SRC/scripts/engine_sections.py" "$D/ref.engine" "$D/new.engine"); then
                echo "ok $name: $(echo $out)"
            else
                fail "$name" "$out"
            fi
        else
            echo "ok $name (no TURBINE_REF_BIN: sections not compared)"
        fi
    done
done
[ $fails -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }

#!/bin/bash
# test_kv_dtype.sh — the KV cache follows the engine's dtype, and a bf16
# engine whose keys and values pass f16's range (65504) keeps its logits.
#
# The checkpoint is llama-gqa in bf16 with k_proj and v_proj scaled by 2^16
# and q_proj and o_proj by 2^-16: the model computes the same function (the
# scores q.k and the attention output through o_proj are unchanged; powers
# of two scale bf16 exactly), but every key and value is ~65536 times
# larger, so an f16 cache overflows to inf while a bf16 one holds them.
#
#   1. bf16 engine, --kv-dtype auto: the cache is bf16, logits match
#      tests/reference.py (float64) within the bf16 tolerance (2e-2);
#   2. the same with --kv-dtype f16: the logits are not (the premise: the
#      keys do exceed f16);
#   3. f32 and f16 engines get f32 and f16 caches, --kv-dtype overrides it;
#   4. --kv-dtype with another word (int4) is refused.
#
# Env: TURBINE_SHARED, TURBINE_BIN, TURBINE_SRC, TURBINE_TMP (ctest sets them).
set -u

SRC=${TURBINE_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
SHARED=${TURBINE_SHARED:-$SRC/../shared}
BIN=${TURBINE_BIN:-$SRC/build/turbine}
TMP=${TURBINE_TMP:-/tmp/turbine-test}
PY=/usr/bin/python3
TOK512=$SHARED/models/stories260K/tok512.bin
D=$TMP/kv_dtype
mkdir -p "$D"

failures=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }

# the scaled checkpoint (gen_checkpoints.py's generator, weights scaled)
if ! "$PY" - "$SRC/tests" "$D/ckpt" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import gen_checkpoints as g

S = 2.0 ** 16
make = g.make_weights


def scaled(cfg, rng):
    out = []
    for n, a in make(cfg, rng):
        if ".k_proj." in n or ".v_proj." in n:
            a = a * S
        elif ".q_proj." in n or ".o_proj." in n:
            a = a / S
        out.append((n, a))
    return out


g.make_weights = scaled
g.generate("llama-gqa", "bf16", sys.argv[2], seed=12)
EOF
then
    bad "cannot write the scaled checkpoint"; echo "test_kv_dtype: $failures failed"; exit 1
fi

build() { # DTYPE [CKPT] -> $D/DTYPE.engine
    "$BIN" build "${2:-$D/ckpt}" -o "$D/$1.engine" --tokenizer "$TOK512" --dtype "$1" >"$D/build-$1.log" 2>&1 ||
        { bad "turbine build --dtype $1: $(tail -n 2 "$D/build-$1.log" | tr '\n' ' ')"; return 1; }
}
IDS=$("$PY" -c "import random; r=random.Random(12); print(','.join(str(r.randrange(3,512)) for _ in range(24)))")

# run ENGINE KV_DTYPE_ARG NAME: logits in $D/NAME.bin, stderr in $D/NAME.err
run() {
    local kv=()
    [ -n "$2" ] && kv=(--kv-dtype "$2")
    "$BIN" run "$1" --prompt-ids "$IDS" -n 40 --temperature 0 --threads 2 --logits-out "$D/$3.bin" "${kv[@]}" \
        >"$D/$3.out" 2>"$D/$3.err"
}
kv_of() { sed -n 's/^timing:.* kv_dtype=\([a-z0-9]*\).*/\1/p' "$D/$1.err"; }
compare() { # NAME TOL [CKPT]
    "$PY" "$SRC/tests/compare_logits.py" --model "${3:-$D/ckpt}" --logits "$D/$1.bin" --prompt-ids "$IDS" --tol "$2" \
        --quiet >"$D/$1.cmp" 2>&1
}
finite() { "$PY" -c "import numpy as np, sys; a = np.fromfile(sys.argv[1], '<f4'); sys.exit(0 if a.size and np.isfinite(a).all() else 1)" "$D/$1.bin"; }

if build bf16; then
    # 1. the default: a bf16 cache, logits as the reference's
    if run "$D/bf16.engine" "" auto; then
        [ "$(kv_of auto)" = bf16 ] && ok "bf16 engine: the KV cache is bf16" \
            || bad "bf16 engine: the KV cache is '$(kv_of auto)', not bf16"
        finite auto && ok "bf16 engine, keys past 65504: logits finite" || bad "bf16 engine: non-finite logits"
        compare auto 2e-2 && ok "bf16 engine, keys past 65504: logits match the reference ($(tail -n 1 "$D/auto.cmp"))" \
            || bad "bf16 engine: logits differ from the reference: $(tail -n 2 "$D/auto.cmp" | tr '\n' ' ')"
    else
        bad "turbine run (bf16 engine): $(tail -n 2 "$D/auto.err" | tr '\n' ' ')"
    fi
    # 2. the premise: an f16 cache cannot hold these keys
    if run "$D/bf16.engine" f16 as_f16; then
        [ "$(kv_of as_f16)" = f16 ] && ok "--kv-dtype f16 gives an f16 cache" \
            || bad "--kv-dtype f16 gave '$(kv_of as_f16)'"
        if finite as_f16 && compare as_f16 2e-2; then
            bad "an f16 cache kept the logits: the keys do not exceed f16's range, the test proves nothing"
        else
            ok "an f16 cache breaks the same run (keys past f16's range)"
        fi
    else
        ok "an f16 cache fails the same run (keys past f16's range)"
    fi
    # 4. other words are refused
    if "$BIN" run "$D/bf16.engine" --prompt-ids 5,6 -n 4 --kv-dtype int4 >"$D/bad.out" 2>"$D/bad.err"; then
        bad "--kv-dtype int4 was accepted"
    else
        ok "--kv-dtype int4 is refused ($(head -n 1 "$D/bad.err"))"
    fi
fi

# 3. f32 and f16 engines (of an unscaled checkpoint: f16 weights could not
# hold the scaled ones)
"$PY" "$SRC/tests/gen_checkpoints.py" --preset llama-gqa --dtype f32 --out "$D/plain" >/dev/null ||
    bad "gen_checkpoints.py llama-gqa f32 failed"
for dt in f32 f16; do
    build "$dt" "$D/plain" || continue
    if run "$D/$dt.engine" "" "$dt"; then
        [ "$(kv_of "$dt")" = "$dt" ] && ok "$dt engine: the KV cache is $dt" \
            || bad "$dt engine: the KV cache is '$(kv_of "$dt")'"
    else
        bad "turbine run ($dt engine): $(tail -n 2 "$D/$dt.err" | tr '\n' ' ')"
    fi
done
if run "$D/f32.engine" bf16 f32_as_bf16; then
    [ "$(kv_of f32_as_bf16)" = bf16 ] && ok "--kv-dtype bf16 overrides an f32 engine's cache" \
        || bad "--kv-dtype bf16 on an f32 engine gave '$(kv_of f32_as_bf16)'"
    compare f32_as_bf16 2e-2 "$D/plain" && ok "f32 engine with a bf16 cache: logits match the reference" \
        || bad "f32 engine with a bf16 cache: $(tail -n 2 "$D/f32_as_bf16.cmp" | tr '\n' ' ')"
else
    bad "turbine run --kv-dtype bf16 (f32 engine): $(tail -n 2 "$D/f32_as_bf16.err" | tr '\n' ' ')"
fi

echo "test_kv_dtype: $failures failed"
[ "$failures" -eq 0 ]

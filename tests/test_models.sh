#!/bin/bash
# test_models.sh — end-to-end logits check: for each random-weight preset,
# generate a checkpoint, build an engine with the turbine CLI, run 32 prompt
# ids + 16 greedy tokens (-n 48: the CLI counts the prompt) with --logits-out,
# and compare every row against tests/reference.py (float64). Also checks
# reference.py itself against the llama2.c run.c numbers for stories260K, and
# runs stories260K.bin end to end.
#
#   bash tests/test_models.sh [CASE ...]     (no CASE: all; names as printed)
#
# Env: TURBINE_SHARED, TURBINE_BIN, TURBINE_SRC, TURBINE_TMP (ctest sets them).
set -u

SRC=${TURBINE_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
SHARED=${TURBINE_SHARED:-$SRC/../shared}
BIN=${TURBINE_BIN:-$SRC/build/turbine}
TMP=${TURBINE_TMP:-/tmp/turbine-test}
PY=/usr/bin/python3
TOK512=$SHARED/models/stories260K/tok512.bin
STORIES=$SHARED/models/stories260K/stories260K.bin
T=$TMP/models
mkdir -p "$T/ckpt" "$T/engines"

failures=0
passes=0
selected() {
    local name=$1; shift
    [ ${#FILTER[@]} -eq 0 ] && return 0
    for f in "${FILTER[@]}"; do [ "$f" = "$name" ] && return 0; done
    return 1
}
FILTER=("$@")
pass() { echo "PASS $1${2:+ ($2)}"; passes=$((passes + 1)); }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }

# 32 ids in [3, 512), fixed per case so failures reproduce.
prompt_ids() {
    "$PY" -c "import random,sys; r=random.Random(sys.argv[1]); print(','.join(str(r.randrange(3,512)) for _ in range(32)))" "$1"
}

# run_case NAME MODEL ENGINE_DTYPE TOL
#   MODEL: a checkpoint folder or .bin; ENGINE_DTYPE: f32, f16, bf16 or "" (builder default)
run_case() {
    local name=$1 model=$2 edtype=$3 tol=$4
    local eng=$T/engines/$name.engine logits=$T/engines/$name.logits.bin log=$T/engines/$name.log
    local ids
    ids=$(prompt_ids "$name")
    rm -f "$eng" "$logits"
    local dt=()
    [ -n "$edtype" ] && dt=(--dtype "$edtype")
    if ! "$BIN" build "$model" -o "$eng" --tokenizer "$TOK512" "${dt[@]}" > "$log" 2>&1; then
        fail "$name" "turbine build failed: $(tail -n 3 "$log" | tr '\n' ' ')"
        return
    fi
    if ! "$BIN" run "$eng" --prompt-ids "$ids" -n 48 --temperature 0 --logits-out "$logits" >> "$log" 2>&1; then
        fail "$name" "turbine run failed: $(tail -n 3 "$log" | tr '\n' ' ')"
        return
    fi
    local out
    out=$("$PY" "$SRC/tests/compare_logits.py" --model "$model" --logits "$logits" \
          --prompt-ids "$ids" --tol "$tol" --quiet 2>&1)
    local rc=$?
    echo "$out" >> "$log"
    if [ $rc -eq 0 ]; then
        pass "$name" "$(echo "$out" | tail -n 1)"
    else
        fail "$name" "$(echo "$out" | tail -n 2 | tr '\n' ' ') [log: $log]"
    fi
}

# gen PRESET DTYPE -> prints the folder
gen() {
    local dir=$T/ckpt/$1-$2
    if ! "$PY" "$SRC/tests/gen_checkpoints.py" --preset "$1" --dtype "$2" --out "$dir" > /dev/null; then
        echo ""
        return 1
    fi
    echo "$dir"
}

# -- reference.py itself against llama2.c run.c on stories260K ----------------
if selected reference-stories260K; then
    want=$(grep '^LAST_PROMPT_POS_TOP3' "$SHARED/models/stories260K/expected_once_upon_a_time_ids.txt" | cut -d' ' -f2-)
    got=$("$PY" "$SRC/tests/reference.py" --model "$STORIES" --ids 1,403,407,261,378 --top 3 2>&1)
    if "$PY" - "$want" "$got" <<'EOF'
import sys
w = [t.split(":") for t in sys.argv[1].split()]
g = [t.split(":") for t in sys.argv[2].split()]
ok = len(w) == len(g) == 3 and all(a[0] == b[0] and abs(float(a[1]) - float(b[1])) <= 1e-4 * abs(float(a[1])) for a, b in zip(w, g))
sys.exit(0 if ok else 1)
EOF
    then pass reference-stories260K "top3 $got"
    else fail reference-stories260K "want top3 '$want', reference.py gives '$got'"
    fi
fi

if [ ! -x "$BIN" ]; then
    fail turbine-cli "TURBINE_BIN=$BIN is not an executable"
    echo "test_models: $passes passed, $failures failed"
    exit 1
fi

# -- presets: name preset checkpoint-dtype engine-dtype tolerance -------------
CASES="
llama-gqa-f32        llama-gqa     f32  f32   1e-4
llama-gqa-bf16       llama-gqa     bf16 -     2e-2
qwen2-f32            qwen2         f32  f32   1e-4
qwen2-bf16           qwen2         bf16 -     2e-2
mistral-f32          mistral       f32  f32   1e-4
llama3-rope-f32      llama3-rope   f32  f32   1e-4
llama-sharded-f32    llama-sharded f32  f32   1e-4
llama-gqa-f32-as-f16 llama-gqa     f32  f16   2e-2
qwen2-f32-as-bf16    qwen2         f32  bf16  2e-2
"
while read -r name preset cdtype edtype tol; do
    [ -z "$name" ] && continue
    selected "$name" || continue
    dir=$(gen "$preset" "$cdtype")
    if [ -z "$dir" ]; then fail "$name" "gen_checkpoints.py failed"; continue; fi
    [ "$edtype" = "-" ] && edtype=""
    run_case "$name" "$dir" "$edtype" "$tol"
done <<< "$CASES"

if selected stories260K-f32; then
    run_case stories260K-f32 "$STORIES" f32 1e-4
fi

echo "test_models: $passes passed, $failures failed"
[ $failures -eq 0 ]

#!/usr/bin/env bash
# Tensor parallelism on the GPU: a --tp 2 engine with every rank on one
# device (TURBINE_TP_ONE_DEVICE=1, the default here: the collectives meet on
# the host and sum on the device, no NCCL) or, with TURBINE_TP_ONE_DEVICE=0
# on a 2-GPU machine, rank r on cuda:r over NCCL, against the --tp 1 engine
# of the same model:
# logits within f16 tolerance, greedy text identical; test_backend_ops'
# collective cases on the GPU; compute-sanitizer on a tp 2 run.
#   OUT=DIR TB_PREBUILT=/tmp/pb bash bench/gpu/tp.sh
# Models: .devdata/gpu/models/stories260K (stories260K.bin, tok512.bin) and
# random-weight checkpoints made here by tests/gen_checkpoints.py.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
T=$PB/turbine
OUT=${OUT:-/tmp/tp}
mkdir -p "$OUT"
S="$SRC/.devdata/gpu/models/stories260K"
W=$(mktemp -d)
PY=${PY:-python3}
fails=0
echo "== test_backend_ops on the GPU (collectives, vocabulary-shard embedding)"
TURBINE_TEST_DEVICE=cuda "$PB/test_backend_ops" > "$OUT/backend_ops.txt" 2>&1 || fails=$((fails + 1))
grep -E "cuda +(all_reduce|all_gather|embedding .*shard)" "$OUT/backend_ops.txt" | head -12
grep -E "^cuda: worst|checks," "$OUT/backend_ops.txt"
"$PY" "$SRC/tests/gen_checkpoints.py" --preset llama-gqa --dtype f32 --out "$W/gqa" > /dev/null
"$PY" "$SRC/tests/gen_checkpoints.py" --preset qwen2 --dtype f32 --out "$W/qwen2" > /dev/null
# one GPU: every rank on it (default); on a machine with 2+ GPUs,
# TURBINE_TP_ONE_DEVICE=0 puts rank r on cuda:r with NCCL between them
export TURBINE_TP_ONE_DEVICE=${TURBINE_TP_ONE_DEVICE:-1}
IDS=1,403,407,261,378,100
for m in stories:"$S/stories260K.bin" gqa:"$W/gqa" qwen2:"$W/qwen2"; do
  name=${m%%:*}; path=${m#*:}
  for dt in f16 f32; do
    for tp in 1 2; do
      e="$W/$name.$dt.tp$tp.engine"
      "$T" build "$path" --tokenizer "$S/tok512.bin" --device cuda --dtype "$dt" --tp "$tp" -o "$e" > "$W/b.log" 2>&1 ||
        { echo "FAIL: build $name $dt tp $tp: $(tail -3 "$W/b.log")"; fails=$((fails + 1)); continue; }
      "$T" run "$e" --device cuda --prompt-ids $IDS -n 60 --temperature 0 --logits-out "$W/$name.$dt.tp$tp.logits" \
        > "$W/$name.$dt.tp$tp.txt" 2> "$W/r.log" ||
        { echo "FAIL: run $name $dt tp $tp: $(tail -3 "$W/r.log")"; fails=$((fails + 1)); }
      [ "$tp" = 2 ] && grep -o "gen_tok_s=[0-9.]*" "$W/r.log" | sed "s/^/  $name $dt tp 2 (TURBINE_TP_ONE_DEVICE=$TURBINE_TP_ONE_DEVICE): /"
    done
    "$PY" - "$W/$name.$dt.tp1.logits" "$W/$name.$dt.tp2.logits" "$name $dt" "$dt" <<'PYEOF' || fails=$((fails + 1))
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32); b = np.fromfile(sys.argv[2], dtype=np.float32)
tol = 2e-2 if sys.argv[4] == "f16" else 1e-4
scale = max(1.0, float(np.abs(a).max()))
rel = float(np.abs(a - b).max()) / scale if a.size == b.size and a.size else float("inf")
print("  %-12s tp 2 vs tp 1 logits: %d values, max diff %.3g of scale %.2f (bound %.0e) %s"
      % (sys.argv[3], a.size, rel, scale, tol, "ok" if rel <= tol else "FAIL"))
sys.exit(0 if rel <= tol else 1)
PYEOF
    if cmp -s "$W/$name.$dt.tp1.txt" "$W/$name.$dt.tp2.txt"; then echo "  $name $dt: greedy tokens identical"
    else echo "FAIL: $name $dt greedy tokens differ"; fails=$((fails + 1)); fi
  done
done
echo "== turbine serve: the tp 2 f16 engine (all ranks on this GPU) against tp 1, greedy completions"
for tp in 1 2; do
  port=$((18230 + tp))
  "$T" serve "$W/gqa.f16.tp$tp.engine" --device cuda --port "$port" --gpu-memory-fraction 0.5 > "$W/serve$tp.log" 2>&1 &
  spid=$!
  "$PY" - "$port" "$W/serve$tp.json" <<'PYEOF' || { echo "FAIL: serve tp $tp: $(tail -3 "$W/serve$tp.log")"; fails=$((fails + 1)); }
import json, sys, time, urllib.request
port, out = int(sys.argv[1]), sys.argv[2]
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2).read(); break
    except Exception:
        time.sleep(0.1)
texts = []
for p in ["Once upon a time", "The cat", "A big red ball"]:
    body = json.dumps({"prompt": p, "max_tokens": 32, "temperature": 0}).encode()
    r = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, body, {"Content-Type": "application/json"})
    texts.append(json.loads(urllib.request.urlopen(r, timeout=60).read())["choices"][0]["text"])
json.dump(texts, open(out, "w"))
PYEOF
  grep -m1 -iE "kv cache|blocks" "$W/serve$tp.log" | sed "s/^/  tp $tp: /"
  kill "$spid"; wait "$spid" 2> /dev/null
done
if cmp -s "$W/serve1.json" "$W/serve2.json"; then echo "  serve: tp 2 texts equal tp 1's ($(head -c 80 "$W/serve2.json")...)"
else echo "FAIL: serve texts differ: $(head -c 200 "$W/serve1.json") / $(head -c 200 "$W/serve2.json")"; fails=$((fails + 1)); fi
echo "== compute-sanitizer memcheck, tp 2 f16 run"
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck "$T" run "$W/gqa.f16.tp2.engine" --device cuda --prompt-ids $IDS -n 20 \
    --temperature 0 > "$OUT/sanitizer.txt" 2>&1
  grep -E "ERROR SUMMARY" "$OUT/sanitizer.txt" || { tail -5 "$OUT/sanitizer.txt"; fails=$((fails + 1)); }
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/sanitizer.txt" || fails=$((fails + 1))
fi
rm -rf "$W"
echo "tp.sh: $fails failures"
[ "$fails" = 0 ]

#!/usr/bin/env bash
# run.sh — ResNet-18 (224x224) and a BERT-base-shape encoder (seq 128), both
# exported from PyTorch at opset 17 with random weights: ONNX Runtime (CPU,
# onnxruntime-node) and, when TURBINE names a binary with the ONNX front end,
# turbine's `bench --engine` (or, while that has no ONNX mode, the mean of
# `turbine exec --repeat`), at batch 1 and 8 with 2 threads. Prints one table.
#
#   bash bench/onnx/run.sh                       # ONNX Runtime only
#   TURBINE=build/turbine bash bench/onnx/run.sh # and turbine
#   INT8=1 TURBINE=build/turbine bash bench/onnx/run.sh  # and turbine's INT8 engines
#
# Environment: THREADS (2), BATCHES ("1 8"), MODELS ("resnet18 bert"), WARMUP (3), ITERS (20),
# MIN_SECONDS (5: each ONNX Runtime point runs at least ITERS iterations and
# this long), TURBINE_WARMUP and TURBINE_ITERS (turbine bench's --warmup and
# --iterations; default WARMUP and ITERS),
# OUT (bench/out/onnx: the exported models, engines and JSON results),
# INT8 (0; 1: also INT8 engines, `--dtype int8` calibrated on CALIB_SAMPLES
# (8) deterministic random input sets at the smallest batch, as "turbine-int8").
# Needs /usr/bin/python3 with torch, torchvision and onnx (Debian python3-torch,
# python3-torchvision, python3-onnx) and `npm ci` in bench/onnx.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
THREADS="${THREADS:-2}"
BATCHES="${BATCHES:-1 8}"
MODELS="${MODELS:-resnet18 bert}"
WARMUP="${WARMUP:-3}"
ITERS="${ITERS:-20}"
MIN_SECONDS="${MIN_SECONDS:-5}"
TURBINE_WARMUP="${TURBINE_WARMUP:-$WARMUP}"
TURBINE_ITERS="${TURBINE_ITERS:-$ITERS}"
OUT="${OUT:-$ROOT/bench/out/onnx}"
PY=/usr/bin/python3
mkdir -p "$OUT"

if [ ! -d "$HERE/node_modules/onnxruntime-node" ]; then
  (cd "$HERE" && npm ci --ignore-scripts --no-audit --no-fund --silent)
fi

# export (once; delete OUT to export again)
for m in $MODELS; do
  if [ ! -f "$OUT/${m}_opset17/model.onnx" ]; then
    "$PY" "$ROOT/tests/onnx/make_models.py" "$OUT" --models "$m" --opsets 17 --no-data
  fi
done

shapes() { # MODEL BATCH -> name:dims,... (comma list)
  case "$1" in
    resnet18) echo "input:${2}x3x224x224" ;;
    bert) echo "input_ids:${2}x128,attention_mask:${2}x128" ;;
  esac
}

RES="$OUT/results.jsonl"
: > "$RES"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
turbine_ok=0
if [ -n "${TURBINE:-}" ]; then
  if "$TURBINE" exec --list-ops >/dev/null 2>&1; then
    turbine_ok=1
  else
    echo "run.sh: $TURBINE has no ONNX front end (exec --list-ops failed): turbine skipped" >&2
  fi
fi
maxb=1; for b in $BATCHES; do [ "$b" -gt "$maxb" ] && maxb=$b; done
minb=$maxb; for b in $BATCHES; do [ "$b" -lt "$minb" ] && minb=$b; done

for m in $MODELS; do
  model="$OUT/${m}_opset17/model.onnx"
  for b in $BATCHES; do
    args=()
    IFS=, read -ra parts <<< "$(shapes "$m" "$b")"
    for p in "${parts[@]}"; do args+=(--shape "$p"); done
    echo "onnxruntime: $m batch $b" >&2
    node "$HERE/ort_bench.js" "$model" "${args[@]}" --threads "$THREADS" --warmup "$WARMUP" \
      --iters "$ITERS" --min-seconds "$MIN_SECONDS" > "$OUT/ort_${m}_b$b.json"
    "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); r.update(peer="onnxruntime", name=sys.argv[2]); print(json.dumps(r))' \
      "$OUT/ort_${m}_b$b.json" "$m" >> "$RES"
  done
  if [ "$turbine_ok" = 1 ]; then
    engine="$OUT/${m}_opset17.engine"
    echo "turbine: building $engine" >&2
    if "$TURBINE" build "$model" -o "$engine" --min-shapes "$(shapes "$m" "$minb")" \
         --opt-shapes "$(shapes "$m" "$minb")" --max-shapes "$(shapes "$m" "$maxb")" >&2; then
      for b in $BATCHES; do
        echo "turbine: $m batch $b" >&2
        j="$OUT/turbine_${m}_b$b.json"
        rm -f "$j"
        if "$TURBINE" bench --engine "$engine" --shapes "$(shapes "$m" "$b")" --threads "$THREADS" \
             --warmup "$TURBINE_WARMUP" --iterations "$TURBINE_ITERS" --json "$j" \
             > "$OUT/turbine_${m}_b$b.txt" 2>&1; then
          "$PY" "$HERE/figures.py" bench-json "$j" "$OUT/turbine_${m}_b$b.txt" "$m" "$b" >> "$RES"
        else
          # no ONNX bench mode: the mean of `turbine exec --repeat N` (after a first run)
          d="$OUT/inputs_${m}_b$b"
          "$PY" "$HERE/figures.py" inputs "$model" "$d" "$(shapes "$m" "$b")"
          if "$TURBINE" exec "$engine" --inputs "$d" --outputs "$d/out" --threads "$THREADS" \
               --repeat "$TURBINE_ITERS" > "$OUT/turbine_${m}_b$b.txt" 2>&1; then
            "$PY" "$HERE/figures.py" exec-mean "$OUT/turbine_${m}_b$b.txt" "$m" "$b" >> "$RES"
          else
            echo "run.sh: turbine bench and exec failed for $m batch $b (see $OUT/turbine_${m}_b$b.txt)" >&2
          fi
        fi
      done
    else
      echo "run.sh: turbine build failed for $m" >&2
    fi
    if [ "${INT8:-0}" = 1 ]; then
      engine8="$OUT/${m}_opset17.int8.engine"
      cal="$OUT/calib_${m}"
      n="${CALIB_SAMPLES:-8}"
      rm -rf "$cal"
      case "$m" in
        resnet18) "$PY" "$ROOT/tests/onnx/int8_models.py" npy "$cal" input "$n" "${minb}x3x224x224" normal ;;
        bert) "$PY" "$ROOT/tests/onnx/int8_models.py" npy "$cal" input_ids "$n" "${minb}x128" ids:30522
              "$PY" "$ROOT/tests/onnx/int8_models.py" npy "$cal" attention_mask "$n" "${minb}x128" ones ;;
      esac
      echo "turbine: building $engine8 (int8, $n calibration sets)" >&2
      if "$TURBINE" build "$model" -o "$engine8" --dtype int8 --calib-data "$cal" --min-shapes "$(shapes "$m" "$minb")" \
           --opt-shapes "$(shapes "$m" "$minb")" --max-shapes "$(shapes "$m" "$maxb")" > "$OUT/turbine_int8_${m}_build.txt" 2>&1; then
        cat "$OUT/turbine_int8_${m}_build.txt" >&2
        for b in $BATCHES; do
          echo "turbine int8: $m batch $b" >&2
          j="$OUT/turbine_int8_${m}_b$b.json"
          rm -f "$j"
          if "$TURBINE" bench --engine "$engine8" --shapes "$(shapes "$m" "$b")" --threads "$THREADS" \
               --warmup "$TURBINE_WARMUP" --iterations "$TURBINE_ITERS" --json "$j" \
               > "$OUT/turbine_int8_${m}_b$b.txt" 2>&1; then
            "$PY" "$HERE/figures.py" bench-json "$j" "$OUT/turbine_int8_${m}_b$b.txt" "$m" "$b" turbine-int8 >> "$RES"
          else
            echo "run.sh: turbine bench failed for the int8 $m batch $b (see $OUT/turbine_int8_${m}_b$b.txt)" >&2
          fi
        done
      else
        cat "$OUT/turbine_int8_${m}_build.txt" >&2
        echo "run.sh: turbine int8 build failed for $m" >&2
      fi
    fi
  fi
done

"$PY" "$HERE/figures.py" table "$RES" "$THREADS" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)"

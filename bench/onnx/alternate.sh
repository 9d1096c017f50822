#!/usr/bin/env bash
# alternate.sh — ONNX Runtime and turbine taking turns on the same files, for
# a shared machine: run.sh times each runtime once, minutes apart, and a
# burst of load from other processes in between decides the ratio; here each
# (model, batch) point runs ROUNDS rounds of ONNX Runtime then turbine, a few
# iterations each, and the table gives per runtime the best run of all rounds
# (the least disturbed: load only adds time) and the median of the rounds'
# medians, with turbine's speed-up on both.
#
#   OUT=/tmp/x TURBINE=build/turbine bash bench/onnx/run.sh     # exports, engines
#   OUT=/tmp/x TURBINE=build/turbine bash bench/onnx/alternate.sh
#
# Environment: OUT (as run.sh; its models and engines are used as they are),
# TURBINE (build/turbine), THREADS (2), BATCHES ("1 8"), MODELS ("resnet18
# bert"), ROUNDS (4), ITERS (5 timed runs a turn), WARMUP (1). BASE_TURBINE
# and BASE_OUT: a second turbine (an older build, with its engines in
# BASE_OUT) taking its turn after the first in every round, for a before /
# after comparison in the same run.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-$ROOT/bench/out/onnx}"
TURBINE="${TURBINE:-$ROOT/build/turbine}"
THREADS="${THREADS:-2}"
BATCHES="${BATCHES:-1 8}"
MODELS="${MODELS:-resnet18 bert}"
ROUNDS="${ROUNDS:-4}"
ITERS="${ITERS:-5}"
WARMUP="${WARMUP:-1}"
PY=/usr/bin/python3

shapes() {
  case "$1" in
    resnet18) echo "input:${2}x3x224x224" ;;
    bert) echo "input_ids:${2}x128,attention_mask:${2}x128" ;;
  esac
}

RES="$OUT/alternate.jsonl"
: > "$RES"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for m in $MODELS; do
  model="$OUT/${m}_opset17/model.onnx" engine="$OUT/${m}_opset17.engine"
  [ -f "$model" ] && [ -f "$engine" ] || { echo "alternate.sh: $model or $engine missing (run run.sh first)" >&2; exit 1; }
  for b in $BATCHES; do
    args=()
    IFS=, read -ra parts <<< "$(shapes "$m" "$b")"
    for p in "${parts[@]}"; do args+=(--shape "$p"); done
    for r in $(seq "$ROUNDS"); do
      echo "alternate: $m batch $b round $r" >&2
      node "$HERE/ort_bench.js" "$model" "${args[@]}" --threads "$THREADS" --warmup "$WARMUP" --iters "$ITERS" \
        > "$OUT/alt_ort.json"
      "$TURBINE" bench --engine "$engine" --shapes "$(shapes "$m" "$b")" --threads "$THREADS" --warmup "$WARMUP" \
        --iterations "$ITERS" --duration 0 --json "$OUT/alt_tb.json" > /dev/null
      base_json=""
      if [ -n "${BASE_TURBINE:-}" ]; then
        base_json="$OUT/alt_base.json"
        "$BASE_TURBINE" bench --engine "$BASE_OUT/${m}_opset17.engine" --shapes "$(shapes "$m" "$b")" \
          --threads "$THREADS" --warmup "$WARMUP" --iterations "$ITERS" --duration 0 --json "$base_json" > /dev/null
      fi
      "$PY" - "$OUT/alt_ort.json" "$OUT/alt_tb.json" "$m" "$b" "$base_json" >> "$RES" <<'EOF'
import json, sys
o, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
r = {"model": sys.argv[3], "batch": int(sys.argv[4]),
     "ort_min": o["latency_ms"]["min"], "ort_median": o["latency_ms"]["median"],
     "tb_min": t["latency_min_ms"], "tb_median": t["latency_median_ms"]}
if sys.argv[5]:
    b = json.load(open(sys.argv[5]))
    r.update(base_min=b["latency_min_ms"], base_median=b["latency_median_ms"])
print(json.dumps(r))
EOF
    done
  done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RES" "$THREADS" "$ROUNDS" "$ITERS" "$load_before" "$load_after" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"ONNX Runtime and turbine alternating, {sys.argv[3]} rounds of {sys.argv[4]} runs each, {sys.argv[2]} threads")
print(f"load average before {sys.argv[5]}, after {sys.argv[6]}")
base = all("base_min" in r for r in rows)
print(f"{'model':9} {'batch':>5} {'ORT best ms':>12} {'tb best ms':>11} {'speed-up':>9} "
      f"{'ORT med ms':>11} {'tb med ms':>10} {'speed-up':>9}" +
      (f" {'base best':>10} {'base med':>9} {'tb/base':>8}" if base else ""))
seen = []
for r in rows:
    k = (r["model"], r["batch"])
    if k not in seen: seen.append(k)
for k in seen:
    rs = [r for r in rows if (r["model"], r["batch"]) == k]
    ob, tb = min(r["ort_min"] for r in rs), min(r["tb_min"] for r in rs)
    om = statistics.median(r["ort_median"] for r in rs)
    tm = statistics.median(r["tb_median"] for r in rs)
    line = f"{k[0]:9} {k[1]:5d} {ob:12.2f} {tb:11.2f} {ob / tb:8.2f}x {om:11.2f} {tm:10.2f} {om / tm:8.2f}x"
    if base:
        bb = min(r["base_min"] for r in rs)
        bm = statistics.median(r["base_median"] for r in rs)
        line += f" {bb:10.2f} {bm:9.2f} {bm / tm:7.2f}x"
    print(line)
EOF

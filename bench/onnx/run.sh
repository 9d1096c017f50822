#!/usr/bin/env bash
# run.sh — ResNet-18 (224x224) and a BERT-base-shape encoder (seq 128), both
# exported from PyTorch at opset 17 with random weights: ONNX Runtime (CPU,
# onnxruntime-node) and, when TURBINE names a binary with the ONNX front end,
# turbine's `bench --engine`, at batch 1 and 8 with 2 threads. Prints one table.
#
#   bash bench/onnx/run.sh                       # ONNX Runtime only
#   TURBINE=build/turbine bash bench/onnx/run.sh # and turbine
#
# Environment: THREADS (2), BATCHES ("1 8"), WARMUP (3), ITERS (20),
# MIN_SECONDS (5: each point runs at least ITERS iterations and this long),
# OUT (bench/out/onnx: the exported models, engines and JSON results).
# Needs /usr/bin/python3 with torch, torchvision and onnx (Debian python3-torch,
# python3-torchvision, python3-onnx) and `npm ci` in bench/onnx.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
THREADS="${THREADS:-2}"
BATCHES="${BATCHES:-1 8}"
WARMUP="${WARMUP:-3}"
ITERS="${ITERS:-20}"
MIN_SECONDS="${MIN_SECONDS:-5}"
OUT="${OUT:-$ROOT/bench/out/onnx}"
PY=/usr/bin/python3
mkdir -p "$OUT"

if [ ! -d "$HERE/node_modules/onnxruntime-node" ]; then
  (cd "$HERE" && npm ci --ignore-scripts --no-audit --no-fund --silent)
fi

# export (once; delete OUT to export again)
for m in resnet18 bert; do
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

for m in resnet18 bert; do
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
             --warmup "$WARMUP" --iters "$ITERS" --json "$j" > "$OUT/turbine_${m}_b$b.txt" 2>&1 \
           || "$TURBINE" bench --engine "$engine" --shapes "$(shapes "$m" "$b")" --threads "$THREADS" \
             --json "$j" > "$OUT/turbine_${m}_b$b.txt" 2>&1; then
          "$PY" - "$j" "$OUT/turbine_${m}_b$b.txt" "$m" "$b" >> "$RES" <<'EOF'
import json, sys
jpath, tpath, name, batch = sys.argv[1:5]
rec = {"peer": "turbine", "name": name, "batch": int(batch)}
try:
    data = json.load(open(jpath))
except (OSError, ValueError):
    try:  # the JSON on stdout instead
        data = json.loads(open(tpath).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        data = None
def walk(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from walk(v, path + (str(k).lower(),))
    elif isinstance(o, list):
        for v in o:
            yield from walk(v, path)
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        yield path, o
lat = {}
if data is not None:
    for path, v in walk(data):
        key = path[-1]
        in_lat = any("lat" in p or p.endswith("_ms") for p in path)
        for want, names in (("min", ("min", "min_ms")), ("mean", ("mean", "mean_ms", "avg")),
                            ("median", ("median", "p50", "median_ms", "p50_ms")), ("p99", ("p99", "p99_ms"))):
            if key in names and in_lat and want not in lat:
                lat[want] = v
        if ("throughput" in key or key.endswith("per_s")) and "throughput_per_s" not in rec:
            rec["throughput_per_s"] = v
    rec["raw"] = data
rec["latency_ms"] = lat
print(json.dumps(rec))
EOF
        else
          echo "run.sh: turbine bench failed for $m batch $b (see $OUT/turbine_${m}_b$b.txt)" >&2
        fi
      done
    else
      echo "run.sh: turbine build failed for $m" >&2
    fi
  fi
done

"$PY" - "$RES" "$THREADS" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"ONNX models, opset 17, random weights, {sys.argv[2]} threads "
      "(ResNet-18 224x224; BERT-base shape, 12 layers, 768 dim, seq 128)")
print(f"load average before {sys.argv[3]}, after {sys.argv[4]} (figures from a busy machine mislead)")
print(f"{'model':<9} {'batch':>5} {'runtime':<18} {'inf/s':>8} {'samples/s':>9} "
      f"{'min ms':>8} {'mean ms':>8} {'median ms':>9} {'p99 ms':>8}")
def f(x):
    return f"{x:.2f}" if isinstance(x, (int, float)) else "-"
for r in sorted(rows, key=lambda r: (r["name"], r["batch"], r["peer"] != "onnxruntime")):
    lat = r.get("latency_ms", {})
    thr = r.get("throughput_per_s")
    sps = r.get("samples_per_s", thr * r["batch"] if isinstance(thr, (int, float)) else None)
    label = r["peer"] + (f" {r['version']}" if r.get("version") and r["peer"] == "onnxruntime" else "")
    print(f"{r['name']:<9} {r['batch']:>5} {label:<18} {f(thr):>8} {f(sps):>9} {f(lat.get('min')):>8} "
          f"{f(lat.get('mean')):>8} {f(lat.get('median')):>9} {f(lat.get('p99')):>8}")
EOF

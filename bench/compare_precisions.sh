#!/usr/bin/env bash
# compare_precisions.sh — the precision experiment in one command: builds f32,
# f16 and int8 engines of one ONNX model, serves each in turn over KServe v2 on
# a loopback port with the dynamic batcher, drives the same load at each (a
# bounded sweep of closed-loop concurrencies and/or open-loop rates), measures
# top-1 agreement of f16 and int8 with f32 on the served outputs, and writes
# one self-contained HTML report plus the figures as JSON. With --llm, also
# builds f32/f16/int8 engines of an LLM checkpoint and runs `turbine compare`
# (perplexity, KL, top-1 agreement) of f16 and int8 against f32.
#
#   bash bench/compare_precisions.sh [--model M.onnx] [--calib-data DIR] [--out DIR]
#        [--slo-ms MS] [-c 1,2,4,8] [--rate R,R...] [-n N] [--duration S]
#        [--max-batch-size N] [--max-queue-delay-us US] [--threads N]
#        [--accuracy-n N] [--seed N] [--tensor-format binary|json]
#        [--llm CHECKPOINT --llm-text FILE [--llm-tokenizer FILE] [--llm-max-tokens N]]
#
# TURBINE (default build/turbine) is the binary. The default model is the
# ResNet-18 export of bench/onnx/run.sh ($BIG/resnet18_opset17/model.onnx,
# BIG default /tmp/big, calibration $BIG/calib_resnet18); without calibration
# data, 8 seeded random input sets are written. Every sweep point is bounded
# by -n requests (and --duration seconds when given). docs/BENCH.md describes
# the figures.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PY=/usr/bin/python3
HELP="$HERE/compare/compare.py"
TURBINE="${TURBINE:-$ROOT/build/turbine}"
BIG="${BIG:-/tmp/big}"
MODEL="" CALIB="" OUT="" SLO=50 CONC="" RATES="" NREQ=200 DUR="" MAXB=8 DELAY=2000
THREADS="" ACC_N=64 SEED=1 FMT=binary LLM="" LLM_TOK="" LLM_TEXT="" LLM_MAXTOK=256

die() { echo "compare_precisions.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift ;;
    --calib-data) CALIB=$2; shift ;;
    --out) OUT=$2; shift ;;
    --slo-ms) SLO=$2; shift ;;
    -c|--concurrency) CONC=$2; shift ;;
    --rate) RATES=$2; shift ;;
    -n|--requests) NREQ=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --max-batch-size) MAXB=$2; shift ;;
    --max-queue-delay-us) DELAY=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --accuracy-n) ACC_N=$2; shift ;;
    --seed) SEED=$2; shift ;;
    --tensor-format) FMT=$2; shift ;;
    --llm) LLM=$2; shift ;;
    --llm-text) LLM_TEXT=$2; shift ;;
    --llm-tokenizer) LLM_TOK=$2; shift ;;
    --llm-max-tokens) LLM_MAXTOK=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[ -x "$TURBINE" ] || die "no turbine binary at $TURBINE (set TURBINE)"
if [ -z "$MODEL" ]; then
  MODEL="$BIG/resnet18_opset17/model.onnx"
  [ -z "$CALIB" ] && [ -d "$BIG/calib_resnet18" ] && CALIB="$BIG/calib_resnet18"
fi
[ -f "$MODEL" ] || die "no model $MODEL (--model, or export it: bench/onnx/run.sh)"
[ -n "$LLM" ] && [ ! -f "$LLM_TEXT" ] && die "--llm needs --llm-text FILE (the text turbine compare scores)"
[ -n "$CONC$RATES" ] || CONC="1,2,4,8"
OUT="${OUT:-$ROOT/build/compare_precisions}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
name=model

# the build profile: batch 1 to --max-batch-size, optimised for the largest
s1=$("$PY" "$HELP" shapes "$MODEL" 1)
sb=$("$PY" "$HELP" shapes "$MODEL" "$MAXB")
if [ -z "$CALIB" ]; then
  CALIB="$OUT/calib"
  rm -rf "$CALIB"
  "$PY" "$HELP" calib "$MODEL" "$CALIB" 8 "$SEED"
fi

# turbine bench runs one kind of sweep at a time: closed loop, then open loop
bound=(-n "$NREQ")
[ -n "$DUR" ] && bound+=(--duration "$DUR")
sweeps=()
[ -n "$CONC" ] && sweeps+=("-c $CONC")
[ -n "$RATES" ] && sweeps+=("--rate $RATES")
load=("${sweeps[@]}" "${bound[@]}")
thr=()
[ -n "$THREADS" ] && thr=(--threads "$THREADS")
serve_args="--max-batch-size $MAXB --max-queue-delay-us $DELAY${THREADS:+ --threads $THREADS}"
machine="$(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT/config.json" "$MODEL" "$serve_args" "${load[*]} --tensor-format $FMT" "$machine" "$SLO" <<'PYEOF'
import json, sys, time
json.dump({"model": sys.argv[2], "serve_args": sys.argv[3], "load": sys.argv[4], "machine": sys.argv[5],
           "slo_ms": float(sys.argv[6]), "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
          open(sys.argv[1], "w"))
PYEOF

spid=""
stop_server() { if [ -n "$spid" ]; then kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; spid=""; fi; }
trap stop_server EXIT

for dt in f32 f16 int8; do
  d="$OUT/$dt"
  rm -rf "$d"; mkdir -p "$d"
  eng="$d/model.engine"
  extra=()
  [ "$dt" = int8 ] && extra=(--calib-data "$CALIB")
  echo "== $dt: build" >&2
  t0=$(date +%s.%N)
  "$TURBINE" build "$MODEL" -o "$eng" --dtype "$dt" "${extra[@]}" --min-shapes "$s1" --opt-shapes "$sb" \
    --max-shapes "$sb" >"$d/build.txt" 2>&1 || { cat "$d/build.txt" >&2; die "build of the $dt engine failed"; }
  t1=$(date +%s.%N)
  port=$("$PY" "$HELP" port)
  url="http://127.0.0.1:$port"
  echo "== $dt: serve on $url" >&2
  "$TURBINE" serve "$eng" --port "$port" --model-name "$name" --max-batch-size "$MAXB" \
    --max-queue-delay-us "$DELAY" --max-body 256MiB "${thr[@]}" >"$d/serve.txt" 2>&1 &
  spid=$!
  ready=0
  for _ in $(seq 300); do
    if "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url/v2/health/ready" 2>/dev/null; then ready=1; break; fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  [ $ready = 1 ] || { cat "$d/serve.txt" >&2; die "the $dt server did not become ready"; }
  echo "== $dt: accuracy ($ACC_N rows)" >&2
  "$PY" "$HELP" accuracy "$url" "$name" "$ACC_N" "$SEED" "$d/accuracy.json"
  echo "== $dt: load ${load[*]}" >&2
  k=0
  for sw in "${sweeps[@]}"; do
    # shellcheck disable=SC2086 # $sw is "-c LIST" or "--rate LIST"
    "$TURBINE" bench "$url" --endpoint kserve --model "$name" --tensor-format "$FMT" $sw "${bound[@]}" --seed "$SEED" \
      --no-progress --json "$d/bench_$k.json" >"$d/bench_$k.txt" 2>&1 || { cat "$d/bench_$k.txt" >&2; die "bench of $dt failed"; }
    k=$((k + 1))
  done
  "$PY" -c 'import json,sys; r=[json.load(open(f)) for f in sys.argv[2:]]; a=r[0]; a["points"]=[p for x in r for p in x["points"]]
json.dump(a, open(sys.argv[1], "w"))' "$d/bench.json" "$d"/bench_[0-9]*.json
  rss=$(awk '/VmHWM/ {print $2 / 1024}' "/proc/$spid/status" 2>/dev/null || echo null)
  stop_server
  "$PY" -c 'import json,os,sys; json.dump({"engine_bytes": os.path.getsize(sys.argv[2]), "build_s": float(sys.argv[3]),
    "server_peak_rss_mib": float(sys.argv[4]) if sys.argv[4] not in ("", "null") else None}, open(sys.argv[1], "w"))' \
    "$d/meta.json" "$eng" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "${rss:-null}"
done

if [ -n "$LLM" ]; then
  # the LLM: accuracy only (the OpenAI sweep is `turbine bench`'s own, docs/BENCH.md)
  L="$OUT/llm"; mkdir -p "$L"
  tok=()
  [ -n "$LLM_TOK" ] && tok=(--tokenizer "$LLM_TOK")
  for dt in f32 f16 int8; do
    echo "== llm $dt: build" >&2
    t0=$(date +%s.%N)
    "$TURBINE" build "$LLM" "${tok[@]}" -o "$L/$dt.engine" --dtype "$dt" >"$L/$dt.build.txt" 2>&1 \
      || { cat "$L/$dt.build.txt" >&2; die "LLM $dt build failed"; }
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$L/$dt.build_s"
    if [ "$dt" != f32 ]; then
      echo "== llm $dt: turbine compare against f32" >&2
      "$TURBINE" compare "$L/f32.engine" "$L/$dt.engine" --text "$LLM_TEXT" --max-tokens "$LLM_MAXTOK" \
        "${thr[@]}" >"$L/$dt.compare.txt" 2>&1 || { cat "$L/$dt.compare.txt" >&2; die "turbine compare of $dt failed"; }
    fi
  done
  "$PY" - "$OUT/llm.json" "$L" "$LLM" "$LLM_TEXT" <<'PYEOF'
import json, os, sys
L = sys.argv[2]
e = []
for dt in ("f32", "f16", "int8"):
    c = os.path.join(L, dt + ".compare.txt")
    x = {"dtype": dt, "engine_bytes": os.path.getsize(os.path.join(L, dt + ".engine")),
         "build_s": float(open(os.path.join(L, dt + ".build_s")).read()),
         "compare": open(c).read().strip() if os.path.exists(c) else "(the reference)"}
    # turbine compare's lines: "A perplexity P nll N FILE", "B perplexity ...", "kl mean K p99 ...",
    # "top1 agreement F (n of m)"
    for line in x["compare"].splitlines():
        w = line.split()
        if len(w) >= 3 and w[1] == "perplexity":
            x["perplexity_f32" if w[0] == "A" else "perplexity"] = float(w[2])
        elif len(w) >= 3 and w[:2] == ["kl", "mean"]:
            x["kl_mean"] = float(w[2])
        elif len(w) >= 3 and w[:2] == ["top1", "agreement"]:
            x["top1_agreement"] = float(w[2])
    e.append(x)
json.dump({"checkpoint": sys.argv[3], "text": sys.argv[4], "engines": e}, open(sys.argv[1], "w"))
PYEOF
fi

"$PY" "$HELP" report "$OUT" "$SLO"
echo "report: $OUT/report.html (figures: $OUT/report.json)" >&2

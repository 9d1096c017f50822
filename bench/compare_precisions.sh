#!/usr/bin/env bash
# compare_precisions.sh — the precision experiment in one command: builds f32,
# f16 and int8 engines of one ONNX model, serves each in turn over KServe v2 on
# a loopback port with the dynamic batcher, drives the same load at each (a
# bounded sweep of closed-loop concurrencies and/or open-loop rates), measures
# top-1 agreement of f16 and int8 with f32 on the served outputs, and writes
# one self-contained HTML report plus the figures as JSON. With --llm, also
# builds engines of an LLM checkpoint (cpu: f32 f16 int8; cuda: f32 f16 int8
# int4 fp8), runs `turbine compare` (perplexity, KL, top-1 agreement) of each
# against f32, serves each in turn over the OpenAI API and drives the same
# sweep at each with `turbine bench` (QPS and output tokens/s at a TTFT p99
# SLO, TTFT / TPOT / E2E percentiles).
#
#   bash bench/compare_precisions.sh [--model M.onnx] [--calib-data DIR] [--out DIR]
#        [--device cpu|cuda[:N]] [--dtypes f32,f16,int8] [--slo-ms MS] [-c 1,2,4,8] [--rate R,R...] [-n N]
#        [--duration S] [--max-batch-size N] [--max-queue-delay-us US] [--threads N]
#        [--accuracy-n N] [--seed N] [--tensor-format binary|json] [--min-shapes S --max-shapes S]
#        [--llm CHECKPOINT --llm-text FILE [--llm-tokenizer FILE] [--llm-max-tokens N]
#         [--llm-dtypes f32,f16,...] [--llm-c 1,2,4,8] [--llm-rate R,...] [--llm-n N]
#         [--llm-duration S] [--llm-input-len N] [--llm-output-len N] [--llm-slo-ms MS]
#         [--llm-max-batch N] [--llm-max-seq-len N] [--no-llm-serve]] [--no-onnx]
#
# TURBINE (default build/turbine) is the binary. The default model is the
# ResNet-18 export of bench/onnx/run.sh ($BIG/resnet18_opset17/model.onnx,
# BIG default /tmp/big, calibration $BIG/calib_resnet18); without calibration
# data, 8 seeded random input sets are written. Every sweep point is bounded
# by -n requests (and --duration seconds when given) and is one `turbine
# bench` run, during which the server's /metrics is scraped every 0.25 s for
# the GPU gauges (mean utilisation, peak memory, the model's own device
# memory). --device cuda builds the f32 and f16 ONNX engines for the GPU;
# int8 ONNX engines are CPU-only in turbine, so int8 is built and served on
# the CPU and labelled so. The LLM SLO is on TTFT p99 (--llm-slo-ms, default
# 1000). --no-onnx skips the ONNX part (the LLM alone). docs/BENCH.md
# describes the figures.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PY="${TB_PYTHON:-/usr/bin/python3}"
HELP="$HERE/compare/compare.py"
TURBINE="${TURBINE:-$ROOT/build/turbine}"
BIG="${BIG:-/tmp/big}"
MODEL="" CALIB="" OUT="" SLO=50 CONC="" RATES="" NREQ=200 DUR="" MAXB=8 DELAY=2000
THREADS="" ACC_N=64 SEED=1 FMT=binary LLM="" LLM_TOK="" LLM_TEXT="" LLM_MAXTOK=256 DEV=cpu ONNX=1
LLM_DTYPES="" LLM_CONC="" LLM_RATES="" LLM_N=32 LLM_DUR="" LLM_IN=64 LLM_OUTLEN=32 LLM_SLO=1000
LLM_MAXB="" LLM_MAXSEQ="" LLM_SERVE=1 S1="" SB="" ONNX_DTYPES=f32,f16,int8
SCRAPE_S="${SCRAPE_S:-0.25}"

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
    --device) DEV=$2; shift ;;
    --min-shapes) S1=$2; shift ;;
    --max-shapes) SB=$2; shift ;;
    --no-onnx) ONNX="" ;;
    --dtypes) ONNX_DTYPES=$2; shift ;;
    --llm-dtypes) LLM_DTYPES=$2; shift ;;
    --llm-c) LLM_CONC=$2; shift ;;
    --llm-rate) LLM_RATES=$2; shift ;;
    --llm-n) LLM_N=$2; shift ;;
    --llm-duration) LLM_DUR=$2; shift ;;
    --llm-input-len) LLM_IN=$2; shift ;;
    --llm-output-len) LLM_OUTLEN=$2; shift ;;
    --llm-slo-ms) LLM_SLO=$2; shift ;;
    --llm-max-batch) LLM_MAXB=$2; shift ;;
    --llm-max-seq-len) LLM_MAXSEQ=$2; shift ;;
    --no-llm-serve) LLM_SERVE="" ;;
    -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[ -x "$TURBINE" ] || die "no turbine binary at $TURBINE (set TURBINE)"
case "$DEV" in cpu|cuda|cuda:[0-9]*) ;; *) die "--device $DEV: cpu, cuda or cuda:N" ;; esac
[ -n "$ONNX$LLM" ] || die "--no-onnx without --llm leaves nothing to run"
if [ -n "$ONNX" ] && [ -z "$MODEL" ]; then
  MODEL="$BIG/resnet18_opset17/model.onnx"
  [ -z "$CALIB" ] && [ -d "$BIG/calib_resnet18" ] && CALIB="$BIG/calib_resnet18"
fi
[ -z "$ONNX" ] || [ -f "$MODEL" ] || die "no model $MODEL (--model, or export it: bench/onnx/run.sh)"
[ -n "$LLM" ] && [ ! -f "$LLM_TEXT" ] && die "--llm needs --llm-text FILE (the text turbine compare scores)"
[ -n "$CONC$RATES" ] || CONC="1,2,4,8"
[ -n "$LLM_CONC$LLM_RATES" ] || LLM_CONC="1,2,4,8"
if [ -z "$LLM_DTYPES" ]; then
  # what `turbine build --dtype` makes and runs per device (fp8 and int4 matmuls are GPU work; the CPU
  # runs them too, but the experiment's CPU set stays the one of the CPU tables)
  if [ "$DEV" = cpu ]; then LLM_DTYPES="f32,f16,int8"; else LLM_DTYPES="f32,f16,int8,int4,fp8"; fi
fi
case ",$LLM_DTYPES," in *,f32,*) ;; *) LLM_DTYPES="f32,$LLM_DTYPES" ;; esac # the accuracy reference
OUT="${OUT:-$ROOT/build/compare_precisions}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
name=model
thr=()
[ -n "$THREADS" ] && thr=(--threads "$THREADS")
machine="$(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$DEV" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  machine="$machine; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
fi

spid=""
scpid=""
stop_scrape() { if [ -n "$scpid" ]; then kill "$scpid" 2>/dev/null || true; wait "$scpid" 2>/dev/null || true; scpid=""; fi; }
stop_server() { stop_scrape; if [ -n "$spid" ]; then kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; spid=""; fi; }
trap stop_server EXIT
trap 'exit 143' TERM INT # a timeout's SIGTERM still stops the server (the EXIT trap)

# wait_ready URL PATH LOG WHAT: until URL/PATH answers 200 (30 s), or the server exits
wait_ready() {
  local _
  for _ in $(seq 300); do
    if "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1$2" 2>/dev/null; then return 0; fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$3" >&2
  die "the $4 server did not become ready"
}

# sweep DIR URL MODEL WHAT BENCH_ARGS... -- KIND LIST [KIND LIST]: one `turbine bench` run per
# sweep point (KIND -c or --rate, LIST its comma list), the server's /metrics scraped during
# each into DIR/gpu_K.jsonl; DIR/bench.json gets every point
sweep() {
  local d=$1 url=$2 model=$3 what=$4 k=0 kind list v
  shift 4
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  rm -f "$d"/bench_[0-9]*.json "$d"/gpu_[0-9]*.jsonl
  while [ $# -gt 0 ]; do
    kind=$1 list=$2
    shift 2
    for v in ${list//,/ }; do
      "$PY" "$HELP" scrape "$url" "$model" "$d/gpu_$k.jsonl" "$SCRAPE_S" &
      scpid=$!
      # the first sample before the load starts (5 s at most)
      for _ in $(seq 50); do [ -s "$d/gpu_$k.jsonl" ] && break; sleep 0.1; done
      "$TURBINE" bench "$url" --model "$model" "${args[@]}" "$kind" "$v" --seed "$SEED" --no-progress \
        --json "$d/bench_$k.json" >"$d/bench_$k.txt" 2>&1 || { stop_scrape; cat "$d/bench_$k.txt" >&2; die "bench of $what ($kind $v) failed"; }
      stop_scrape
      k=$((k + 1))
    done
  done
  local files=() j
  for ((j = 0; j < k; j++)); do files+=("$d/bench_$j.json"); done
  "$PY" -c 'import json,sys; r=[json.load(open(f)) for f in sys.argv[2:]]; a=r[0]; a["points"]=[p for x in r for p in x["points"]]
json.dump(a, open(sys.argv[1], "w"))' "$d/bench.json" "${files[@]}"
}

# meta DIR ENGINE T0 T1 DEVICE: engine size, build time, the server's peak RSS (read before it stops)
meta() {
  local rss
  rss=$(awk '/VmHWM/ {print $2 / 1024}' "/proc/$spid/status" 2>/dev/null || echo null)
  "$PY" -c 'import json,os,sys; json.dump({"engine_bytes": os.path.getsize(sys.argv[2]), "build_s": float(sys.argv[3]),
    "server_peak_rss_mib": float(sys.argv[4]) if sys.argv[4] not in ("", "null") else None, "device": sys.argv[5]},
    open(sys.argv[1], "w"))' "$1/meta.json" "$2" "$(awk -v a="$3" -v b="$4" 'BEGIN { print b - a }')" "${rss:-null}" "$5"
}

sweeps=()
[ -n "$CONC" ] && sweeps+=(-c "$CONC")
[ -n "$RATES" ] && sweeps+=(--rate "$RATES")
bound=(-n "$NREQ")
[ -n "$DUR" ] && bound+=(--duration "$DUR")
serve_args="--max-batch-size $MAXB --max-queue-delay-us $DELAY${THREADS:+ --threads $THREADS}"
"$PY" - "$OUT/config.json" "${MODEL:-}" "$serve_args" "${sweeps[*]} ${bound[*]} --tensor-format $FMT" "$machine" "$SLO" "$DEV" <<'PYEOF'
import json, sys, time
json.dump({"model": sys.argv[2], "serve_args": sys.argv[3], "load": sys.argv[4], "machine": sys.argv[5],
           "slo_ms": float(sys.argv[6]), "device": sys.argv[7],
           "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
          open(sys.argv[1], "w"))
PYEOF

if [ -n "$ONNX" ]; then
  # the build profile: batch 1 to --max-batch-size, optimised for the largest
  # (--min-shapes / --max-shapes give it without reading the model: no onnx module needed)
  s1=${S1:-$("$PY" "$HELP" shapes "$MODEL" 1)}
  sb=${SB:-$("$PY" "$HELP" shapes "$MODEL" "$MAXB")}
  if [ -z "$CALIB" ]; then
    CALIB="$OUT/calib"
    rm -rf "$CALIB"
    "$PY" "$HELP" calib "$MODEL" "$CALIB" 8 "$SEED"
  fi
  case ",$ONNX_DTYPES," in *,f32,*) ;; *) ONNX_DTYPES="f32,$ONNX_DTYPES" ;; esac # the accuracy reference
  for dt in ${ONNX_DTYPES//,/ }; do
    case $dt in f32|f16|int8) ;; *) die "--dtypes: f32, f16, int8 (not $dt)" ;; esac
    d="$OUT/$dt"
    rm -rf "$d"; mkdir -p "$d"
    eng="$d/model.engine"
    extra=()
    [ "$dt" = int8 ] && extra=(--calib-data "$CALIB")
    # int8 ONNX engines run on the CPU only: on a GPU run they are built and served there, labelled so
    edev=$DEV
    [ "$dt" = int8 ] && edev=cpu
    echo "== $dt: build ($edev)" >&2
    t0=$(date +%s.%N)
    "$TURBINE" build "$MODEL" -o "$eng" --dtype "$dt" --device "$edev" "${extra[@]}" --min-shapes "$s1" --opt-shapes "$sb" \
      --max-shapes "$sb" >"$d/build.txt" 2>&1 || { cat "$d/build.txt" >&2; die "build of the $dt engine failed"; }
    t1=$(date +%s.%N)
    port=$("$PY" "$HELP" port)
    url="http://127.0.0.1:$port"
    echo "== $dt: serve on $url" >&2
    "$TURBINE" serve "$eng" --port "$port" --model-name "$name" --max-batch-size "$MAXB" \
      --max-queue-delay-us "$DELAY" --max-body 256MiB "${thr[@]}" >"$d/serve.txt" 2>&1 &
    spid=$!
    wait_ready "$url" /v2/health/ready "$d/serve.txt" "$dt"
    echo "== $dt: accuracy ($ACC_N rows)" >&2
    "$PY" "$HELP" accuracy "$url" "$name" "$ACC_N" "$SEED" "$d/accuracy.json"
    echo "== $dt: load ${sweeps[*]} ${bound[*]}" >&2
    sweep "$d" "$url" "$name" "$dt" --endpoint kserve --tensor-format "$FMT" "${bound[@]}" -- "${sweeps[@]}"
    meta "$d" "$eng" "$t0" "$t1" "$edev"
    stop_server
  done
fi

if [ -n "$LLM" ]; then
  # the LLM: every engine compared with f32 (turbine compare), then served over the OpenAI API
  # and loaded with the same sweep
  L="$OUT/llm"
  rm -rf "$L"; mkdir -p "$L"
  tok=()
  [ -n "$LLM_TOK" ] && tok=(--tokenizer "$LLM_TOK")
  lb=()
  [ -n "$LLM_MAXB" ] && lb+=(--max-batch "$LLM_MAXB")
  [ -n "$LLM_MAXSEQ" ] && lb+=(--max-seq-len "$LLM_MAXSEQ")
  lsweeps=()
  [ -n "$LLM_CONC" ] && lsweeps+=(-c "$LLM_CONC")
  [ -n "$LLM_RATES" ] && lsweeps+=(--rate "$LLM_RATES")
  lbound=(-n "$LLM_N")
  [ -n "$LLM_DUR" ] && lbound+=(--duration "$LLM_DUR")
  lload="${lsweeps[*]} ${lbound[*]} --input-len $LLM_IN --output-len $LLM_OUTLEN"
  "$PY" - "$L/config.json" "$LLM" "$LLM_TEXT" "${thr[*]}" "$lload" "$DEV" "${lb[*]}" <<'PYEOF'
import json, sys
json.dump({"checkpoint": sys.argv[2], "text": sys.argv[3], "serve_args": sys.argv[4] or "(defaults)", "load": sys.argv[5],
           "device": sys.argv[6], "build_args": sys.argv[7]}, open(sys.argv[1], "w"))
PYEOF
  for dt in ${LLM_DTYPES//,/ }; do
    d="$L/$dt"; mkdir -p "$d"
    eng="$d/model.engine"
    qa=()
    [ "$dt" = int4 ] && qa=(--group-size 128)
    echo "== llm $dt: build ($DEV)" >&2
    t0=$(date +%s.%N)
    "$TURBINE" build "$LLM" "${tok[@]}" -o "$eng" --dtype "$dt" "${qa[@]}" --device "$DEV" "${lb[@]}" >"$d/build.txt" 2>&1 \
      || { cat "$d/build.txt" >&2; die "LLM $dt build failed"; }
    t1=$(date +%s.%N)
    if [ "$dt" != f32 ]; then
      echo "== llm $dt: turbine compare against f32" >&2
      "$TURBINE" compare "$L/f32/model.engine" "$eng" --text "$LLM_TEXT" --max-tokens "$LLM_MAXTOK" \
        "${thr[@]}" >"$d/compare.txt" 2>&1 || { cat "$d/compare.txt" >&2; die "turbine compare of $dt failed"; }
    fi
    if [ -n "$LLM_SERVE" ]; then
      port=$("$PY" "$HELP" port)
      url="http://127.0.0.1:$port"
      echo "== llm $dt: serve on $url, load $lload" >&2
      "$TURBINE" serve "$eng" --port "$port" --model-name llm "${thr[@]}" >"$d/serve.txt" 2>&1 &
      spid=$!
      wait_ready "$url" /health "$d/serve.txt" "LLM $dt"
      sweep "$d" "$url" llm "LLM $dt" "${lbound[@]}" --input-len "$LLM_IN" --output-len "$LLM_OUTLEN" -- "${lsweeps[@]}"
    fi
    meta "$d" "$eng" "$t0" "$t1" "$DEV"
    stop_server
  done
fi

"$PY" "$HELP" report "$OUT" "$SLO" "$LLM_SLO"
echo "report: $OUT/report.html (figures: $OUT/report.json)" >&2

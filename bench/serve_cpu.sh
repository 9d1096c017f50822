#!/usr/bin/env bash
# serve_cpu.sh — the serving benchmark on the CPU: aggregate generated tok/s of
# `turbine serve` at 1, 4, 8, 16 and 64 concurrent streams (closed loop,
# measured with `turbine bench`), beside the engine's in-process decode
# throughput at the same batch sizes (`turbine bench --engine`). Model: the
# 134M Llama of the CPU benchmark (random weights), f32 by default.
#
# The HTTP + tokenization overhead per token is measured where it is largest
# relative to the work: stories260K (260K parameters, ~40 us per decode step)
# served to one stream, against the same engine in-process; the difference in
# time per token is what serving adds (HTTP, SSE, detokenization, scheduling,
# and the load generator itself, which shares these two cores), and it is
# reported as a fraction of the 134M model's decode step.
#
#   bench/serve_cpu.sh [--dtype f32|f16] [--output-len N] [--requests-per-client N]
# Writes bench/out/serve/*.json and prints a markdown table last, then the
# batch-8 / batch-1 ratio of three interleaved rounds (served and in-process).
set -euo pipefail
cd "$(dirname "$0")/.."
DTYPE=f32 OUT_LEN=64 PER_CLIENT=3 IN_LEN=32
while [ $# -gt 0 ]; do
  case "$1" in
    --dtype) DTYPE="$2"; shift 2;;
    --output-len) OUT_LEN="$2"; shift 2;;
    --requests-per-client) PER_CLIENT="$2"; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
SHARED="${TURBINE_SHARED:-../shared}"
O=bench/out/serve
mkdir -p "$O"
[ -x build/turbine ] || bash scripts/setup.sh
CK=bench/out/ckpt/llama134m-f32
[ -f "$CK/model.safetensors" ] || /usr/bin/python3 tests/gen_checkpoints.py --preset llama134m --dtype f32 --out "$CK"
E="$O/llama134m-$DTYPE.engine"
[ -f "$E" ] || ./build/turbine build "$CK" -o "$E" --tokenizer "$SHARED/models/llama2_tokenizer.bin" --dtype "$DTYPE" --max-batch 64 2>/dev/null

echo "== engine in-process decode (batch 1, 4, 16, 64)" >&2
timeout 900 ./build/turbine bench --engine "$E" --batch 1,4,8,16,64 --input-len "$IN_LEN" --output-len "$OUT_LEN" \
  --json "$O/engine-$DTYPE.json" >&2

PORT=$((20000 + RANDOM % 20000))
./build/turbine serve "$E" --port "$PORT" --max-num-seqs 64 --max-queue 1024 2>"$O/serve.log" &
SRV=$!
trap 'kill -INT $SRV 2>/dev/null; wait $SRV 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
echo "== served (closed loop, concurrency 1, 4, 16, 64)" >&2
for c in 1 4 8 16 64; do
  n=$((c * PER_CLIENT))
  timeout 900 ./build/turbine bench "http://127.0.0.1:$PORT" -c "$c" -n "$n" --warmup "$c" \
    --input-len "$IN_LEN" --output-len "$OUT_LEN" --json "$O/serve-$DTYPE-c$c.json" --no-progress >&2
done
# batch 8 against batch 1: this machine's memory bandwidth switches between
# modes over minutes, so one stream and eight streams are measured in turn,
# three rounds, served and in-process, and the ratio is taken per round
echo "== batch 8 vs batch 1, interleaved (3 rounds)" >&2
for r in 1 2 3; do
  for c in 1 8; do
    timeout 900 ./build/turbine bench "http://127.0.0.1:$PORT" -c "$c" -n $((c * 2)) --warmup "$c" \
      --input-len "$IN_LEN" --output-len "$OUT_LEN" --json "$O/serve-$DTYPE-r$r-c$c.json" --no-progress >&2
  done
done
curl -s "http://127.0.0.1:$PORT/metrics" >"$O/metrics-$DTYPE.txt"
kill -INT $SRV; wait $SRV 2>/dev/null || true
for r in 1 2 3; do
  timeout 900 ./build/turbine bench --engine "$E" --batch 1,8 --input-len "$IN_LEN" --output-len "$OUT_LEN" \
    --json "$O/engine-$DTYPE-r$r.json" >&2
done

echo "== per-token serving overhead (stories260K, one stream)" >&2
SE="$O/stories260K.engine"
./build/turbine build "$SHARED/models/stories260K/stories260K.bin" --tokenizer "$SHARED/models/stories260K/tok512.bin" \
  -o "$SE" 2>/dev/null
timeout 300 ./build/turbine bench --engine "$SE" --batch 1 --input-len 8 --output-len 400 --json "$O/engine-stories.json" >&2
./build/turbine serve "$SE" --port "$PORT" 2>>"$O/serve.log" &
SRV=$!
for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
timeout 300 ./build/turbine bench "http://127.0.0.1:$PORT" -c 1 -n 20 --warmup 2 --input-len 8 --output-len 400 \
  --json "$O/serve-stories.json" --no-progress >&2

/usr/bin/python3 - "$O" "$DTYPE" <<'PY'
import json, sys
o, dt = sys.argv[1], sys.argv[2]
eng = {p["batch"]: p for p in json.load(open(f"{o}/engine-{dt}.json"))["points"]}
print(f"| streams | served gen tok/s | vs 1 stream | engine decode tok/s (batch = streams) | served / engine | TTFT p50 ms | ITL p50 ms |")
print("|---|---|---|---|---|---|---|")
base = None
for c in (1, 4, 8, 16, 64):
    pt = json.load(open(f"{o}/serve-{dt}-c{c}.json"))["points"][0]
    tok = pt["output_token_throughput"]
    base = base or tok
    etok = eng[c]["decode_tokens_per_s"]
    print(f"| {c} | {tok:.1f} | {tok / base:.2f}x | {etok:.1f} | {tok / etok:.2f} | {pt['ttft']['p50_ms']:.1f} | {pt['itl']['p50_ms']:.2f} |")
served, inproc = [], []
for r in (1, 2, 3):
    one = json.load(open(f"{o}/serve-{dt}-r{r}-c1.json"))["points"][0]["output_token_throughput"]
    eight = json.load(open(f"{o}/serve-{dt}-r{r}-c8.json"))["points"][0]["output_token_throughput"]
    served.append((eight / one, one, eight))
    e = {p["batch"]: p["decode_tokens_per_s"] for p in json.load(open(f"{o}/engine-{dt}-r{r}.json"))["points"]}
    inproc.append((e[8] / e[1], e[1], e[8]))
med = lambda v: sorted(x[0] for x in v)[1]
print()
print("batch 8 / batch 1, three interleaved rounds (gen tok/s 1 stream -> 8 streams):")
print("  served:     " + "; ".join(f"{a:.1f} -> {b:.1f} = {x:.2f}x" for x, a, b in served) + f"; median {med(served):.2f}x")
print("  in-process: " + "; ".join(f"{a:.1f} -> {b:.1f} = {x:.2f}x" for x, a, b in inproc) + f"; median {med(inproc):.2f}x")
step = eng[1]["decode_step_p50_ms"]
es = json.load(open(f"{o}/engine-stories.json"))["points"][0]
ss = json.load(open(f"{o}/serve-stories.json"))["points"][0]
e_us = es["decode_step_p50_ms"] * 1e3
s_us = ss["itl"]["p50_ms"] * 1e3
print()
print(f"stories260K one stream: engine step p50 {e_us:.1f} us, served ITL p50 {s_us:.1f} us: "
      f"serving adds {s_us - e_us:.1f} us per token = {100 * (s_us - e_us) / 1e3 / step:.2f}% of the "
      f"134M {dt} decode step ({step:.2f} ms)")
PY

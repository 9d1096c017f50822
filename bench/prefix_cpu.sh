#!/usr/bin/env bash
# prefix_cpu.sh — what prefix caching saves: time to first token of requests
# that share a long beginning (a system prompt of --prefix-len words), served
# by `turbine serve` with prefix caching on and with --no-prefix-caching, in
# alternating rounds of one run (this machine's speed drifts; compare the
# ratio). One client at a time by default, so TTFT is the prefill of one
# prompt; with --concurrency N, N clients start together and the server
# computes the shared prefix once, the others waiting for its blocks.
# Model: the 134M Llama of the CPU benchmark (random weights), f32, 2 threads.
#
#   bench/prefix_cpu.sh [--prefix-len N] [--input-len N] [--requests N] [--rounds N] [--concurrency N]
# Writes bench/out/prefix/*.json and prints a markdown table last.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=480 IN_LEN=32 REQS=10 ROUNDS=3 CONC=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix-len) PREFIX="$2"; shift 2;;
    --input-len) IN_LEN="$2"; shift 2;;
    --requests) REQS="$2"; shift 2;;
    --rounds) ROUNDS="$2"; shift 2;;
    --concurrency) CONC="$2"; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
# one warm-up request writes the prefix when clients come one at a time; a burst starts cold
WARM=1; [ "$CONC" -gt 1 ] && WARM=0
SHARED="${TURBINE_SHARED:-../shared}"
O=bench/out/prefix
mkdir -p "$O"
[ -x build/turbine ] || bash scripts/setup.sh
CK=bench/out/ckpt/llama134m-f32
[ -f "$CK/model.safetensors" ] || /usr/bin/python3 tests/gen_checkpoints.py --preset llama134m --dtype f32 --out "$CK"
E="$O/llama134m-f32.engine"
[ -f "$E" ] || ./build/turbine build "$CK" -o "$E" --tokenizer "$SHARED/models/llama2_tokenizer.bin" --max-batch 8 2>/dev/null
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
SPID=
stop_server() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null; SPID=; }
trap stop_server EXIT
serve() { # serve MODE: on | off
  local extra=(); [ "$1" = off ] && extra=(--no-prefix-caching)
  ./build/turbine serve "$E" --port "$PORT" --threads 2 "${extra[@]}" >"$O/serve-$1.log" 2>&1 &
  SPID=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0; sleep 0.1; done
  echo "server did not start: $(tail -3 "$O/serve-$1.log")" >&2; exit 1
}
for r in $(seq "$ROUNDS"); do
  for mode in on off; do
    serve "$mode"
    timeout 600 ./build/turbine bench "http://127.0.0.1:$PORT" -c "$CONC" -n "$REQS" --warmup "$WARM" --prefix-len "$PREFIX" \
      --input-len "$IN_LEN" --output-len 8 --no-progress --no-gpu --json "$O/$mode-r$r.json" >/dev/null
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^turbine_prefix_cache_(hits|queries)_total' >"$O/$mode-r$r.metrics"
    stop_server
  done
done
/usr/bin/python3 - "$O" "$ROUNDS" "$PREFIX" "$IN_LEN" "$CONC" <<'PY'
import json, sys
o, rounds, prefix, inl, conc = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def load(mode, r):
    j = json.load(open("%s/%s-r%d.json" % (o, mode, r)))
    p = j["points"][0]
    m = dict(l.split() for l in open("%s/%s-r%d.metrics" % (o, mode, r)))
    hits = sum(float(v) for k, v in m.items() if k.startswith("turbine_prefix_cache_hits_total"))
    q = sum(float(v) for k, v in m.items() if k.startswith("turbine_prefix_cache_queries_total"))
    return p, hits, q
print("| round | caching | clients | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | req/s | prompt tokens reused |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for r in range(1, rounds + 1):
    t = {}
    for mode in ("on", "off"):
        p, hits, q = load(mode, r)
        ttft, e2e = p["ttft"], p["e2e"]
        t[mode] = ttft["p50_ms"]
        print("| %d | %s | %s | %.1f | %.1f | %.1f | %.2f | %.0f of %.0f |" % (
            r, mode, conc, ttft["p50_ms"], ttft["p99_ms"], e2e["p50_ms"], p["request_throughput"], hits, q))
    ratios.append(t["off"] / t["on"])
print("\nTTFT p50 without / with prefix caching (prefix %s words + %s own): %s" %
      (prefix, inl, " ".join("%.2fx" % x for x in ratios)))
PY

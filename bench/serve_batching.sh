#!/usr/bin/env bash
# serve_batching.sh — what the dynamic batcher buys for one KServe v2 engine:
# served QPS at saturation with batch-1 serving against the batcher, and the
# P99 latency at half the batcher's saturation against an unloaded request.
#
#   bash bench/serve_batching.sh ENGINE [--device cpu|cuda] [--threads N]
#        [--max-batch-size 8] [--delay-us 2000] [-c 16] [--duration 8] [--rounds 2]
#        [--instance-count N] [--model-warmup auto|on|off] [--bound] [--out DIR]
#
# Per round, for each of two servers started in turn on a loopback port
# (`--max-batch-size 1`, then `--max-batch-size B --max-queue-delay-us D`):
#   unloaded   one client, one request at a time (-c 1), --duration seconds:
#              E2E p50 is "an unloaded request"
#   saturated  -c C clients, closed loop, --duration seconds: the QPS
# then, on the batcher's server, an open loop (Poisson) at half its saturated
# QPS for --duration seconds: its P99 against the unloaded p50. Binary tensors,
# random inputs of the engine's metadata shapes (batch dim 1). Prints one table
# (and writes DIR/batching.md and the turbine bench JSON files), then the
# server's own view of the half-load point (mean batch, queue and compute
# ms per request from its /metrics histograms); --instance-count N gives the
# batcher's server N instances (contexts) of the engine; --model-warmup is
# passed to both servers. --bound (one instance only) also times the
# engine's calls at batch 1..B after each round and prints, beside the
# measured figures, what no server can beat on this machine
# (bench/batch_bound.py: the engine's own batching gain, and the half-load
# P99 of a queue with those call times). Every load
# point is bounded by time and by count (-n 100000).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TURBINE="${TURBINE:-$ROOT/build/turbine}"
PY=/usr/bin/python3
ENGINE="" DEVICE=cpu THREADS="" INST="" WARM="" BOUND=0 MAXB=8 DELAY=2000 CONC=16 DUR=8 ROUNDS=2 OUT=""
die() { echo "serve_batching.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --instance-count) INST=$2; shift ;;
    --model-warmup) WARM=$2; shift ;;
    --bound) BOUND=1 ;;
    --max-batch-size) MAXB=$2; shift ;;
    --delay-us) DELAY=$2; shift ;;
    -c) CONC=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$ENGINE" ] || die "one engine only"; ENGINE=$1 ;;
  esac
  shift
done
[ -n "$ENGINE" ] && [ -f "$ENGINE" ] || die "usage: serve_batching.sh ENGINE [options] (no engine file '$ENGINE')"
[ -x "$TURBINE" ] || die "no turbine binary at $TURBINE (set TURBINE)"
OUT=${OUT:-$(mktemp -d /tmp/serve_batching.XXXXXX)}
mkdir -p "$OUT"
MODEL=$(basename "$ENGINE" .engine)
SRV_PID=""
stop() { [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null; SRV_PID=""; }
trap stop EXIT
port_of() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() { # start MAXB [DELAY]
  local port; port=$(port_of)
  local args=(serve "$ENGINE" --host 127.0.0.1 --port "$port" --device "$DEVICE" --max-batch-size "$1")
  [ -n "${2:-}" ] && args+=(--max-queue-delay-us "$2")
  [ -n "${2:-}" ] && [ -n "$INST" ] && args+=(--instance-count "$INST")
  [ -n "$WARM" ] && args+=(--model-warmup "$WARM")
  [ -n "$THREADS" ] && args+=(--threads "$THREADS")
  "$TURBINE" "${args[@]}" > "$OUT/server_b$1.log" 2>&1 &
  SRV_PID=$!
  URL=http://127.0.0.1:$port
  for _ in $(seq 1 600); do
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$URL/v2/models/$MODEL/ready" \
        > /dev/null 2>&1 && return 0
    kill -0 "$SRV_PID" 2>/dev/null || { cat "$OUT/server_b$1.log" >&2; die "the server exited"; }
    sleep 0.1
  done
  die "the server did not become ready in 60 s"
}
load() { # load NAME ARGS... -> $OUT/NAME.json
  local name=$1; shift
  "$TURBINE" bench "$URL" --endpoint kserve --model "$MODEL" --tensor-format binary -n 100000 --duration "$DUR" \
      --warmup 8 --no-progress --json "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1 ||
      { tail -5 "$OUT/$name.txt" >&2; die "turbine bench failed ($name)"; }
}
field_json() { # field_json FILE EXPR: EXPR over the JSON object j of FILE
  "$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
field() { # field FILE EXPR: a figure of the first point of a turbine bench JSON
  "$PY" -c 'import json, sys; p = json.load(open(sys.argv[1]))["points"][0]; print(eval(sys.argv[2]))' "$1" "$2"
}
ROWS=() SROWS=() BROWS=()
[ "$BOUND" = 1 ] && [ -n "$INST" ] && [ "$INST" != 1 ] && die "--bound models one instance"
ngt() { "$PY" -c "print(f'{$1:.2f}')"; }
srv() { # srv FILE: the half-load point's server histograms, or "-"
  field "$1" '"%.2f | %.3f | %.3f | %.3f" % (p["server"]["batch_size"]["mean"], p["server"]["queue_ms"]["mean"], p["server"]["queue_ms"].get("p99", float("nan")), p["server"]["compute_ms"]["mean"]) if p.get("server") and p["server"].get("valid") else "- | - | - | -"' 2>/dev/null || echo "- | - | - | -"
}
for r in $(seq 1 "$ROUNDS"); do
  start 1
  load "r${r}_b1_unloaded" -c 1
  load "r${r}_b1_saturated" -c "$CONC"
  stop
  start "$MAXB" "$DELAY"
  load "r${r}_bN_unloaded" -c 1
  load "r${r}_bN_saturated" -c "$CONC"
  half=$("$PY" -c "print(round($(field "$OUT/r${r}_bN_saturated.json" 'p["request_throughput"]') / 2, 2))")
  load "r${r}_bN_half" --rate "$half"
  stop
  q1=$(field "$OUT/r${r}_b1_saturated.json" 'round(p["request_throughput"], 2)')
  qn=$(field "$OUT/r${r}_bN_saturated.json" 'round(p["request_throughput"], 2)')
  u1=$(field "$OUT/r${r}_b1_unloaded.json" 'round(p["e2e"]["p50_ms"], 3)')
  un=$(field "$OUT/r${r}_bN_unloaded.json" 'round(p["e2e"]["p50_ms"], 3)')
  hq=$(field "$OUT/r${r}_bN_half.json" 'round(p["request_throughput"], 2)')
  h99=$(field "$OUT/r${r}_bN_half.json" 'round(p["e2e"]["p99_ms"], 3)')
  mb=$(field "$OUT/r${r}_bN_saturated.json" 'round(p["server"]["batch_size"]["mean"], 2) if p.get("server") and p["server"].get("batch_size") else "-"')
  SROWS+=("| $r | $hq | $(field "$OUT/r${r}_bN_half.json" 'round(p["e2e"]["p50_ms"], 3)') | $h99 | $(srv "$OUT/r${r}_bN_half.json") |")
  ROWS+=("| $r | $q1 | $qn | $("$PY" -c "print(f'{$qn / $q1:.2f}x')") | $mb | $u1 / $un | $hq | $h99 | $("$PY" -c "print(f'{$h99 / $un:.2f}x')") |")
  if [ "$BOUND" = 1 ]; then
    bargs=(--engine "$ENGINE" --turbine "$TURBINE" --max-batch "$MAXB" --delay-us "$DELAY" --json "$OUT/r${r}_bound.json")
    [ -n "$THREADS" ] && bargs+=(--threads "$THREADS")
    [ "$DEVICE" != cpu ] && bargs+=(--device "$DEVICE")
    "$PY" "$HERE/batch_bound.py" "${bargs[@]}" > "$OUT/r${r}_bound.txt" 2>&1 ||
        { cat "$OUT/r${r}_bound.txt" >&2; die "batch_bound.py failed"; }
    bf() { field_json "$OUT/r${r}_bound.json" "$1"; }
    lim=$(bf 'j["batching_limit"]'); p99f=$(bf 'j["batcher_p99_over_unloaded"]'); fifo=$(bf '"%.2fx" % j["fifo_p99_over_unloaded"] if j["fifo_p99_over_unloaded"] else "none (load above batch-1 capacity)"')
    BROWS+=("| $r | $(ngt "$lim")x | $(ngt "$qn / $q1")x | $(ngt "$qn / $q1 / $lim") | $(ngt "$p99f")x | $fifo | $(ngt "$h99 / $un")x | $(ngt "$h99 / $un / $p99f") |")
  fi
done
{
  echo "engine $ENGINE, device $DEVICE, batcher $MAXB rows / $DELAY us${INST:+, $INST instances}, -c $CONC, $DUR s a point ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "| round | QPS batch 1 | QPS batcher | batcher / batch 1 | mean batch | unloaded E2E p50 ms (b1 / batcher) | half-load req/s | half-load P99 ms | P99 / unloaded |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "| round | half-load req/s | E2E p50 ms | E2E p99 ms | server: mean batch | queue mean ms | queue p99 ms | compute mean ms |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${SROWS[@]}"
  if [ "$BOUND" = 1 ]; then
    echo
    echo "What no server can beat on this machine (bench/batch_bound.py after each round: the engine's calls timed at"
    echo "batch 1..$MAXB; the P99 floors from a simulated queue of those call times at half the batched saturation):"
    echo
    echo "| round | batching limit | served batcher / batch 1 | served / limit | half-load P99 floor, batcher | floor, FIFO batch 1 | measured P99 / unloaded | measured / floor |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${BROWS[@]}"
  fi
} | tee "$OUT/batching.md"

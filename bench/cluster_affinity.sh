#!/usr/bin/env bash
# cluster_affinity.sh — does session affinity pay? Two replicas of one engine behind nginx
# (scripts/cluster.sh), multi-turn chat sessions (`turbine bench --sessions`, a shared system
# prompt, each turn resending the conversation so far) driven through nginx:
#   affinity     nginx hashes X-Session-ID: a conversation's turns reach one replica
#   round robin  --affinity none --balance round_robin: turns go to the replicas in turn
# Each run starts a fresh cluster (empty prefix caches); the two alternate per round.
# Reported per run: the prefix-cache hit rate over both replicas (from their /metrics),
# TTFT p50 of turn 1 and of turns 2.., and requests/s.
#
#   bench/cluster_affinity.sh [ENGINE] [--rounds N] [--sessions N] [--turns K] [-c C]
#                             [--system-prompt-len L] [--input-len I] [--output-len O]
# ENGINE defaults to the demo model; the 134M model of bench/serve_cpu.sh makes the prefill
# (and so what the cache saves) large enough to show in TTFT.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE="" ROUNDS=2 SESS=16 TURNS=4 CONC=2 SYS=128 IN=24 OUT=16 PORT=18700
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --sessions) SESS="$2"; shift 2 ;;
    --turns) TURNS="$2"; shift 2 ;;
    -c) CONC="$2"; shift 2 ;;
    --system-prompt-len) SYS="$2"; shift 2 ;;
    --input-len) IN="$2"; shift 2 ;;
    --output-len) OUT="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) ENGINE="$1"; shift ;;
  esac
done
[ -x build/turbine ] || bash scripts/setup.sh
export TURBINE_BIN="${TURBINE_BIN:-$PWD/build/turbine}"
O="$PWD/bench/out/cluster_affinity"
rm -rf "$O"; mkdir -p "$O"
if [ -z "$ENGINE" ]; then
  "$TURBINE_BIN" build models/demo/shakespeare -o "$O/demo.engine" > "$O/build.log" 2>&1
  ENGINE="$O/demo.engine"
fi
C="$O/c"
trap 'scripts/cluster.sh stop --dir "$C" --timeout 20 > /dev/null 2>&1 || true' EXIT
R="http://127.0.0.1:$((PORT + 1)),http://127.0.0.1:$((PORT + 2))"
run() { # $1 label, then cluster.sh start options
  local label=$1; shift
  scripts/cluster.sh start --engine "$ENGINE" --replicas 2 --port "$PORT" --dir "$C" --threads-per-replica 1 "$@" \
    > "$O/$label.start.log" 2>&1
  timeout 900 "$TURBINE_BIN" bench "http://127.0.0.1:$PORT" --endpoint chat --sessions "$SESS" --turns "$TURNS" \
    -c "$CONC" --system-prompt-len "$SYS" --input-len "$IN" --output-len "$OUT" --replica-metrics "$R" \
    --no-progress --json "$O/$label.json" > "$O/$label.txt" 2>&1
  scripts/cluster.sh stop --dir "$C" --timeout 20 > /dev/null 2>&1
  /usr/bin/python3 - "$O/$label.json" "$label" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["points"][0]
tot, ses, reps = p["replicas_total"], p["sessions"], p["replicas"]
bt = ses["by_turn"]
later = [t["ttft_p50_ms"] for t in bt[1:]]
rps = "%.2f" % p["request_throughput"]
print("%-12s hit rate %5.1f%%  TTFT p50 turn 1 %8.2f ms, turns 2..%d %s ms (mean %.2f)  shares %s  failed %d  req/s %s" % (
    sys.argv[2], 100 * tot["prefix_cache_hit_rate"], bt[0]["ttft_p50_ms"], len(bt),
    "/".join("%.1f" % x for x in later), sum(later) / len(later),
    "/".join("%.0f%%" % (100 * r["share"]) for r in reps), sum(t["requests_failed"] for t in bt), rps))
PY
}
echo "engine $ENGINE; $SESS conversations x $TURNS turns, -c $CONC, system prompt $SYS words, input $IN, output $OUT; $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  run "affinity-$r" --affinity header
  run "roundrobin-$r" --affinity none --balance round_robin
done

#!/usr/bin/env bash
# cluster.sh — two replicas of the demo model behind nginx (scripts/cluster.sh), measured:
#
#   (a) nginx's overhead: TTFT P50 through nginx and at a replica directly, `turbine bench`
#       closed loop with one client (8-word prompts, 4 tokens: a short prefill, so that the
#       proxy's share is visible), interleaved rounds in one run; and the P50 latency of
#       GET /health both ways (the proxy alone, no model work).
#   (b) a replica killed: a closed-loop load (streamed and plain requests, each on a new
#       connection) over both replicas for --fail-duration seconds; replica 2 gets kill -9
#       at a third of it and is started again at two thirds. Counted: the requests that
#       failed (and when), every request after the kill, and when replica 2 served again.
#   (c) a rolling restart of both replicas (scripts/rolling_restart.sh) under the same load:
#       failed requests, streams without [DONE], streams that were in flight on a replica
#       at its SIGTERM.
#
#   bench/cluster.sh [--fail-duration S] [--rolling-duration S] [--rounds N] [--port P]
#                    [--overhead-only] [--pin]
# --pin: the replicas run on the last core (taskset), apart from the load generator, so that
# on a 2-core machine the client, nginx and the replica do not queue for one core.
# Writes bench/out/cluster/*.json and the logs there; prints a summary last.
set -euo pipefail
cd "$(dirname "$0")/.."
FAIL_S=45 ROLL_S=30 ROUNDS=15 PORT=18600 CONC=4 ONLY_A=0 PIN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fail-duration) FAIL_S="$2"; shift 2 ;;
    --rolling-duration) ROLL_S="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --overhead-only) ONLY_A=1; shift ;;
    --pin) PIN=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
O="$PWD/bench/out/cluster"
rm -rf "$O"; mkdir -p "$O"
[ -x build/turbine ] || bash scripts/setup.sh
export TURBINE_BIN="${TURBINE_BIN:-$PWD/build/turbine}"
B="$TURBINE_BIN"
C="$O/c"
"$B" build models/demo/shakespeare -o "$O/demo.engine" > "$O/build.log" 2>&1
trap 'scripts/cluster.sh stop --dir "$C" --timeout 20 > /dev/null 2>&1 || true' EXIT

start() {
  local t="$TURBINE_BIN"
  if [ "$PIN" = 1 ]; then
    # the replicas on the last core, the load generator (and so mostly nginx) on the others
    local last=$(($(nproc) - 1))
    printf '#!/bin/sh\nexec taskset -c %s %q "$@"\n' "$last" "$TURBINE_BIN" > "$O/pinned-turbine"
    chmod +x "$O/pinned-turbine"
    t="$O/pinned-turbine"
  fi
  TURBINE_BIN="$t" scripts/cluster.sh start --engine "$O/demo.engine" --replicas 2 --port "$PORT" --dir "$C" \
    --threads-per-replica 1 2>&1 | tail -1 >&2
}

# ---------- (a) overhead ----------------------------------------------------------------
start
# Through nginx every request carries one X-Session-ID, so all reach the same replica (the
# affinity hash): the one measured directly. --no-metrics: no /metrics scrapes on either side.
H="X-Session-ID: overhead"
REP=$(curl -s -o /dev/null -D - -H "$H" "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"a","max_tokens":1}' |
  tr -d '\r' | sed -n 's/^X-Turbine-Upstream: //Ip')
echo "nginx sends session 'overhead' to $REP" >&2
N=200
for r in $(seq 1 "$ROUNDS"); do
  for via in direct nginx; do
    url="http://127.0.0.1:$PORT"; [ "$via" = direct ] && url="http://$REP"
    # a new --seed per run: cold prefix caches, the same lengths
    "$B" bench "$url" -c 1 -n "$N" --warmup 5 --input-len 8 --output-len 4 --seed "$((r * 10 + ${#via}))" \
      -H "$H" --no-progress --no-gpu --no-metrics --json "$O/ttft-$via-$r.json" > /dev/null 2>> "$O/bench.err"
    "$B" bench "$url/health" --endpoint get -c 1 -n 2000 -H "$H" --no-progress --no-gpu --no-metrics \
      --json "$O/health-$via-$r.json" > /dev/null 2>> "$O/bench.err"
  done
done
/usr/bin/python3 - "$O" "$ROUNDS" > "$O/overhead.txt" <<'EOF'
import json, statistics, sys
o, rounds = sys.argv[1], int(sys.argv[2])
def p(kind, via, r, fig):
    pt = json.load(open("%s/%s-%s-%d.json" % (o, kind, via, r)))["points"][0]
    assert pt["requests_failed"] == 0, (kind, via, r, pt["errors"])
    return pt[fig]["p50_ms"]
for kind, fig in (("ttft", "ttft"), ("health", "e2e")):
    d = [p(kind, "direct", r, fig) for r in range(1, rounds + 1)]
    n = [p(kind, "nginx", r, fig) for r in range(1, rounds + 1)]
    diff = [b - a for a, b in zip(d, n)]
    print("%-6s P50 ms  direct %s  nginx %s  added %s  (median added %.3f ms)" % (
        "TTFT" if kind == "ttft" else "GET /health", " ".join("%.3f" % x for x in d),
        " ".join("%.3f" % x for x in n), " ".join("%+.3f" % x for x in diff), statistics.median(diff)))
EOF
cat "$O/overhead.txt" >&2
if [ "$ONLY_A" = 1 ]; then
  echo "== bench/cluster.sh $(date -u +%F) $(nproc) cores, 2 replicas x 1 thread, demo model"
  echo "-- (a) nginx overhead, $ROUNDS interleaved rounds"; cat "$O/overhead.txt"
  exit 0
fi

# ---------- the load client of (b) and (c): tests/serve/cluster_load.py -------------------
LOAD_PY="$PWD/tests/serve/cluster_load.py"

# ---------- (b) kill -9 --------------------------------------------------------------------
scripts/cluster.sh stop --dir "$C" > /dev/null 2>&1
start
/usr/bin/python3 "$LOAD_PY" "$PORT" --threads "$CONC" --duration "$FAIL_S" > "$O/fail.jsonl" &
LOAD=$!
sleep "$(awk -v s="$FAIL_S" 'BEGIN { print s / 3 }')"
KILL_T=$(date +%s.%N); kill -9 "$(cat "$C/replica-2.pid")"
sleep "$(awk -v s="$FAIL_S" 'BEGIN { print s / 3 }')"
RESTART_T=$(date +%s.%N); scripts/cluster.sh start-replica --dir "$C" --replica 2 2> "$O/restart.log"
UP_T=$(date +%s.%N)
wait "$LOAD"
RETRIED=$(grep -c "connect() failed (111: Connection refused)" "$C/logs/nginx_error.log" || true)
/usr/bin/python3 - "$O/fail.jsonl" "$KILL_T" "$RESTART_T" "$UP_T" "$PORT" "$RETRIED" > "$O/fail.txt" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
kill, restart, up, port, retried = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
r2 = "127.0.0.1:%d" % (port + 2)
bad = [r for r in recs if not r["ok"]]
inflight = [r for r in recs if r["start"] < kill < r["end"]]
after = [r for r in recs if r["start"] > kill]
back = sorted(r["start"] for r in recs if r["upstream"] == r2 and r["start"] > restart)
print("requests %d (%d streamed); failed %d: %s" % (len(recs), sum(r["stream"] for r in recs), len(bad),
      ", ".join("%s %s at kill%+.2fs" % ("stream" if r["stream"] else "plain", r["why"], r["end"] - kill) for r in bad)))
print("in flight at the kill: %d (on replica 2: %d streams, %d plain); failed among them: %d" % (
      len(inflight), sum(1 for r in inflight if r["upstream"] == r2 and r["stream"]),
      sum(1 for r in inflight if r["upstream"] == r2 and not r["stream"]), sum(1 for r in inflight if not r["ok"])))
print("started after the kill: %d, failed %d; connections refused by the dead replica and retried by nginx: %s" % (
      len(after), sum(1 for r in after if not r["ok"]), retried))
print("replica 2 restarted: healthy %.1f s after start-replica; first request served %.1f s after healthy; %d requests served by it afterwards" % (
      up - restart, (back[0] - up) if back else float("nan"), len(back)))
EOF
cat "$O/fail.txt" >&2

# ---------- (c) rolling restart ---------------------------------------------------------------
/usr/bin/python3 "$LOAD_PY" "$PORT" --threads "$CONC" --duration "$ROLL_S" > "$O/rolling.jsonl" &
LOAD=$!
sleep 3
RR_T0=$(date +%s.%N)
scripts/rolling_restart.sh --dir "$C" > "$O/rolling.log" 2>&1 && RR_RC=0 || RR_RC=$?
RR_T1=$(date +%s.%N)
wait "$LOAD"
T1=$(sed -n 's/.*stop: SIGTERM at \([0-9.]*\).*/\1/p' "$C/logs/replica-1.log" | tail -1)
T2=$(sed -n 's/.*stop: SIGTERM at \([0-9.]*\).*/\1/p' "$C/logs/replica-2.log" | tail -1)
/usr/bin/python3 - "$O/rolling.jsonl" "$PORT" "$T1" "$T2" "$RR_RC" "$RR_T0" "$RR_T1" > "$O/rolling.txt" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
port = int(sys.argv[2]); term = {"127.0.0.1:%d" % (port + 1): float(sys.argv[3]), "127.0.0.1:%d" % (port + 2): float(sys.argv[4])}
rc, t0, t1 = sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
bad = [r for r in recs if not r["ok"]]
streams = [r for r in recs if r["stream"]]
during = [r for r in recs if r["end"] > t0 and r["start"] < t1]
drained = [r for r in recs if r["upstream"] in term and r["start"] < term[r["upstream"]] < r["end"]]
print("rolling_restart.sh exit %s in %.1f s; requests %d (%d streamed), %d during the restart; failed %d; streams without [DONE] %d" % (
      rc, t1 - t0, len(recs), len(streams), len(during), len(bad), sum(1 for r in streams if not r["ok"])))
print("in flight on a replica at its SIGTERM and completed: %d (%d streams)" % (
      sum(1 for r in drained if r["ok"]), sum(1 for r in drained if r["ok"] and r["stream"])))
EOF
cat "$O/rolling.txt" >&2
scripts/cluster.sh stop --dir "$C" > /dev/null 2>&1

echo "== bench/cluster.sh $(date -u +%F) $(nproc) cores, 2 replicas x 1 thread, demo model"
echo "-- (a) nginx overhead, $ROUNDS interleaved rounds"; cat "$O/overhead.txt"
echo "-- (b) kill -9 of replica 2 under $CONC clients for $FAIL_S s"; cat "$O/fail.txt"
echo "-- (c) rolling restart under $CONC clients for $ROLL_S s"; cat "$O/rolling.txt"

#!/usr/bin/env bash
# `turbine bench --endpoint get` against wrk (Debian) on the same trivial
# loopback endpoint (tests/bench/health_server.c, built here), measured in the
# same run on the same machine: turbine's request rate (its default, built-in
# HTTP/1.1 client, one thread) must be at least half of wrk's (one thread).
# Both run in alternating short rounds (ROUNDS, default 5, of SECS seconds);
# the best rate of each is compared, which filters out rounds slowed by other
# work on a shared machine. The median of the per-round ratios is printed too.
# TURBINE_BENCH_WRK_MIN overrides the 0.5 threshold. Also: 1,000 concurrent
# connections from the one thread, all answered, with both clients.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/bench_wrk"
mkdir -p "$D"
PY=/usr/bin/python3
if ! command -v wrk >/dev/null; then echo "skip: wrk not installed (apt-get install wrk)"; exit 0; fi
${CC:-cc} -O2 -o "$D/health_server" "$TURBINE_SRC/tests/bench/health_server.c" || { echo "FAIL: cannot build the server"; exit 1; }
rm -f "$D/port"
"$D/health_server" "$D/port" 180 &
spid=$!
trap 'kill $spid 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s "$D/port" ] && break; sleep 0.1; done
[ -s "$D/port" ] || { echo "FAIL: the server did not start"; exit 1; }
URL="http://127.0.0.1:$(cat "$D/port")/health"
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-1}
CONNS=${CONNS:-64}
want=${TURBINE_BENCH_WRK_MIN:-0.5}
fails=0
echo "conditions: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), -c $CONNS, ${SECS}s rounds"
: >"$D/rounds"
for round in $(seq "$ROUNDS"); do
  w=$(timeout 30 wrk -t1 -c"$CONNS" -d"${SECS}s" "$URL" | awk '/Requests\/sec/ {print $2}')
  timeout 30 "$TURBINE_BIN" bench "$URL" --endpoint get -c "$CONNS" -d "$SECS" --no-metrics --no-progress --no-gpu \
    --json "$D/t.json" >"$D/t.out" 2>&1
  t=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['points'][0]['request_throughput'])" "$D/t.json" 2>/dev/null)
  echo "round $round: wrk ${w:-?} req/s, turbine bench ${t:-?} req/s"
  echo "${w:-0} ${t:-0}" >>"$D/rounds"
done
"$PY" - "$D/rounds" "$want" <<'EOF' && echo "ok: turbine bench >= $want x wrk" || { echo "FAIL: turbine bench below $want x wrk"; fails=$((fails+1)); }
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
want = float(sys.argv[2])
bw = max(w for w, _ in rows)
bt = max(t for _, t in rows)
ratios = [t / w for w, t in rows if w > 0]
ratio = bt / max(1.0, bw)
print("best: wrk %.0f req/s, turbine bench %.0f req/s, ratio %.2f (median of rounds %.2f)"
      % (bw, bt, ratio, statistics.median(ratios) if ratios else 0))
sys.exit(0 if ratio >= want else 1)
EOF
for client in builtin curl; do
  timeout 60 "$TURBINE_BIN" bench "$URL" --endpoint get -c 1000 -n 20000 --http-client $client --no-metrics \
    --no-progress --no-gpu --json "$D/c1000.json" >"$D/c1000.out" 2>&1
  grep -q '"requests_ok": 20000' "$D/c1000.json" && echo "ok: 1000 concurrent connections ($client)" \
    || { echo "FAIL: 1000 connections ($client)"; cat "$D/c1000.out"; fails=$((fails+1)); }
done
[ "$fails" = 0 ]

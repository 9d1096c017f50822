#!/usr/bin/env bash
# scripts/cluster.sh and scripts/rolling_restart.sh with the real nginx on loopback: two
# replicas of the demo model behind nginx. Start and status; X-Session-ID affinity (the
# replicas' own request counters); least connections without it; the API key at the edge;
# a rolling restart under a bounded concurrent load (streamed and plain requests) with no
# failed request and every stream ending with [DONE], streams in flight on a replica
# when nginx takes it out of rotation included; kill -9 of a replica: every later request still succeeds through
# nginx, and the replica rejoins; stop: every pid gone, every port closed.
. "$(dirname "$0")/tb_test.sh"
# (Debian's nginx is /usr/sbin/nginx, outside a user's PATH; scripts/cluster.sh looks there too)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { echo "SKIP: nginx is not installed (Debian package nginx)"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl is not installed"; exit 77; }
tb_test_dir cluster
CL="$TURBINE_SRC/scripts/cluster.sh"
RR="$TURBINE_SRC/scripts/rolling_restart.sh"
C="$D/c"
export TURBINE_BIN

"$TURBINE_BIN" build "$TURBINE_SRC/models/demo/shakespeare" -o "$D/demo.engine" >"$D/build.log" 2>&1 \
  || { cat "$D/build.log"; fail "demo engine build"; tb_test_finish test_cluster; }

# free_ports N: the first of N free consecutive ports (taken just before each
# cluster starts: a port free now may be a client socket's source port later)
free_ports() {
  $PY - "$1" <<'EOF'
import socket, sys
n = int(sys.argv[1])
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p + n - 1 > 65535: continue
    held = []
    try:
        for q in range(p, p + n):
            t = socket.socket(); t.bind(("127.0.0.1", q)); held.append(t)
        for t in held: t.close()
        print(p); break
    except OSError:
        for t in held: t.close()
EOF
}
# nginx P, replicas P+1, P+2
P=$(free_ports 3)
[ -n "$P" ] || { fail "no three free consecutive ports"; tb_test_finish test_cluster; }

cleanup() { [ -f "$C/cluster.env" ] && "$CL" stop --dir "$C" --timeout 10 >/dev/null 2>&1; [ -f "$D/k/cluster.env" ] && "$CL" stop --dir "$D/k" --timeout 10 >/dev/null 2>&1; true; }
trap cleanup EXIT

# code PATH [curl args] -> the status through nginx; up PATH [args] -> the replica's address
code() { local p=$1; shift; curl -s -o /dev/null -m 30 -w '%{http_code}' "http://127.0.0.1:$P$p" "$@"; }
up() {
  local p=$1; shift
  curl -s -o /dev/null -m 30 -D - "http://127.0.0.1:$P$p" "$@" | tr -d '\r' | sed -n 's/^X-Turbine-Upstream: //Ip' | tail -1
}
BODY='{"prompt":"ROMEO:","max_tokens":8}'
# finished requests of replica I, from its own /metrics
finished() {
  curl -s -m 10 "http://127.0.0.1:$((P + $1))/metrics" |
    awk '/^turbine_requests_finished_total/ { s += $NF } END { print s + 0 }'
}

# --- start ---------------------------------------------------------------------------
t0=$(date +%s.%N)
# --max-num-seqs 1: a replica runs one request and queues the rest, so the requests it holds
# when it is drained last a few generations, however fast the machine (the drain finishes
# the queued ones as well as the running one)
if "$CL" start --engine "$D/demo.engine" --replicas 2 --port "$P" --dir "$C" --threads-per-replica 1 \
     --fail-timeout 2 -- --max-num-seqs 1 > "$D/start.log" 2>&1; then
  ok "cluster.sh start: 2 replicas and nginx in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
else
  cat "$D/start.log"; fail "cluster.sh start"; tb_test_finish test_cluster
fi
"$CL" status --dir "$C" > "$D/status.txt" 2>&1 && grep -c "running  /health 200" "$D/status.txt" | grep -qx 3 \
  && ok "status: nginx and both replicas running, /health 200" || { cat "$D/status.txt"; fail "status after start"; }
[ -f "$C/nginx.pid" ] && [ -f "$C/replica-1.pid" ] && [ -f "$C/logs/replica-2.log" ] && [ -f "$C/nginx.conf" ] \
  && ok "pids, logs and nginx.conf in the cluster folder" || fail "files missing in $C: $(ls "$C")"
PIDS0="$(cat "$C/nginx.pid" "$C"/replica-*.pid | tr '\n' ' ')"
WORKERS0="$(ps -o pid= --ppid "$(cat "$C/nginx.pid")" | tr '\n' ' ')"

st=$(code /v1/completions -d "$BODY")
[ "$st" = 200 ] && ok "a completion through nginx: 200" || fail "a completion through nginx: $st"
curl -sN -m 30 "http://127.0.0.1:$P/v1/completions" -d '{"prompt":"ROMEO:","max_tokens":40,"stream":true}' > "$D/stream.txt"
[ "$(grep -c '^data: ' "$D/stream.txt")" -ge 10 ] && [ "$(tail -n 2 "$D/stream.txt" | head -1)" = "data: [DONE]" ] \
  && ok "a stream through nginx: $(grep -c '^data: ' "$D/stream.txt") events, ends with [DONE]" \
  || fail "stream through nginx: $(tail -c 300 "$D/stream.txt")"
st=$(code /v2/models/demo/infer -d '{"inputs":[{"name":"text_input","shape":[1],"datatype":"BYTES","data":["ROMEO:"]}]}')
[ "$st" = 200 ] && ok "KServe v2 infer through nginx: 200" || fail "v2 infer through nginx: $st"
for i in 1 2; do
  m=$(curl -s -m 10 "http://127.0.0.1:$P/replica/$i/metrics")
  grep -q '^turbine_requests_finished_total' <<< "$m" \
    && ok "replica $i's /metrics at /replica/$i/metrics" || fail "/replica/$i/metrics"
done

# --- affinity --------------------------------------------------------------------------
a1=$(finished 1); a2=$(finished 2)
first=$(up /v1/completions -H 'X-Session-ID: conversation-7' -d "$BODY")
same=1
for _ in 1 2 3 4 5; do
  u=$(up /v1/completions -H 'X-Session-ID: conversation-7' -d "$BODY")
  [ "$u" = "$first" ] || same=0
done
b1=$(finished 1); b2=$(finished 2)
d1=$((b1 - a1)); d2=$((b2 - a2))
if [ "$same" = 1 ] && { [ "$d1/$d2" = 6/0 ] || [ "$d1/$d2" = 0/6 ]; }; then
  ok "6 requests with one X-Session-ID: all on $first (replica counters +$d1, +$d2)"
else
  fail "affinity: upstream $first same=$same, replica counters +$d1 and +$d2 (want 6 and 0)"
fi
declare -A seen=()
for s in $(seq 1 16); do seen[$(up /v1/completions -H "X-Session-ID: user-$s" -d "$BODY")]=1; done
[ "${#seen[@]}" = 2 ] && ok "16 sessions spread over both replicas" || fail "16 sessions reached ${#seen[@]} replica(s): ${!seen[*]}"
seen=()
for s in $(seq 1 6); do seen[$(up /v1/completions -d "$BODY")]=1; done
[ "${#seen[@]}" = 2 ] && ok "without X-Session-ID: least connections uses both replicas" \
  || fail "no session header: ${#seen[@]} replica(s) used"
# the session that replica 2 holds: used below when replica 2 dies
SESS2=""
for s in $(seq 1 16); do
  [ "$(up /v1/completions -H "X-Session-ID: user-$s" -d "$BODY")" = "127.0.0.1:$((P + 2))" ] && { SESS2="user-$s"; break; }
done

[ -n "$SESS2" ] || fail "none of 16 sessions hashed to replica 2"

# --- rolling restart under load -----------------------------------------------------------
old1=$(cat "$C/replica-1.pid"); old2=$(cat "$C/replica-2.pid")
rm -f "$D/stop"
$PY "$TURBINE_SRC/tests/serve/cluster_load.py" "$P" --stop-file "$D/stop" --threads 6 --max-requests 1500 \
  --duration 40 --stream-tokens 440 --timeout 60 > "$D/load.jsonl" 2> "$D/load.err" &
LOAD=$!
sleep 1
if "$RR" --dir "$C" --timeout 30 > "$D/rolling.log" 2>&1; then rr=0; else rr=$?; fi
sleep 1; touch "$D/stop"; wait "$LOAD"
[ "$rr" = 0 ] && ok "rolling_restart.sh exit 0" || { cat "$D/rolling.log"; fail "rolling_restart.sh exit $rr"; }
new1=$(cat "$C/replica-1.pid" 2>/dev/null); new2=$(cat "$C/replica-2.pid" 2>/dev/null)
[ -n "$new1" ] && [ -n "$new2" ] && [ "$new1" != "$old1" ] && [ "$new2" != "$old2" ] && kill -0 "$new1" "$new2" 2>/dev/null \
  && ok "both replicas are new processes ($old1 -> $new1, $old2 -> $new2)" || fail "replica pids after the restart: $new1 $new2"
# the times nginx took each replica out of rotation (cluster.sh mark writes them into the
# replica's log; its SIGTERM follows once nginx's old workers finished what they held, so
# the replica's own drain of a stream at SIGTERM is tests/test_serve_shutdown.sh's)
T1=$(sed -n 's/.*mark: down at \([0-9.]*\).*/\1/p' "$C/logs/replica-1.log" | tail -1)
T2=$(sed -n 's/.*mark: down at \([0-9.]*\).*/\1/p' "$C/logs/replica-2.log" | tail -1)
$PY - "$D/load.jsonl" "$P" "$T1" "$T2" > "$D/load.sum" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
port = int(sys.argv[2]); term = {"127.0.0.1:%d" % (port + 1): float(sys.argv[3] or 0), "127.0.0.1:%d" % (port + 2): float(sys.argv[4] or 0)}
bad = [r for r in recs if not r["ok"]]
streams = [r for r in recs if r["stream"]]
drained = [r for r in streams if r["ok"] and r["upstream"] in term and r["start"] < term[r["upstream"]] < r["end"]]
print(len(recs), len(streams), len(bad), len(drained))
for r in bad[:5]: print("failed:", json.dumps(r))
EOF
read -r n ns nbad ndrained < "$D/load.sum"
[ "${n:-0}" -ge 20 ] && [ "${nbad:-1}" = 0 ] \
  && ok "rolling restart under load: $n requests ($ns streamed), 0 failed, every stream ended with [DONE]" \
  || { cat "$D/load.sum" "$D/load.err"; fail "rolling restart under load: $n requests, $nbad failed"; }
[ "${ndrained:-0}" -ge 1 ] && ok "$ndrained streams were in flight on their replica when it was marked down and completed" \
  || fail "no stream was in flight on a replica when it was marked down (the drain went untested; marks at '$T1' '$T2')"
[ -z "$(cat "$C/down" 2>/dev/null)" ] && ! grep -q ' down;' "$C/nginx.conf" \
  && ok "both replicas marked up in nginx.conf again" || fail "nginx.conf still marks a replica down"

# --- kill -9 of a replica: retries -------------------------------------------------------
"$CL" status --dir "$C" > /dev/null 2>&1 || fail "status not healthy before kill -9"
# a plain (not streamed) request running on replica 2 when it dies: nginx has sent nothing
# to the client yet, so it sends the request to replica 1 and the client gets its 200
curl -s -m 60 -D "$D/long.h" -o "$D/long.json" -w '%{http_code}' -H "X-Session-ID: $SESS2" \
  "http://127.0.0.1:$P/v1/completions" -d '{"prompt":"ROMEO:","max_tokens":480,"ignore_eos":true}' > "$D/long.code" &
LONG=$!
running=0
for _ in $(seq 1 100); do
  running=$(curl -s -m 5 "http://127.0.0.1:$((P + 2))/metrics" | awk '/^turbine_requests_running/ { print $NF }')
  [ "${running%.*}" = 1 ] && break
  sleep 0.05
done
kill -9 "$(cat "$C/replica-2.pid")"
wait "$LONG"
ups=$(tr -d '\r' < "$D/long.h" | sed -n 's/^X-Turbine-Upstream: //Ip')
if [ "${running%.*}" = 1 ] && [ "$(cat "$D/long.code")" = 200 ] && [ "$ups" = "127.0.0.1:$((P + 2)), 127.0.0.1:$((P + 1))" ] \
   && grep -q '"completion_tokens":480' "$D/long.json"; then
  ok "a plain request running on replica 2 at its kill -9: answered 200 by replica 1 (upstreams '$ups')"
else
  fail "plain request across the kill: running $running, status $(cat "$D/long.code"), upstreams '$ups'"
fi
sleep 0.2
allok=1; ups=""
for s in 1 2 3 4 5 6 7 8; do
  st=$(code /v1/completions -d "$BODY"); [ "$st" = 200 ] || allok=0
  st=$(code /v1/completions -H "X-Session-ID: $SESS2" -d "$BODY"); [ "$st" = 200 ] || allok=0
  st=$(code /v1/completions -d '{"prompt":"ROMEO:","max_tokens":8,"stream":true}'); [ "$st" = 200 ] || allok=0
done
[ "$allok" = 1 ] && ok "replica 2 killed (-9): 24 requests through nginx all 200 (plain, session '$SESS2' of replica 2, streamed)" \
  || fail "a request failed after replica 2 died"
grep -q "127.0.0.1:$((P + 2))" "$C/logs/nginx_error.log" && ok "nginx logged the dead replica and retried on the other" \
  || fail "nginx's error log does not name the dead replica"
if "$CL" status --dir "$C" > "$D/status2.txt" 2>&1; then fail "status exit 0 with a dead replica"; else
  grep -q "replica 2 .*not running" "$D/status2.txt" && ok "status reports replica 2 not running (exit 3)" || fail "status: $(cat "$D/status2.txt")"
fi
"$CL" start-replica --dir "$C" --replica 2 > "$D/rejoin.log" 2>&1 || { cat "$D/rejoin.log"; fail "start-replica 2"; }
sleep 3.1 # --fail-timeout 2 (nginx counts whole seconds: 2 to 3 s): then nginx tries the replica again
back=0
for _ in 1 2 3 4 5 6; do
  [ "$(up /v1/completions -H "X-Session-ID: $SESS2" -d "$BODY")" = "127.0.0.1:$((P + 2))" ] && back=$((back + 1))
done
[ "$back" -ge 5 ] && ok "replica 2 restarted: session '$SESS2' reaches it again ($back of 6)" || fail "replica 2 did not rejoin ($back of 6)"

# --- the edge: API key, body size, rate limit ------------------------------------------------
# (two free ports taken now; a bind that still loses a race to another
# socket is retried on new ones, at most three times)
kstart=1
for _ in 1 2 3; do
  PK=$(free_ports 2)
  [ -n "$PK" ] || break
  if "$CL" start --engine "$D/demo.engine" --replicas 1 --port "$PK" --dir "$D/k" --threads-per-replica 1 \
       --edge-api-key sk-test.123 --max-body 64k --rate-limit 2 --burst 1 > "$D/k.log" 2>&1; then
    kstart=0; break
  fi
  grep -q 'Address already in use' "$D/k.log" || break
done
if [ "$kstart" = 0 ]; then
  KEY='Authorization: Bearer sk-test.123'
  a=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PK/v1/completions" -d "$BODY")
  b=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PK/v1/completions" -H 'Authorization: Bearer wrong' -d "$BODY")
  c=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PK/v1/completions" -H "$KEY" -d "$BODY")
  h=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PK/health")
  [ "$a$b$c$h" = 401401200200 ] && ok "--edge-api-key: no key 401, wrong key 401, right key 200, /health 200 without a key" \
    || fail "edge key: no key $a, wrong $b, right $c, /health $h"
  head -c 100000 /dev/zero | tr '\0' 'a' > "$D/big.txt"
  big=$(curl -s -o "$D/big.json" -w '%{http_code}' "http://127.0.0.1:$PK/v1/completions" -H "$KEY" --data-binary @"$D/big.txt")
  [ "$big" = 413 ] && grep -q '"code":413' "$D/big.json" && ok "--max-body 64k: a 100 kB body gets 413 from nginx (the error shape)" \
    || fail "100 kB body with --max-body 64k: $big $(head -c 200 "$D/big.json")"
  n200=0 n429=0
  for _ in $(seq 1 10); do
    st=$(curl -s -D "$D/rl.h" -o "$D/rl.json" -w '%{http_code}' "http://127.0.0.1:$PK/v1/completions" -H "$KEY" -d "$BODY")
    case "$st" in 200) n200=$((n200 + 1)) ;; 429) n429=$((n429 + 1)); cp "$D/rl.h" "$D/rl429.h"; cp "$D/rl.json" "$D/rl429.json" ;; esac
  done
  if [ "$n429" -ge 5 ] && [ $((n200 + n429)) = 10 ] && grep -qi '^Retry-After: 1' "$D/rl429.h" \
     && grep -q '"type":"rate_limit_error"' "$D/rl429.json"; then
    ok "--rate-limit 2 --burst 1: 10 requests at once, $n200 passed, $n429 got 429 (Retry-After, the error shape)"
  else
    fail "rate limit: $n200 x 200, $n429 x 429 of 10"
  fi
  "$CL" stop --dir "$D/k" > /dev/null 2>&1 || fail "stop of the edge-key cluster"
else
  cat "$D/k.log"; fail "start with --edge-api-key (ports $PK, $((PK + 1)) taken?)"
fi

# --- stop ----------------------------------------------------------------------------------
PIDS="$(cat "$C/nginx.pid" "$C"/replica-*.pid | tr '\n' ' ') $(ps -o pid= --ppid "$(cat "$C/nginx.pid")" | tr '\n' ' ')"
t0=$(date +%s.%N)
"$CL" stop --dir "$C" > "$D/stop.log" 2>&1 && ok "cluster.sh stop exit 0 in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s" \
  || { cat "$D/stop.log"; fail "cluster.sh stop"; }
left=""
# (a zombie, killed and not reaped by its parent yet, has stopped: /proc says Z)
for p in $PIDS $PIDS0 $WORKERS0; do
  kill -0 "$p" 2>/dev/null && [ "$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null)" != Z ] && left+=" $p"
done
[ -z "$left" ] && ok "every pid gone (nginx master and workers, replicas, old and new)" || fail "still running:$left"
open=""
for p in "$P" $((P + 1)) $((P + 2)); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && open+=" $p"; done
[ -z "$open" ] && ok "ports $P..$((P + 2)) closed" || fail "ports still open:$open"
tb_test_finish test_cluster

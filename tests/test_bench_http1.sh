#!/usr/bin/env bash
# The built-in HTTP/1.1 client of `turbine bench` against libcurl's, on canned
# raw responses (tests/bench/raw_server.py, loopback): Content-Length,
# chunked (extensions, trailers, split size lines), end-of-connection bodies,
# HTTP/1.0, 100 Continue, idle connections the server closes, and every
# failure kind (nothing, partial body, bad chunk, not HTTP, oversized
# headers, timeout, 404). Each case must give the expected counts, and both
# clients the same counts. Then an SSE stream chunked at awkward places:
# same tokens and inter-token gaps from both clients. Bounded in time.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/bench_http1"
rm -rf "$D"
mkdir -p "$D"
PY=/usr/bin/python3
rm -f "$D/port"
"$PY" "$TURBINE_SRC/tests/bench/raw_server.py" --port-file "$D/port" --lifetime 200 --log "$D/sse.log" &
spid=$!
trap 'kill $spid 2>/dev/null' EXIT
for _ in $(seq 100); do [ -s "$D/port" ] && break; sleep 0.1; done
[ -s "$D/port" ] || { echo "FAIL: raw server did not start"; exit 1; }
URL="http://127.0.0.1:$(cat "$D/port")"
fails=0

# summary JSON: ok count, errors by kind, HTTP status counts
summary() {
  "$PY" -c "import json,sys; p=json.load(open(sys.argv[1]))['points'][0]; \
print(json.dumps({'ok': p['requests_ok'], 'errors': {k: v for k, v in p['errors'].items() if v}, \
'status': p['http_status']}, sort_keys=True))" "$1" 2>/dev/null || echo "no report"
}

# case PATH N EXPECTED_JSON
check_case() {
  local path=$1 n=$2 want=$3 got=() c
  for c in builtin curl; do
    timeout 60 "$TURBINE_BIN" bench "$URL$path" --endpoint get -c 2 -n "$n" --timeout 1 --http-client $c \
      --no-metrics --no-progress --no-gpu --json "$D/$c.json" >"$D/$c.out" 2>&1
    got+=("$(summary "$D/$c.json")")
  done
  local w
  w=$("$PY" -c "import json,sys; print(json.dumps(json.loads(sys.argv[1]), sort_keys=True))" "$want")
  if [ "${got[0]}" = "$w" ] && [ "${got[1]}" = "$w" ]; then echo "ok: $path: $w"
  else echo "FAIL: $path: want $w, builtin ${got[0]}, curl ${got[1]}"; fails=$((fails+1)); fi
}

check_case /cl 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /chunked 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /close 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /http10 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /continue 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /idleclose 6 '{"ok": 6, "errors": {}, "status": {"200": 6}}'
check_case /status404 6 '{"ok": 0, "errors": {"http": 6}, "status": {"404": 6}}'
check_case /nothing 4 '{"ok": 0, "errors": {"connect": 4}, "status": {}}'
check_case /partial 4 '{"ok": 0, "errors": {"stream": 4}, "status": {"200": 4}}'
check_case /badchunk 4 '{"ok": 0, "errors": {"connect": 4}, "status": {"200": 4}}'
check_case /weird 4 '{"ok": 0, "errors": {"other": 4}, "status": {}}'
check_case /bigheader 2 '{"ok": 0, "errors": {"other": 2}, "status": {"200": 2}}'
check_case /slow 2 '{"ok": 0, "errors": {"timeout": 2}, "status": {}}'

# SSE over awkward chunking: 6 tokens 20 ms apart, usage in the stream. Each
# client's mean inter-token gap must match the gaps the server logged it sent
# (raw_server.py --log) within 0.5 ms + 2 x the server's mean oversleep
# (its own scheduling delay in the same run) / 5 gaps per request.
for c in builtin curl; do
  : >"$D/sse.log"
  timeout 60 "$TURBINE_BIN" bench "$URL" -c 2 -n 8 --input-len 4 --output-len 6 --http-client $c \
    --no-metrics --no-progress --no-gpu --json "$D/sse-$c.json" >"$D/sse-$c.out" 2>&1
  cp "$D/sse.log" "$D/sse-$c.log"
done
"$PY" - "$D/sse-builtin.json" "$D/sse-curl.json" <<'EOF' && echo "ok: SSE stream, same figures from both clients" || { echo "FAIL: SSE stream"; cat "$D/sse-builtin.out"; fails=$((fails+1)); }
import json, sys
for f in sys.argv[1:]:
    p = json.load(open(f))["points"][0]
    recs = [json.loads(l) for l in open(f.replace(".json", ".log")) if l.strip()]
    gaps = [(b - a) * 1000 for r in recs for a, b in zip(r["sends"], r["sends"][1:])]
    sent = sum(gaps) / len(gaps)
    tol = 0.5 + 2 * max(0.0, sent - 20) / 5
    print("%s: ok %d, tokens %d, itl count %d mean %.2f ms (server sent %.2f +- %.2f), ttft mean %.2f ms" % (
        f, p["requests_ok"], p["output_tokens"], p["itl"]["count"], p["itl"]["mean_ms"], sent, tol, p["ttft"]["mean_ms"]))
    assert p["requests_ok"] == 8 and p["requests_failed"] == 0 and p["output_tokens"] == 48, p
    assert p["input_tokens"] == 24 and p["itl"]["count"] == 40 and len(gaps) == 40, p
    assert abs(p["itl"]["mean_ms"] - sent) <= tol and p["ttft"]["mean_ms"] >= 15, p
EOF
grep -q '"http_client": "builtin"' "$D/sse-builtin.json" && grep -q '"http_client": "curl"' "$D/sse-curl.json" \
  && echo "ok: the report names the client" || { echo "FAIL: http_client in the report"; fails=$((fails+1)); }
"$TURBINE_BIN" bench https://127.0.0.1:1 --endpoint get --http-client builtin >/dev/null 2>&1
[ $? = 2 ] && echo "ok: builtin refuses https" || { echo "FAIL: builtin with https"; fails=$((fails+1)); }
echo "test_bench_http1: $fails failures"
[ "$fails" = 0 ]

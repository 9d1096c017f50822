#!/usr/bin/env bash
# `turbine bench --endpoint kserve` against a KServe v2 server on loopback:
# by default tests/bench/fake_v2_server.py (one model, "tiny", whose /metrics
# figures are known exactly), or any server at TURBINE_V2_URL serving
# TURBINE_V2_MODEL (default tiny) with inputs the bench reads from its
# metadata. Checked from the JSON report:
#  - JSON tensors from the metadata, closed loop, --batch-size 3: every
#    request ok; the server's own success count over the point equals the
#    requests sent (a delta: the fake's counters start non-zero); the fake's
#    batch-size mean is exactly 3 and its queue time mean 0.3 ms;
#  - binary tensors with --input, open loop: every request ok and (fake)
#    every one arrived as binary, with binary outputs whose sizes the bench
#    checked;
#  - (fake) --input-data DIR and a perf_analyzer input-data JSON file;
#  - (fake) 429s counted as rejected, a short binary output counted as an
#    error with a failing exit status, /metrics without our series noted.
# Every run is bounded in requests and time.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/bench_v2"
rm -rf "$D"
mkdir -p "$D"
PY=/usr/bin/python3
FAKE="$TURBINE_SRC/tests/bench/fake_v2_server.py"
MODEL="${TURBINE_V2_MODEL:-tiny}"
fails=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
bench() { timeout 120 "$TURBINE_BIN" bench --no-progress --no-gpu "$@"; }

# start NAME ARGS...: a fake server; its URL in $URL_NAME
start() {
  local name=$1; shift
  "$PY" "$FAKE" --port-file "$D/$name.port" --lifetime 200 "$@" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$D/$name.port" ] && break; sleep 0.1; done
  [ -s "$D/$name.port" ] || { echo "FAIL: fake server $name did not start"; exit 1; }
  printf -v "URL_$name" 'http://127.0.0.1:%s' "$(cat "$D/$name.port")"
}

# the fake's own count of what it served
fstats() { "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1] + "/fake/stats").read().decode())' "$1"; }
# jq-less JSON reads: q FILE EXPR (EXPR in Python over r = the report)
q() { "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

FAKE_RUN=1
if [ -n "${TURBINE_V2_URL:-}" ]; then
  URL="${TURBINE_V2_URL%/}"
  FAKE_RUN=0
  echo "against $URL, model $MODEL"
else
  start main
  URL=$URL_main
fi

# ---- JSON tensors from the metadata, closed loop, batch 3
N=24
if bench "$URL" --endpoint kserve --model "$MODEL" --batch-size 3 -c 3 -n $N --seed 7 \
     --json "$D/json.json" --html "$D/json.html" >"$D/json.out" 2>&1; then ok "json run exits 0"; else bad "json run failed: $(tail -5 "$D/json.out")"; fi
[ "$(q "$D/json.json" 'r["points"][0]["requests_ok"]')" = "$N" ] && ok "json: $N requests ok" || bad "json: requests_ok $(q "$D/json.json" 'r["points"][0]["requests_ok"]')"
found=$(q "$D/json.json" 'r["points"][0]["server"]["found"]')
if [ "$found" = True ]; then
  s=$(q "$D/json.json" 'int(r["points"][0]["server"]["request_success"])')
  [ "$s" = "$N" ] && ok "json: server counted $N successes over the point" || bad "json: server success delta $s, want $N"
  bm=$(q "$D/json.json" 'r["points"][0]["server"]["batch_size"]["mean"]')
  if [ $FAKE_RUN = 1 ]; then
    [ "$bm" = "3.0" ] && ok "json: server batch-size mean 3" || bad "json: server batch-size mean $bm, want 3"
    qm=$(q "$D/json.json" 'round(r["points"][0]["server"]["queue_ms"]["mean"], 6)')
    [ "$qm" = "0.3" ] && ok "json: server queue mean 0.3 ms" || bad "json: queue mean $qm ms, want 0.3"
    q50=$(q "$D/json.json" 'round(r["points"][0]["server"]["queue_ms"]["p50"], 6)')
    [ "$q50" = "0.3" ] && ok "json: server queue p50 0.3 ms (bucket interpolation)" || bad "json: queue p50 $q50"
    grep -q "<h2>Server" "$D/json.html" && grep -q "<td>3.00</td>" "$D/json.html" && ok "json: the HTML report's server table has the mean" || bad "json: no server table in the HTML report"
    grep -q "batch size mean 3.00" "$D/json.out" && ok "json: text report shows the batch-size mean" || bad "json: no batch-size mean in the text report"
    grep -q "batch sizes: <=4: $N" "$D/json.out" && ok "json: text report shows the batch-size distribution" || bad "json: no distribution: $(grep 'batch sizes' "$D/json.out")"
    st=$(fstats "$URL")
    [ "$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["json"])' "$st")" = "$N" ] && ok "json: the fake served $N JSON requests" || bad "json: fake stats $st"
  else
    "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 3 else 1)' "$bm" && ok "json: batch-size mean $bm >= 3" || bad "json: batch-size mean $bm"
  fi
else
  [ $FAKE_RUN = 1 ] && bad "json: the fake's metrics were not found" || echo "note: $URL/metrics has no turbine_inference_* series for $MODEL"
fi

# ---- binary tensors with --input given, open loop
if [ $FAKE_RUN = 1 ]; then INPUTS=(--input x:FP32:2x4 --input ids:INT32:2x2); else INPUTS=(); fi
before=$([ $FAKE_RUN = 1 ] && fstats "$URL" || echo '{}')
if bench "$URL" --endpoint kserve --model "$MODEL" "${INPUTS[@]}" --tensor-format binary --request-rate 200 -n 20 \
     --json "$D/bin.json" >"$D/bin.out" 2>&1; then ok "binary run exits 0"; else bad "binary run failed: $(tail -5 "$D/bin.out")"; fi
[ "$(q "$D/bin.json" 'r["points"][0]["requests_ok"]')" = "20" ] && ok "binary: 20 requests ok" || bad "binary: $(q "$D/bin.json" 'r["points"][0]["requests_ok"], r["points"][0].get("first_error")')"
[ "$(q "$D/bin.json" 'r["config"]["load"]')" = open ] && ok "binary: open loop" || bad "binary: not an open-loop run"
if [ $FAKE_RUN = 1 ]; then
  after=$(fstats "$URL")
  nb=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[2])["binary"] - json.loads(sys.argv[1]).get("binary", 0))' "$before" "$after")
  [ "$nb" = 20 ] && ok "binary: the fake served 20 binary requests" || bad "binary: the fake saw $nb binary requests"
  bm=$(q "$D/bin.json" 'r["points"][0]["server"]["batch_size"]["mean"]')
  [ "$bm" = "2.0" ] && ok "binary: batch-size mean 2 (dim 0 of --input)" || bad "binary: batch-size mean $bm"
fi

if [ $FAKE_RUN = 1 ]; then
  # ---- --input-data: the file's values, one batch item repeated
  mkdir -p "$D/in"
  "$PY" -c 'import struct; open("'"$D"'/in/x.bin","wb").write(struct.pack("<4f",1,2,3,4)); open("'"$D"'/in/ids.bin","wb").write(struct.pack("<2i",5,6))'
  bench "$URL" --endpoint kserve --model tiny --input-data "$D/in" --batch-size 2 -n 4 --json "$D/file.json" >"$D/file.out" 2>&1 \
    && [ "$(q "$D/file.json" 'r["points"][0]["requests_ok"]')" = 4 ] && ok "--input-data: 4 requests ok" || bad "--input-data: $(tail -3 "$D/file.out")"
  # perf_analyzer's input-data JSON: two steps, ids given as {"content": ...}
  echo '{"data": [{"x": [1, 2, 3, 4], "ids": {"content": [1, 2], "shape": [2]}}, {"x": [0, 0, 0, 0], "ids": [7, 8]}]}' >"$D/steps.json"
  bench "$URL" --endpoint kserve --model tiny --input-data "$D/steps.json" --tensor-format binary -n 6 --json "$D/steps.out.json" >"$D/steps.out" 2>&1 \
    && [ "$(q "$D/steps.out.json" 'r["points"][0]["requests_ok"]')" = 6 ] && ok "--input-data FILE.json: 6 requests ok" || bad "--input-data FILE.json: $(tail -3 "$D/steps.out")"
  # the body the bench sends: checked through the fake's validation (400 on a wrong size)
  echo -n 'xx' >"$D/in/ids.bin"
  if bench "$URL" --endpoint kserve --model tiny --input-data "$D/in" -n 2 >"$D/file2.out" 2>&1; then
    bad "--input-data: a 2-byte ids.bin was accepted"
  else grep -q "ids.bin: 2 bytes" "$D/file2.out" && ok "--input-data: a wrong-size file is refused" || bad "--input-data: $(tail -2 "$D/file2.out")"; fi

  # ---- 429s counted as rejected
  start rej --reject-every 5
  bench "$URL_rej" --endpoint kserve --model tiny -c 1 -n 20 --json "$D/rej.json" >"$D/rej.out" 2>&1
  r=$(q "$D/rej.json" 'r["points"][0]["rejected"], r["points"][0]["requests_ok"], r["points"][0]["http_status"].get("429")')
  [ "$r" = "(4, 16, 4)" ] && ok "429: 4 rejected, 16 ok" || bad "429: (rejected, ok, 429s) = $r"
  grep -q "rejected (HTTP 429" "$D/rej.out" && ok "429: the text report says rejected" || bad "429: no rejected line"

  # ---- a binary output one byte short: every response fails the check
  start badout --bad-output
  if bench "$URL_badout" --endpoint kserve --model tiny --tensor-format binary -n 5 --json "$D/bad.json" >"$D/bad.out" 2>&1; then
    bad "bad output: exit 0"
  else
    r=$(q "$D/bad.json" 'r["points"][0]["errors"]["stream"], r["points"][0]["requests_ok"]')
    [ "$r" = "(5, 0)" ] && ok "bad output: 5 responses refused, exit 1" || bad "bad output: (stream errors, ok) = $r"
    grep -q "binary_data_size\|binary outputs" "$D/bad.out" && ok "bad output: the reason is reported" || bad "bad output: $(grep first "$D/bad.out")"
  fi

  # ---- no metrics: noted, the run still counts
  start nomet --no-metrics
  bench "$URL_nomet" --endpoint kserve --model tiny -n 5 --json "$D/nomet.json" >"$D/nomet.out" 2>&1 \
    && [ "$(q "$D/nomet.json" 'r["points"][0]["server"]["found"], r["points"][0]["requests_ok"]')" = "(False, 5)" ] \
    && grep -q "no turbine_inference_\* series" "$D/nomet.out" && ok "no metrics: noted, 5 ok" || bad "no metrics: $(tail -3 "$D/nomet.out")"

  # ---- usage errors
  bench "$URL" --endpoint kserve --model tiny --input x:FP32 -n 1 >"$D/u1.out" 2>&1; [ $? = 2 ] && ok "bad --input: usage error" || bad "bad --input accepted"
  bench "$URL" --endpoint kserve --model tiny --shape nope:1x4 -n 1 >"$D/u2.out" 2>&1; [ $? = 1 ] && grep -q "no input of that name" "$D/u2.out" && ok "--shape of an unknown input refused" || bad "--shape nope: $(tail -2 "$D/u2.out")"
  bench "$URL" --endpoint chat --model tiny --tensor-format binary -n 1 >"$D/u3.out" 2>&1; [ $? = 2 ] && ok "--tensor-format needs kserve" || bad "--tensor-format with chat accepted"
fi

[ $fails = 0 ] && echo "test_bench_v2: all ok" || echo "test_bench_v2: $fails failures"
exit $((fails > 0))

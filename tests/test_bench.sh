#!/usr/bin/env bash
# `turbine bench` against a scripted fake server on loopback (tests/bench/
# fake_server.py): every metric (TTFT, ITL, TPOT, E2E) against what the server
# logged it sent, within a tolerance derived from the scheduling jitter the
# server measured in the same run (so it holds on a busy machine); completions
# and chat, streaming or not; tokens whose text is U+0000; open-loop timing
# from the intended start (a 1 s stall must reach p99); error counting by
# kind, with the server's message in every report and a failing exit status;
# ShareGPT answer lengths; a sweep producing valid JSON, CSV and an HTML page
# that headless Chromium renders without console errors; GET and KServe
# endpoints. Every run is bounded in requests and time.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/bench"
rm -rf "$D"
mkdir -p "$D"
PY=/usr/bin/python3
FAKE="$TURBINE_SRC/tests/bench/fake_server.py"
fails=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT

# start NAME ARGS...: a fake server whose port ends up in $D/NAME.port
start() {
  local name=$1; shift
  rm -f "$D/$name.port"
  "$PY" "$FAKE" --port-file "$D/$name.port" --lifetime 300 "$@" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$D/$name.port" ] && return 0; sleep 0.1; done
  echo "FAIL: fake server $name did not start"; exit 1
}
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
bench() { timeout 120 "$TURBINE_BIN" bench --no-progress "$@"; }

start main --ttft 100 --itl 20
P=$(cat "$D/main.port")
URL="http://127.0.0.1:$P"

# ---- timing: what the bench measured against what the server logged it sent.
# 40 prompts, TTFT 200..390 ms, ITL 40..70 ms, 8 tokens. The server logs each
# request's arrival, the time just before each chunk's write and when it was
# due (tests/bench/fake_server.py --log). Bounds, in ms:
#  - TTFT and E2E can only be longer at the client (it sends before the server
#    reads, and reads after the server writes): bench >= server - 0.02;
#  - the server's lateness (send - due) over the same requests measures how
#    much the machine delayed a woken process during this run. A client
#    delayed on reading a chunk is delayed like the server on writing one, so:
#    TTFT and E2E means at most TOL_MEAN = 1 + 3 x the mean lateness above the
#    server's; ITL and TPOT means within TOL_GAP = 0.25 + 2 x the mean
#    lateness / (tokens - 1) (a request's chunk delays cancel over its gaps
#    but for the first and the last); min, max and percentiles within TOL_Q =
#    1 + 2 x the p99 lateness (percentiles also 0.5% for the histogram).
#    These hold on a busy machine, while a client that mis-measures by more
#    fails (ITL off by 5 ms fails even with both cores kept busy).
"$PY" - "$D/scripted.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(40):
        f.write(json.dumps({"prompt": "hello ttft=%d itl=%d" % (200 + 10 * (i % 20), 40 + 10 * (i % 4)),
                            "output_len": 8}) + "\n")
EOF
check_metrics() { # JSON LOG N_REQUESTS STREAM WARMUP
  "$PY" - "$@" <<'EOF'
import json, math, sys
path, log, n, stream, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
p = json.load(open(path))["points"][0]
recs = sorted((json.loads(l) for l in open(log) if l.strip()), key=lambda r: r["arrival"])
errs = []
if len(recs) != warm + n:
    print("server logged %d requests, want %d" % (len(recs), warm + n))
    sys.exit(1)
recs = recs[warm:]  # the warm-up ends before the measured phase starts
MS = 1000.0
def mean(v):
    return sum(v) / len(v)
def q(v, x):
    v = sorted(v)
    return v[max(0, math.ceil(x * len(v)) - 1)]
late = [max(0.0, (s - d) * MS) for r in recs for s, d in zip(r["sends"], r["dues"])]
tol_mean = 1.0 + 3 * mean(late)
tol_q = 1.0 + 2 * q(late, 0.99)
tol_gap = 0.25 + 2 * mean(late) / max(1.0, mean([len(r["sends"]) for r in recs]) - 1)
print("server lateness: mean %.3f ms, p99 %.3f ms, max %.3f ms -> TOL_MEAN %.2f, TOL_GAP %.2f, TOL_Q %.2f ms"
      % (mean(late), q(late, 0.99), max(late), tol_mean, tol_gap, tol_q))
if p["requests_ok"] != n or p["requests_failed"] != 0:
    errs.append("ok %d failed %d" % (p["requests_ok"], p["requests_failed"]))
if p["output_tokens"] != 8 * n:
    errs.append("output tokens %d" % p["output_tokens"])
sets = [("e2e", [(r["end"] - r["arrival"]) * MS for r in recs], True)]
if stream:
    gaps = [(b - a) * MS for r in recs for a, b in zip(r["sends"], r["sends"][1:])]
    sets += [("ttft", [(r["sends"][0] - r["arrival"]) * MS for r in recs], True), ("itl", gaps, False),
             ("tpot", [(r["end"] - r["sends"][0]) * MS / (len(r["sends"]) - 1) for r in recs], False)]
    if p["itl"]["count"] != len(gaps):
        errs.append("itl count %d, server sent %d gaps" % (p["itl"]["count"], len(gaps)))
def check(name, got, want, tol, client_later, bucket=0.0):
    lo = (-0.02 if client_later else -tol) - bucket
    tol += bucket
    ok = lo <= got - want <= tol
    print("%-10s bench %9.3f  server %9.3f  diff %+7.3f  allowed [%+.2f, %+.2f]%s"
          % (name, got, want, got - want, lo, tol, "" if ok else "  <-- FAIL"))
    if not ok:
        errs.append(name)
for name, v, client_later in sets:
    m = p[name]
    check(name + " mean", m["mean_ms"], mean(v), tol_mean if client_later else tol_gap, client_later)
    check(name + " min", m["min_ms"], min(v), tol_q, client_later)
    # ITL: mean and min only. A client delayed on one chunk stretches one gap
    # and shrinks the next, and the scripted gaps come in clusters (40, 50,
    # 60, 70 ms), so a gap's max or percentile can jump at a cluster edge.
    if name == "itl":
        continue
    check(name + " max", m["max_ms"], max(v), tol_q, client_later)
    for k, x in (("p50", .5), ("p90", .9), ("p99", .99)):  # histogram buckets: within 0.4%
        check(name + " " + k, m[k + "_ms"], q(v, x), tol_q, client_later, 0.005 * q(v, x))
print("\n".join(errs) if errs else "metrics match what the server sent")
sys.exit(1 if errs else 0)
EOF
}
# Each check gets three attempts (a fresh server log each) and must pass once.
start timed --ttft 100 --itl 20 --log "$D/timed.log"
TURL="http://127.0.0.1:$(cat "$D/timed.port")"
metrics_run() { # NAME N STREAM WARMUP ARGS...
  local name=$1 n=$2 stream=$3 warm=$4; shift 4
  for attempt in 1 2 3; do
    : >"$D/timed.log"
    if bench "$TURL" "$@" --warmup "$warm" --prompts "$D/scripted.jsonl" --json "$D/$name.json" >"$D/$name.out" 2>&1 \
       && check_metrics "$D/$name.json" "$D/timed.log" "$n" "$stream" "$warm" >"$D/$name.check" 2>&1; then
      ok "$name (attempt $attempt)"; grep "lateness" "$D/$name.check"; return
    fi
    echo "attempt $attempt of $name:"; cat "$D/$name.check"
  done
  bad "$name"; cat "$D/$name.out"
}
metrics_run completions-stream 40 1 4 -c 4 -n 40
metrics_run chat-stream 20 1 2 --endpoint chat -c 2 -n 20
metrics_run completions-nostream 20 0 2 -c 4 -n 20 --no-stream
grep -q '"model": "fake-model"' "$D/completions-stream.json" && ok "model from /v1/models" || bad "model from /v1/models"

# ---- a token whose text is U+0000 ("\u0000", valid JSON) is a token, not an error
"$PY" -c 'import json; print(json.dumps({"prompt": "ttft=5 itl=2 nul=1", "output_len": 5}))' >"$D/nul.jsonl"
for mode in stream nostream; do
  extra=(); [ $mode = nostream ] && extra=(--no-stream)
  bench "$URL" -c 2 -n 6 --prompts "$D/nul.jsonl" "${extra[@]}" --json "$D/nul-$mode.json" >"$D/nul-$mode.out" 2>&1
  "$PY" - "$D/nul-$mode.json" $mode <<'EOF' && ok "U+0000 tokens accepted ($mode)" || { bad "U+0000 tokens ($mode)"; cat "$D/nul-$mode.out"; }
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
print("nul %s: ok %d, failed %d, output tokens %d, itl count %d, first error %s" % (
    sys.argv[2], p["requests_ok"], p["requests_failed"], p["output_tokens"], p["itl"]["count"], p.get("first_error")))
assert p["requests_ok"] == 6 and p["requests_failed"] == 0 and p["output_tokens"] == 30
if sys.argv[2] == "stream":
    assert p["itl"]["count"] == 6 * 4  # each "\u0000" chunk was counted as a token
EOF
done

# ---- open loop: a 1 s stall must show in p99 (latency from the intended start)
start stall --ttft 5 --itl 1 --stall-at 1.0 --stall-ms 1000
PS=$(cat "$D/stall.port")
bench "http://127.0.0.1:$PS" --rate 40 --arrivals constant --duration 4 --input-len 8 --output-len 4 \
  --json "$D/stall.json" >"$D/stall.out" 2>&1
"$PY" - "$D/stall.json" <<'EOF' && ok "open loop shows a 1 s stall in p99" || { bad "open-loop stall"; cat "$D/stall.out"; }
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
e = p["e2e"]
print("stall: ok %d, e2e p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (p["requests_ok"], e["p50_ms"], e["p99_ms"], e["max_ms"]))
sys.exit(0 if p["requests_ok"] >= 140 and e["p99_ms"] >= 900 and e["p50_ms"] < 200 and e["max_ms"] < 1300 else 1)
EOF

# ---- errors by kind: 100 prompts, 10 each of four failures
"$PY" - "$D/errors.jsonl" <<'EOF'
import json, sys
kinds = {3: "http500", 5: "malformed", 7: "close", 9: "hang"}
with open(sys.argv[1], "w") as f:
    for i in range(100):
        k = kinds.get(i % 10)
        f.write(json.dumps({"prompt": "ttft=5 itl=1" + (" fail=" + k if k else ""), "output_len": 4}) + "\n")
EOF
bench "$URL" -c 4 -n 100 --timeout 1s --prompts "$D/errors.jsonl" --json "$D/err.json" >"$D/err.out" 2>&1
"$PY" - "$D/err.json" <<'EOF' && ok "errors counted by kind" || { bad "error counting"; cat "$D/err.out"; }
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
e = p["errors"]
print("errors:", p["requests_ok"], e, p["http_status"])
want = {"connect": 10, "timeout": 10, "http": 10, "stream": 10, "other": 0}
sys.exit(0 if p["requests_ok"] == 60 and e == want and p["http_status"].get("500") == 10 else 1)
EOF

# the same run exits 0 under the default --max-error-rate 0.5 (40% failed)
# and 1 under --max-error-rate 0.3
bench "$URL" -c 4 -n 100 --timeout 1s --prompts "$D/errors.jsonl" --max-error-rate 0.3 >"$D/err03.out" 2>&1
rc=$?
bench "$URL" -c 4 -n 30 --timeout 1s --prompts "$D/errors.jsonl" --max-error-rate 0.5 --json "$D/err05.json" >"$D/err05.out" 2>&1
rc5=$?
[ "$rc" = 1 ] && grep -q "above --max-error-rate" "$D/err03.out" && [ "$rc5" = 0 ] \
  && ok "--max-error-rate: 40% failed exits 1 above 0.3, 0 under 0.5" \
  || { bad "--max-error-rate (exit $rc and $rc5)"; cat "$D/err03.out"; }

# ---- every request rejected (HTTP 400): the server's message in the terminal
# summary, JSON, CSV and HTML; "–" for the latencies nothing measured; exit 1
"$PY" -c 'import json; print(json.dumps({"prompt": "fail=http400", "output_len": 7}))' >"$D/e400.jsonl"
bench "$URL" -c 2 -n 6 --prompts "$D/e400.jsonl" --json "$D/e400.json" --csv "$D/e400.csv" --html "$D/e400.html" \
  >"$D/e400.out" 2>"$D/e400.err"
rc=$?
"$PY" - "$D/e400" "$rc" <<'EOF' && ok "all 400s: server message in every report, no 0.00 latencies, exit 1" || { bad "all 400s"; cat "$D/e400.out" "$D/e400.err"; }
import csv, html, json, re, sys
base, rc = sys.argv[1], int(sys.argv[2])
# what the server said, as the fake server words it (tests/bench/fake_server.py)
msg = "scripted 400: the fake server rejects this prompt \u2013 reason #7"
out = open(base + ".out", encoding="utf-8").read()
err = open(base + ".err", encoding="utf-8").read()
p = json.load(open(base + ".json"))["points"][0]
row = list(csv.DictReader(open(base + ".csv", encoding="utf-8")))[0]
page = open(base + ".html", encoding="utf-8").read()
assert rc == 1, "exit %d" % rc
assert p["requests_ok"] == 0 and p["errors"]["http"] == 6, p["errors"]
assert msg in out, "terminal summary: " + out
assert "HTTP 400: " + msg == p["first_error_by_kind"]["http"], p["first_error_by_kind"]
assert row["first_error_http"] == "HTTP 400: " + msg, row
assert msg in html.unescape(page), "HTML"
assert msg in err and "6 of 6 requests failed" in err, err
assert p["e2e"]["mean_ms"] is None and p["ttft"]["p99_ms"] is None, p["e2e"]
assert row["e2e_mean_ms"] == "" and row["ttft_p50_ms"] == "", row
summary = re.search(r"<h2>Summary</h2>(.*?)</table>", page, re.S).group(1)
cells = re.findall(r"<td>([^<]*)</td>", summary)
assert "0.00" not in cells[7:] and cells.count("\u2013") == 12, cells
EOF

# ---- a refused connection fails the run (exit 1), its error in the report
bench "http://127.0.0.1:1" --model m -n 3 --json "$D/refused.json" >"$D/refused.out" 2>&1
rc=$?
grep -q '"connect": 3' "$D/refused.json" && [ "$rc" = 1 ] && ok "refused connections counted, exit 1" \
  || { bad "refused (exit $rc)"; cat "$D/refused.out"; }

# ---- ShareGPT: each answer's length (chars/4) is max_tokens unless --output-len
"$PY" - "$D/sharegpt.json" <<'EOF'
import json, sys
conv = [{"conversations": [{"from": "human", "value": "ttft=5 itl=1 question %d" % i},
                           {"from": "gpt", "value": "x" * (4 * (3 + 2 * i))}]} for i in range(5)]
json.dump(conv, open(sys.argv[1], "w"))
EOF
bench "$URL" -c 1 -n 5 --sharegpt "$D/sharegpt.json" --json "$D/sg.json" >"$D/sg.out" 2>&1
bench "$URL" -c 1 -n 5 --sharegpt "$D/sharegpt.json" --output-len 2 --json "$D/sg2.json" >"$D/sg2.out" 2>&1
"$PY" - "$D/sg.json" "$D/sg2.json" <<'EOF' && ok "--sharegpt: answer lengths as max_tokens" || { bad "--sharegpt answer lengths"; cat "$D/sg.out"; }
import json, sys
a, b = (json.load(open(f))["points"][0] for f in sys.argv[1:])
print("sharegpt: %d output tokens (answers: %d), with --output-len 2: %d" % (a["output_tokens"], sum(3 + 2 * i for i in range(5)), b["output_tokens"]))
assert a["requests_ok"] == 5 and a["output_tokens"] == sum(3 + 2 * i for i in range(5))
assert b["requests_ok"] == 5 and b["output_tokens"] == 10
EOF

# ---- a sweep with every report
bench "$URL" -c 1,2,4 -n 12 --input-len 32 --input-len-stddev 4 --output-len 6 --slo ttft=150ms,e2e=1s \
  --sample-interval 0.2 --json "$D/sweep.json" --csv "$D/sweep.csv" --html "$D/sweep.html" >"$D/sweep.out" 2>&1 \
  || { bad "sweep run"; cat "$D/sweep.out"; }
"$PY" - "$D/sweep.json" "$D/sweep.csv" <<'EOF' && ok "sweep JSON and CSV" || bad "sweep JSON/CSV"
import csv, json, math, sys
r = json.load(open(sys.argv[1]))
pts = r["points"]
assert [p["label"] for p in pts] == ["c=1", "c=2", "c=4"], pts
assert r["command_line"].startswith("turbine bench ") and r["models"]["data"][0]["id"] == "fake-model"
assert r["config"]["slo"] == {"ttft_ms": 150.0, "e2e_ms": 1000.0}
for p in pts:
    assert p["requests_ok"] == 12 and p["good_requests"] == 12 and p["goodput"] > 0
    assert p["request_throughput"] > 0 and p["output_token_throughput"] > 0
    assert p["total_token_throughput"] > p["output_token_throughput"]
    for m in ("ttft", "tpot", "itl", "e2e"):
        h = p[m]
        assert h["min_ms"] <= h["p50_ms"] <= h["p90_ms"] <= h["p99_ms"] <= h["p99.9_ms"] <= h["max_ms"], (m, h)
    assert any(s["server_running"] is not None for s in p["timeline"]), "no /metrics samples"
assert pts[2]["request_throughput"] > 1.5 * pts[0]["request_throughput"]
rows = list(csv.reader(open(sys.argv[2])))
assert len(rows) == 4 and all(len(x) == len(rows[0]) for x in rows), rows
assert rows[0][0] == "label" and [x[0] for x in rows[1:]] == ["c=1", "c=2", "c=4"]
i = rows[0].index("ttft_p99_ms")
assert all(abs(float(rows[k + 1][i]) - pts[k]["ttft"]["p99_ms"]) < 1e-3 for k in range(3))
print("sweep: %s req/s" % [round(p["request_throughput"], 2) for p in pts])
EOF
grep -q "http" "$D/sweep.html" && ! grep -qiE "(src|href)=\"(https?:)?//" "$D/sweep.html" \
  && ok "HTML is self-contained" || bad "HTML references an external URL"

# headless Chromium: the page renders, its script runs, the console stays clean
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$CHROME" ]; then
  chrome() { timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
      --user-data-dir="$D/chrome" --virtual-time-budget=3000 --dump-dom "file://$1"; }
  console_errors() { grep -E "CONSOLE|Uncaught|Failed to load" "$1" | grep -viE "dbus|gcm|fontconfig" || true; }
  chrome "$D/sweep.html" >"$D/dom.html" 2>"$D/chrome.err"
  n=$(grep -o 'data-rendered="[0-9]*"' "$D/dom.html" | grep -o '[0-9]*')
  errs=$(console_errors "$D/chrome.err")
  if [ "${n:-0}" -ge 5 ] && [ -z "$errs" ]; then ok "Chromium renders $n charts, no console errors"
  else bad "Chromium: rendered='${n:-}' console: $errs"; fi
  # the check itself must catch a script error
  printf '<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>' >"$D/broken.html"
  chrome "$D/broken.html" >/dev/null 2>"$D/broken.err"
  [ -n "$(console_errors "$D/broken.err")" ] && ok "console check catches errors" || bad "console check is blind"
else
  echo "skip: chromium not installed (apt-get install chromium)"
fi

# ---- other endpoints
bench "$URL/health" --endpoint get -c 8 -n 200 --json "$D/get.json" >"$D/get.out" 2>&1 \
  && grep -q '"requests_ok": 200' "$D/get.json" && ok "GET endpoint" || { bad "GET endpoint"; cat "$D/get.out"; }
echo '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}' >"$D/kserve.json"
bench "$URL" --endpoint kserve --body "$D/kserve.json" -c 2 -n 10 --json "$D/ks.json" >"$D/ks.out" 2>&1 \
  && grep -q '"requests_ok": 10' "$D/ks.json" && grep -q '/v2/models/fake-model/infer' "$D/ks.json" \
  && ok "KServe endpoint" || { bad "KServe endpoint"; cat "$D/ks.out"; }
# usage errors
"$TURBINE_BIN" bench "$URL" --rate abc >/dev/null 2>&1; [ $? = 2 ] && ok "bad option exits 2" || bad "bad option"

echo "test_bench: $fails failures"
[ "$fails" = 0 ]

#!/usr/bin/env bash
# bench/compare_precisions.sh end to end on a tiny CNN (bench/compare/tiny_cnn.py,
# 16x16 input, 10 classes): f32, f16 and int8 engines built, served and loaded
# in turn at two closed-loop points of a few requests. Checked: the command
# exits 0; report.json holds the three precisions, each with finite positive
# throughput, ordered percentiles, its engine size and (f16, int8) a top-1
# agreement in [0, 1] over the rows sent; f32 agrees with itself exactly; the
# HTML is self-contained, has a summary row and a curve per precision, and
# (when chromium is installed) renders with its script run and no console error.
# Every sweep point has at least one /metrics sample, and the CPU models'
# turbine_model_gpu_memory_bytes is 0. With the shared stories260K checkpoint:
# --llm builds its three engines, the report carries turbine compare's
# perplexity, KL and top-1 agreement of f16 and int8 against f32, and each
# engine is served over the OpenAI API and loaded at two concurrencies: every
# request answered with its 8 output tokens, finite ordered TTFT / TPOT
# percentiles, an LLM summary row and curve per precision in the HTML.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/compare_precisions"
rm -rf "$D"; mkdir -p "$D"
PY=/usr/bin/python3
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

if ! "$PY" -c 'import onnx, numpy' 2>/dev/null; then echo "skip: $PY has no onnx/numpy"; exit 0; fi
"$PY" "$TURBINE_SRC/bench/compare/tiny_cnn.py" "$D/tiny.onnx" "$D/calib" || { echo "FAIL: tiny_cnn.py"; exit 1; }

M="${TURBINE_SHARED:-$TURBINE_SRC/../shared}/models/stories260K"
llm=()
if [ -f "$M/stories260K.bin" ]; then
  head -c 6000 "${TURBINE_SHARED:-$TURBINE_SRC/../shared}/data/tinyshakespeare.txt" >"$D/text.txt"
  llm=(--llm "$M/stories260K.bin" --llm-tokenizer "$M/tok512.bin" --llm-text "$D/text.txt" --llm-max-tokens 200
       --llm-c "1,2" --llm-n 6 --llm-input-len 16 --llm-output-len 8 --llm-slo-ms 10000)
else
  echo "skip: the LLM leg (no stories260K under TURBINE_SHARED)"
fi
if TURBINE="$TURBINE_BIN" timeout 240 bash "$TURBINE_SRC/bench/compare_precisions.sh" --model "$D/tiny.onnx" \
     --calib-data "$D/calib" --out "$D/out" -c 1,2 -n 12 --accuracy-n 8 --threads 1 --max-batch-size 4 \
     --max-queue-delay-us 500 --slo-ms 1000 "${llm[@]}" >"$D/run.out" 2>&1; then ok "command exits 0"
else bad "command failed: $(tail -5 "$D/run.out")"; fi

if "$PY" - "$D/out/report.json" <<'PYEOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
ps = {p["dtype"]: p for p in r["precisions"]}
assert sorted(ps) == ["f16", "f32", "int8"], sorted(ps)
for dt, p in ps.items():
    assert len(p["points"]) == 2, (dt, p["points"])
    for q in p["points"]:
        assert q["requests_ok"] == 12 and q["requests_failed"] == 0, (dt, q)
        assert math.isfinite(q["qps"]) and q["qps"] > 0, (dt, q)
        assert 0 < q["p50_ms"] <= q["p95_ms"] <= q["p99_ms"], (dt, q)
    assert p["engine_bytes"] > 0, dt
    # SLO 1 s: every point meets it, so QPS at the SLO is the sweep's best
    assert p["qps_at_slo"] == max(q["qps"] for q in p["points"]), (dt, p["qps_at_slo"])
    a = p["accuracy"]
    assert a["rows"] == 8 and 0.0 <= a["top1_agreement"] <= 1.0, (dt, a)
    # /metrics scraped during every point: the model's device memory is 0 on the CPU, no NVML there
    for q in p["points"]:
        assert q["gpu_samples"] >= 1 and q["model_gpu_mem_gib"] == 0.0, (dt, q)
assert ps["f32"]["accuracy"]["top1_agreement"] == 1.0 and ps["f32"]["accuracy"]["max_abs_err"] == 0.0
# int8 is a different engine: its outputs differ from f32's somewhere
assert ps["int8"]["accuracy"]["max_abs_err"] > 0.0, ps["int8"]["accuracy"]
assert ps["f16"]["engine_bytes"] < ps["f32"]["engine_bytes"], (ps["f16"]["engine_bytes"], ps["f32"]["engine_bytes"])
print("qps at SLO:", {d: round(p["qps_at_slo"], 1) for d, p in ps.items()},
      "top-1:", {d: p["accuracy"]["top1_agreement"] for d, p in ps.items()})
PYEOF
then ok "report.json: three precisions with their figures"; else bad "report.json figures"; fi

if [ ${#llm[@]} -gt 0 ]; then
  "$PY" - "$D/out/report.json" <<'PYEOF' && ok "LLM: three engines, f16 and int8 compared with f32" || bad "LLM figures"
import json, sys
e = {x["dtype"]: x for x in json.load(open(sys.argv[1]))["llm"]["engines"]}
assert sorted(e) == ["f16", "f32", "int8"], sorted(e)
assert e["int8"]["engine_bytes"] < e["f16"]["engine_bytes"] < e["f32"]["engine_bytes"], e
for dt in ("f16", "int8"):
    x = e[dt]
    assert x["perplexity"] > 1 and x["perplexity_f32"] > 1, x
    assert 0 <= x["kl_mean"] < 0.1 and 0.5 < x["top1_agreement"] <= 1.0, x
print({dt: (e[dt]["perplexity"], e[dt]["top1_agreement"]) for dt in ("f16", "int8")})
PYEOF
  [ "$(grep -c '<tr data-llm=' "$D/out/report.html")" = 3 ] && ok "HTML has the LLM table" || bad "HTML LLM rows"
  "$PY" - "$D/out/report.json" <<'PYEOF' && ok "LLM served: two points per engine, every request answered" || bad "LLM serving figures"
import json, math, sys
e = {x["dtype"]: x for x in json.load(open(sys.argv[1]))["llm"]["engines"]}
for dt, x in e.items():
    assert len(x["points"]) == 2 and [p["concurrency"] for p in x["points"]] == [1, 2], (dt, x["points"])
    for p in x["points"]:
        assert p["requests_ok"] == 6 and p["requests_failed"] == 0, (dt, p)
        assert p["output_tokens"] == 6 * 8, (dt, p["output_tokens"])
        assert math.isfinite(p["qps"]) and p["qps"] > 0 and p["out_tps"] > 0, (dt, p)
        # TPOT may be 0: a model this small can finish all 8 tokens before the first chunk is sent
        for m in ("ttft", "tpot", "e2e"):
            assert (0 if m == "tpot" else 1e-9) <= p[m + "_p50_ms"] <= p[m + "_p95_ms"] <= p[m + "_p99_ms"], (dt, m, p)
        assert p["ttft_p99_ms"] <= p["e2e_p99_ms"], (dt, p)
        assert p["gpu_samples"] >= 1 and p["model_gpu_mem_gib"] == 0.0, (dt, p)
    # SLO TTFT p99 10 s: every point meets it
    assert x["qps_at_slo"] == max(p["qps"] for p in x["points"]), (dt, x["qps_at_slo"])
    assert x["out_tps_at_slo"] > 0 and x["engine_bytes"] > 0, (dt, x)
print({dt: (round(x["qps_at_slo"], 1), round(x["out_tps_at_slo"], 1)) for dt, x in e.items()})
PYEOF
  [ "$(grep -c '<tr data-llm-served=' "$D/out/report.html")" = 3 ] && ok "HTML has the LLM serving summary" || bad "HTML LLM serving rows"
  [ "$(grep -c '<polyline class="llm-curve"' "$D/out/report.html")" = 3 ] && ok "HTML LLM plot has three curves" || bad "HTML LLM curves"
fi

H="$D/out/report.html"
[ "$(grep -c '<tr data-dtype=' "$H")" = 3 ] && ok "HTML summary has three rows" || bad "HTML summary rows"
[ "$(grep -c '<polyline class="curve"' "$H")" = 3 ] && ok "HTML plot has three curves" || bad "HTML curves"
! grep -qiE "(src|href)=\"(https?:)?//" "$H" && ok "HTML is self-contained" || bad "HTML references an external URL"
"$PY" - "$H" <<'PYEOF' && ok "HTML tags balance (html.parser)" || bad "HTML does not parse"
import sys
from html.parser import HTMLParser
VOID = {"meta", "br", "img", "input", "link", "hr"}
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.stack = []
    def handle_starttag(self, t, a):
        if t not in VOID: self.stack.append(t)
    def handle_startendtag(self, t, a): pass
    def handle_endtag(self, t):
        assert self.stack and self.stack[-1] == t, (t, self.stack[-3:])
        self.stack.pop()
p = P(); p.feed(open(sys.argv[1]).read()); p.close()
assert not p.stack, p.stack
PYEOF

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$CHROME" ]; then
  chrome() { timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
      --user-data-dir="$D/chrome" --virtual-time-budget=3000 --dump-dom "file://$1"; }
  console_errors() { grep -E "CONSOLE|Uncaught|Failed to load" "$1" | grep -viE "dbus|gcm|fontconfig" || true; }
  chrome "$H" >"$D/dom.html" 2>"$D/chrome.err"
  n=$(grep -o 'data-rendered="[0-9]*"' "$D/dom.html" | grep -o '[0-9]*')
  nl=$(grep -o 'data-rendered-llm="[0-9]*"' "$D/dom.html" | grep -o '[0-9]*')
  want_llm=0
  [ ${#llm[@]} -gt 0 ] && want_llm=3
  errs=$(console_errors "$D/chrome.err")
  if [ "${n:-0}" = 3 ] && [ "${nl:-x}" = $want_llm ] && [ -z "$errs" ]; then
    ok "Chromium renders the page (3 curves, $want_llm LLM curves), no console errors"
  else bad "Chromium: rendered='${n:-}' llm='${nl:-}' console: $errs"; fi
else
  echo "skip: chromium not installed (apt-get install chromium)"
fi

[ $fails = 0 ] && echo "all ok" || echo "$fails failed"
[ $fails = 0 ]

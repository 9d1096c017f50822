#!/usr/bin/env bash
# `turbine bench --engine`: in-process timing of a small engine per batch
# size, with build metadata, a JSON report, batches beyond the engine's max
# batch skipped with a message (an error only when none fits), and clear
# errors for a length the engine cannot take.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}"
M="$TURBINE_SHARED/models/stories260K"
D="$TURBINE_TMP/bench_engine"
mkdir -p "$D"
fails=0
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --max-batch 8 -o "$D/s.engine" >/dev/null 2>&1 \
  || { echo "FAIL: build"; exit 1; }
if timeout 300 "$TURBINE_BIN" bench --engine "$D/s.engine" --batch 1,4,8 --input-len 32 --output-len 16 --threads 1 \
     --profile --json "$D/e.json" >"$D/e.out" 2>&1 \
   && /usr/bin/python3 - "$D/e.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert [p["batch"] for p in r["points"]] == [1, 4, 8]
assert r["max_batch"] == 8 and r["file_bytes"] > 0 and r["build"]["built_at"]
for p in r["points"]:
    assert p["prefill_ms"] > 0 and p["decode_tokens_per_s"] > 0 and p["peak_rss_mib"] > 0
    assert p["decode_step_p50_ms"] <= p["decode_step_p99_ms"]
PY
then echo "ok: engine mode"; cat "$D/e.out"; else echo "FAIL: engine mode"; cat "$D/e.out"; fails=$((fails+1)); fi
"$TURBINE_BIN" bench --engine "$D/s.engine" --batch 16 >/dev/null 2>"$D/err1"
[ $? = 1 ] && grep -q "exceeds the engine's max batch 8" "$D/err1" && echo "ok: batch too large" \
  || { echo "FAIL: batch too large: $(cat "$D/err1")"; fails=$((fails+1)); }
# the README's --batch 1,8,32 on an engine with the default max batch (8): the
# batches that fit run, 32 is reported as skipped, and the run succeeds
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/default.engine" >/dev/null 2>&1 \
  || { echo "FAIL: default build"; exit 1; }
if timeout 300 "$TURBINE_BIN" bench --engine "$D/default.engine" --batch 1,8,32 --input-len 16 --output-len 8 \
     --threads 1 --json "$D/skip.json" >"$D/skip.out" 2>"$D/skip.err" \
   && grep -q "batch 32 exceeds the engine's max batch 8, skipped" "$D/skip.err" \
   && /usr/bin/python3 - "$D/skip.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["max_batch"] == 8, r["max_batch"]
assert [p["batch"] for p in r["points"]] == [1, 8], r["points"]
assert r["skipped_batches"] == [32], r["skipped_batches"]
PY
then echo "ok: --batch 1,8,32 runs 1 and 8, skips 32"; else echo "FAIL: --batch 1,8,32 on a max-batch-8 engine"; cat "$D/skip.out" "$D/skip.err"; fails=$((fails+1)); fi
"$TURBINE_BIN" bench --engine "$D/s.engine" --batch 16,32 >/dev/null 2>"$D/err4"
[ $? = 1 ] && grep -q "no batch size fits" "$D/err4" && echo "ok: no batch fits" \
  || { echo "FAIL: no batch fits: $(cat "$D/err4")"; fails=$((fails+1)); }
"$TURBINE_BIN" bench --engine "$D/s.engine" --input-len 500 --output-len 100 >/dev/null 2>"$D/err2"
[ $? = 1 ] && grep -q "max sequence length" "$D/err2" && echo "ok: too long" \
  || { echo "FAIL: too long: $(cat "$D/err2")"; fails=$((fails+1)); }
"$TURBINE_BIN" bench --engine "$D/missing.engine" >/dev/null 2>"$D/err3"
[ $? = 1 ] && echo "ok: missing engine" || { echo "FAIL: missing engine"; fails=$((fails+1)); }
[ "$fails" = 0 ]

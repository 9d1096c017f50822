#!/usr/bin/env bash
# turbine perplexity: (1) on a random-weight checkpoint it equals the negative
# log-likelihood computed from tests/reference.py's float64 logits of the same
# windows; (2) the bundled demo model's f32 engine on the held-out last 10% of
# tinyshakespeare reproduces the test loss its training script measured in
# PyTorch (models/demo/TRAINING.md: 3.8547 nats/token over 49152 tokens), and
# its f16 engine stays within 0.01% of it; (3) bad arguments are refused.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
PY=/usr/bin/python3
D="$TURBINE_TMP/perplexity"
mkdir -p "$D"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# (1) against the float64 reference: 40 ids, windows of 16 -> 2 full windows, 32 scored tokens
CK="$D/ckpt"
"$PY" "$TURBINE_SRC/tests/gen_checkpoints.py" --preset llama-gqa --dtype f32 --out "$CK" >/dev/null || fail "checkpoint"
"$TURBINE_BIN" build "$CK" --tokenizer "$TURBINE_SHARED/models/stories260K/tok512.bin" -o "$D/r.engine" >/dev/null 2>&1 || fail "build"
IDS=$("$PY" -c 'print(",".join(str(3 + (i * 37) % 500) for i in range(40)))')
got=$("$TURBINE_BIN" perplexity "$D/r.engine" --ids "$IDS" --ctx 16 --threads 2 2>/dev/null)
want=$("$PY" - "$TURBINE_SRC/tests" "$CK" "$IDS" <<'PY'
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import reference as R
cfg, w = R.load_model(sys.argv[2])
ids = [int(x) for x in sys.argv[3].split(",")]
nll, n = 0.0, 0
for s in range(0, (len(ids) - 1) // 16 * 16, 16):
    lg = R.forward(cfg, w, ids[s:s + 16]).astype(np.float64)
    for r in range(16):
        row = lg[r]
        m = row.max()
        nll += m + np.log(np.exp(row - m).sum()) - row[ids[s + r + 1]]
        n += 1
print("%.9f %d" % (nll / n, n))
PY
)
read -r wnll wn <<<"$want"
gnll=$(awk '{print $4}' <<<"$got"); gn=$(awk '{print $6}' <<<"$got")
if [ -n "$gnll" ] && [ "$gn" = "$wn" ] && "$PY" -c "import sys; a, b = float('$gnll'), float('$wnll'); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)"; then
  echo "ok: random llama, 2 windows of 16: nll $gnll = reference $wnll over $gn tokens"
else
  fail "random llama: turbine '$got', reference '$want'"
fi

# (2) the demo model on the held-out test split, as its training script measured it
"$PY" -c "import sys; t = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(t[int(len(t) * 0.9):])" \
  "$TURBINE_SHARED/data/tinyshakespeare.txt" "$D/test_split.txt" || fail "test split"
for dt in f32 f16; do
  "$TURBINE_BIN" build "$TURBINE_SRC/models/demo/shakespeare" --dtype $dt -o "$D/demo_$dt.engine" >/dev/null 2>&1 || fail "build demo $dt"
  out=$("$TURBINE_BIN" perplexity "$D/demo_$dt.engine" --text "$D/test_split.txt" --ctx 512 --threads 2 2>/dev/null)
  echo "demo $dt: $out"
  eval "nll_$dt=$(awk '{print $4}' <<<"$out")"
  [ "$(awk '{print $6}' <<<"$out")" = 49152 ] || fail "demo $dt: scored tokens in '$out', want 49152"
done
"$PY" -c "import sys; sys.exit(0 if abs(float('${nll_f32:-nan}') - 3.8547) <= 5e-4 else 1)" \
  && echo "ok: demo f32 test loss ${nll_f32} nats/token (PyTorch in TRAINING.md: 3.8547)" \
  || fail "demo f32 test loss ${nll_f32:-none}, PyTorch measured 3.8547"
"$PY" -c "import sys; sys.exit(0 if abs(float('${nll_f16:-nan}') - float('${nll_f32:-nan}')) <= 1e-4 * 3.85 else 1)" \
  && echo "ok: demo f16 test loss ${nll_f16} (f32 ${nll_f32})" || fail "demo f16 ${nll_f16:-none} vs f32 ${nll_f32:-none}"

# (3) refusals
"$TURBINE_BIN" perplexity "$D/r.engine" --ctx 16 >/dev/null 2>&1; [ $? = 2 ] || fail "no --text/--ids: not a usage error"
"$TURBINE_BIN" perplexity "$D/r.engine" --ids 5 >/dev/null 2>&1; [ $? = 1 ] || fail "one token: not refused"
"$TURBINE_BIN" perplexity "$D/r.engine" --ids 5,6,7 --ctx 100000 >/dev/null 2>&1; [ $? = 1 ] || fail "--ctx past the context: not refused"
"$TURBINE_BIN" perplexity "$D/r.engine" --text "$D/no-such.txt" >/dev/null 2>&1; [ $? = 1 ] || fail "missing text file: not refused"
"$TURBINE_BIN" perplexity "$D/r.engine" --ids 5,99999 >/dev/null 2>&1; [ $? = 1 ] || fail "an id outside the vocabulary: not refused"

[ "$fails" = 0 ] && echo "all perplexity checks passed" || { echo "$fails failures"; exit 1; }

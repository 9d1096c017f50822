#!/usr/bin/env bash
# A tokenizer smaller than the model's vocabulary (as models that pad their
# vocabulary have): the build says so, naming both sizes, and an id past the
# tokenizer prints as U+FFFD instead of nothing. A larger tokenizer is still
# refused, naming both sizes; stories260K and the bundled demo build without
# a warning.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
PY=/usr/bin/python3
M="$TURBINE_SHARED/models/stories260K"
D="$TURBINE_TMP/cli_vocab"
mkdir -p "$D"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# tok512.bin cut to its first 300 tokens, and grown to 600 (copies of the last one)
"$PY" - "$M/tok512.bin" "$D/tok300.bin" "$D/tok600.bin" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
recs, pos = [], 4
while pos < len(d):
    n = struct.unpack_from("<i", d, pos + 4)[0]
    recs.append(d[pos:pos + 8 + n]); pos += 8 + n
assert len(recs) == 512, len(recs)
open(sys.argv[2], "wb").write(d[:4] + b"".join(recs[:300]))
open(sys.argv[3], "wb").write(d[:4] + b"".join(recs + recs[-1:] * 88))
PY

# 1. smaller: builds, warns with both sizes
if "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$D/tok300.bin" -o "$D/small.engine" >"$D/small.out" 2>&1; then
  grep -q "300 tokens but the model's vocabulary is 512" "$D/small.out" \
    && ok "a 300-token tokenizer for a 512-token model builds with a warning naming both sizes" \
    || fail "no warning naming 300 and 512: $(cat "$D/small.out")"
else
  fail "the 300-token tokenizer was refused: $(tail -n 2 "$D/small.out")"
fi

# 2. ids past the tokenizer print U+FFFD (the prompt is echoed piece by piece)
"$TURBINE_BIN" run "$D/small.engine" --prompt-ids 1,400,450 -n 3 --temperature 0 >"$D/ids.txt" 2>"$D/ids.err"
"$PY" - "$D/ids.txt" <<'PY' && ok "ids 400 and 450 print as U+FFFD" || fail "ids past the tokenizer: $(cat "$D/ids.txt" "$D/ids.err")"
import sys
t = open(sys.argv[1], encoding="utf-8").read()
sys.exit(0 if t.startswith("\ufffd\ufffd") else 1)
PY
# ids inside the tokenizer keep their text (-n 1: the prompt only)
"$TURBINE_BIN" run "$D/small.engine" --prompt-ids 1,280 -n 1 --temperature 0 >"$D/in.txt" 2>/dev/null
grep -q $'\xef\xbf\xbd' "$D/in.txt" && fail "id 280 printed U+FFFD: $(cat "$D/in.txt")" || ok "id 280 prints its text"
# generation on such an engine runs
"$TURBINE_BIN" run "$D/small.engine" -p "Once upon a time" -n 120 --temperature 1 --seed 7 >"$D/gen.txt" 2>/dev/null \
  || fail "run on the small-tokenizer engine"

# 3. larger: refused with both sizes
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$D/tok600.bin" -o "$D/big.engine" >"$D/big.out" 2>&1; rc=$?
[ "$rc" = 1 ] && grep -q "600 tokens but the model's vocabulary is 512" "$D/big.out" \
  && ok "a 600-token tokenizer is refused naming both sizes" || fail "600-token tokenizer: exit $rc, $(cat "$D/big.out")"

# 4. the real pairs build without the warning
for pair in "$M/stories260K.bin --tokenizer $M/tok512.bin" "$TURBINE_SRC/models/demo/shakespeare"; do
  # shellcheck disable=SC2086
  if "$TURBINE_BIN" build $pair -o "$D/real.engine" >"$D/real.out" 2>&1; then
    grep -q "tokens but the model's vocabulary" "$D/real.out" && fail "$pair warns: $(cat "$D/real.out")" \
      || ok "$pair builds without a vocabulary warning"
  else
    fail "$pair does not build: $(tail -n 2 "$D/real.out")"
  fi
done

[ "$fails" = 0 ] && echo "PASS" || { echo "$fails failure(s)"; exit 1; }

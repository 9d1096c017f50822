#!/usr/bin/env bash
# turbine compare: (1) an engine against itself gives KL 0 and top-1
# agreement 1, and its perplexity is what `turbine perplexity` prints; (2)
# stories260K f32 against f16: a small KL, agreement near 1, and both
# perplexities equal to `turbine perplexity`'s for each engine over the same
# windows; (3) engines with different vocabularies and bad arguments are
# refused; (4) --kv-dtype int8 runs B with an int8 KV cache: the engine
# against itself then differs (KL > 0) and B's perplexity is `turbine
# perplexity --kv-dtype int8`'s.
. "$(dirname "$0")/tb_test.sh"
tb_test_dir compare
for dt in f32 f16; do
  "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --dtype $dt -o "$D/$dt.engine" >/dev/null 2>&1 \
    || fail "build $dt"
done
head -c 12000 "$TURBINE_SHARED/data/tinyshakespeare.txt" > "$D/text.txt"
field() { awk -v k="$2" '$1 == k {print $0}' "$1"; }

# (1) A against A
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f32.engine" --text "$D/text.txt" --ctx 256 --threads 2 >"$D/aa.txt" 2>"$D/aa.err" \
  || fail "compare A A: $(cat "$D/aa.err")"
grep -q '^kl mean 0 p99 0 max 0$' "$D/aa.txt" && ok "A vs A: KL 0" || fail "A vs A KL: $(cat "$D/aa.txt")"
grep -Eq '^top1 agreement 1.000000 \(([0-9]+) of \1\)$' "$D/aa.txt" && ok "A vs A: agreement 1" \
  || fail "A vs A agreement: $(cat "$D/aa.txt")"

# (2) f32 against f16, perplexities as `turbine perplexity` prints them
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f16.engine" --text "$D/text.txt" --ctx 256 --threads 2 >"$D/ab.txt" 2>"$D/ab.err" \
  || fail "compare f32 f16: $(cat "$D/ab.err")"
cat "$D/ab.txt"
for x in A:f32 B:f16; do
  k=${x%%:*}; dt=${x##*:}
  want=$("$TURBINE_BIN" perplexity "$D/$dt.engine" --text "$D/text.txt" --ctx 256 --threads 2 2>/dev/null | awk '{print $2, $4, $6, $8}')
  got=$(awk -v k=$k '$1 == k && $2 == "perplexity" {print $3, $5}' "$D/ab.txt")
  read -r wp wn wt ww <<<"$want"
  [ -n "$wp" ] && [ "$got" = "$wp $wn" ] && ok "$k ($dt) perplexity $wp = turbine perplexity's" \
    || fail "$k perplexity: compare '$got', perplexity '$want'"
  grep -q "^tokens $wt windows $ww ctx 256$" "$D/ab.txt" || fail "$k windows: $(tail -1 "$D/ab.txt") vs $wt $ww"
done
"$PY" - "$D/ab.txt" <<'PY' && ok "f16: small KL, agreement near 1" || fail "f16 KL / agreement: $(cat "$D/ab.txt")"
import sys
t = {l.split()[0]: l.split() for l in open(sys.argv[1])}
kl_mean, kl_p99, kl_max = float(t["kl"][2]), float(t["kl"][4]), float(t["kl"][6])
agree = float(t["top1"][2])
assert 0 < kl_mean < 1e-4 and kl_mean <= kl_p99 <= kl_max < 1e-2, (kl_mean, kl_p99, kl_max)
assert agree > 0.98, agree
PY
# --max-tokens bounds the positions scored
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f16.engine" --text "$D/text.txt" --ctx 64 --max-tokens 200 --threads 2 \
  >"$D/mt.txt" 2>/dev/null && grep -q '^tokens 192 windows 3 ctx 64$' "$D/mt.txt" && ok "--max-tokens" \
  || fail "--max-tokens: $(tail -1 "$D/mt.txt")"

# (4) B's KV-cache dtype
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f32.engine" --text "$D/text.txt" --ctx 256 --kv-dtype int8 --threads 2 \
  >"$D/kv.txt" 2>"$D/kv.err" || fail "compare --kv-dtype int8: $(cat "$D/kv.err")"
want=$("$TURBINE_BIN" perplexity "$D/f32.engine" --text "$D/text.txt" --ctx 256 --kv-dtype int8 --threads 2 2>/dev/null \
  | awk '{print $2, $4}')
got=$(awk '$1 == "B" && $2 == "perplexity" {print $3, $5}' "$D/kv.txt")
kl=$(awk '$1 == "kl" {print $3}' "$D/kv.txt")
[ -n "$want" ] && [ "$got" = "$want" ] && "$PY" -c "import sys; sys.exit(0 if 0 < float('${kl:-0}') < 1e-2 else 1)" \
  && ok "--kv-dtype int8: B perplexity $got = perplexity --kv-dtype int8's, KL $kl" \
  || fail "--kv-dtype int8: B '$got' vs perplexity '$want', KL '$kl'"

# (3) refusals
CK="$D/wide"
"$PY" "$TURBINE_SRC/tests/gen_checkpoints.py" --preset llama-wide --dtype f32 --out "$CK" >/dev/null || fail "checkpoint"
"$TURBINE_BIN" build "$CK" --tokenizer "$M/tok512.bin" -o "$D/wide.engine" >/dev/null 2>&1 || fail "build wide"
"$TURBINE_BIN" compare "$D/f32.engine" "$D/wide.engine" --text "$D/text.txt" >/dev/null 2>"$D/v.err"
[ $? = 1 ] && grep -q "do not share a vocabulary" "$D/v.err" && ok "different vocabularies refused" \
  || fail "vocabulary: $(cat "$D/v.err")"
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f16.engine" >/dev/null 2>"$D/u.err"
[ $? = 2 ] && ok "--text required" || fail "no --text: $(cat "$D/u.err")"
"$TURBINE_BIN" compare "$D/f32.engine" --text "$D/text.txt" >/dev/null 2>"$D/u.err"
[ $? = 2 ] && ok "two engines required" || fail "one engine: $(cat "$D/u.err")"
"$TURBINE_BIN" compare "$D/f32.engine" "$D/f16.engine" --text "$D/text.txt" --ctx 4096 >/dev/null 2>"$D/u.err"
[ $? = 1 ] && grep -q "exceeds the engines' context" "$D/u.err" && ok "--ctx beyond the context" \
  || fail "ctx: $(cat "$D/u.err")"

tb_test_finish test_compare

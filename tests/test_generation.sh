#!/usr/bin/env bash
# Sampling and stopping through the CLI: the same seed gives the same text,
# another seed another text; greedy ignores the seed; --stop ends generation
# at a stop string (never printed), also when it spans tokens; generation ends
# at EOS; timings go to stderr only.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}"
M="$TURBINE_SHARED/models/stories260K"
D="$TURBINE_TMP/generation"
mkdir -p "$D"
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/s.engine" 2>/dev/null || { echo "FAIL: build"; exit 1; }
run() { "$TURBINE_BIN" run "$D/s.engine" -p "Once upon a time" "$@" 2>/dev/null; }

a=$(run -n 120 --temperature 0.9 --seed 7); b=$(run -n 120 --temperature 0.9 --seed 7); c=$(run -n 120 --temperature 0.9 --seed 8)
[ "$a" = "$b" ] && ok "same seed, same text" || bad "same seed gave different texts"
[ "$a" != "$c" ] && ok "another seed, another text" || bad "seeds 7 and 8 gave the same text"
g1=$(run -n 60 --temperature 0 --seed 1); g2=$(run -n 60 --temperature 0 --seed 2)
[ "$g1" = "$g2" ] && ok "greedy ignores the seed" || bad "greedy depends on the seed"
for opt in "--top-k 5" "--top-p 0.5" "--min-p 0.2" "--repeat-penalty 1.3"; do
  x=$(run -n 60 --temperature 0.8 --seed 3 $opt); y=$(run -n 60 --temperature 0.8 --seed 3 $opt)
  [ -n "$x" ] && [ "$x" = "$y" ] && ok "$opt is deterministic under a seed" || bad "$opt not deterministic"
done
# top-k 1 is greedy whatever the temperature
k1=$(run -n 60 --temperature 1.5 --seed 9 --top-k 1)
[ "$k1" = "$g1" ] && ok "top-k 1 equals greedy" || bad "top-k 1 differs from greedy"

# --stop: the greedy story contains "Lily"; generation must stop before it
full=$(run -n 200 --temperature 0)
s=$(run -n 200 --temperature 0 --stop "Lily")
want="${full%%Lily*}"
[ "$s" = "$want" ] && ok "--stop ends before the stop string" || bad "--stop: got [$s] want [$want]"
# a stop string spanning several tokens, and one that never occurs
s2=$(run -n 200 --temperature 0 --stop "a big, red")
want2="${full%%a big, red*}"
[ "$s2" = "$want2" ] && ok "--stop across token boundaries" || bad "--stop across tokens: got [$s2]"
s3=$(run -n 200 --temperature 0 --stop "zebra-xylophone")
[ "$s3" = "$full" ] && ok "--stop that never matches changes nothing" || bad "unmatched --stop changed the text"

# stdout holds only the text: the timing line is on stderr
out=$("$TURBINE_BIN" run "$D/s.engine" -p "Once upon a time" -n 20 --temperature 0 2>"$D/err")
grep -q "timing:" <<<"$out" && bad "timing on stdout" || ok "stdout holds only text"
grep -q "gen_tok_s=" "$D/err" && ok "timing on stderr" || bad "no timing on stderr"
# -n counts the prompt: with -n 5 and a 5-token prompt, exactly one token is generated
"$TURBINE_BIN" run "$D/s.engine" -p "Once upon a time" -n 5 --temperature 0 2>"$D/err5" >/dev/null
grep -q "gen_tokens=1 " "$D/err5" && ok "-n counts the prompt" || bad "-n 5: $(cat "$D/err5")"
# bad sampling values are refused with a message
"$TURBINE_BIN" run "$D/s.engine" -p "x" --top-p 1.5 >/dev/null 2>"$D/e" && bad "--top-p 1.5 accepted" || { grep -q "top-p" "$D/e" && ok "--top-p out of range refused"; }
"$TURBINE_BIN" run "$D/s.engine" -p "x" --temperature -1 >/dev/null 2>"$D/e" && bad "negative temperature accepted" || ok "negative temperature refused"

# --max-step-tokens: a 16-token step profile is recorded in the engine and
# prefills a 25-token prompt in two chunks to the same greedy text; serve's
# step cap cannot exceed it; values outside 16..65536 are refused
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/s16.engine" --max-step-tokens 16 \
  2>/dev/null || bad "build --max-step-tokens 16"
i16=$("$TURBINE_BIN" inspect "$D/s16.engine" 2>/dev/null); idef=$("$TURBINE_BIN" inspect "$D/s.engine" 2>/dev/null)
grep -q '"max_step_tokens": 16,' <<<"$i16" \
  && ok "engine records a 16-token step" || bad "inspect does not show max_step_tokens 16"
grep -q '"max_step_tokens": 512,' <<<"$idef" \
  && ok "default step is 512 tokens" || bad "default engine's step is not 512"
long="Once upon a time, there was a little girl named Lily who loved to play in the park with her dog"
l1=$("$TURBINE_BIN" run "$D/s.engine" -p "$long" -n 60 --temperature 0 2>/dev/null)
l2=$("$TURBINE_BIN" run "$D/s16.engine" -p "$long" -n 60 --temperature 0 2>/dev/null)
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "chunked prefill in 16-token steps gives the same greedy text" \
  || bad "16-token steps changed the greedy text: [$l2] vs [$l1]"
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/x.engine" --max-step-tokens 8 \
  >/dev/null 2>"$D/e" && bad "--max-step-tokens 8 accepted" \
  || { grep -q "max-step-tokens must be between 16 and 65536" "$D/e" && ok "--max-step-tokens 8 refused" \
         || bad "--max-step-tokens 8: unexpected error $(cat "$D/e")"; }
# the target device is parsed before anything is built: an unknown kind or a
# bad index is refused with the accepted forms
for dev in gpu cpux cuda:x; do
  "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/x.engine" --device "$dev" \
    --dtype int8 >/dev/null 2>"$D/e" && bad "--device $dev accepted" \
    || { grep -q "device '$dev'\|device index in '$dev'" "$D/e" && ok "--device $dev refused" \
           || bad "--device $dev: unexpected error $(cat "$D/e")"; }
done
[ "$fails" = 0 ] && echo "all generation checks ok" || { echo "$fails failures"; exit 1; }

#!/usr/bin/env bash
# Every engine-loading error path gives exit code 1 and a message naming the
# problem, never a crash: missing file, not an engine, truncated, corrupted,
# newer format version, a CPU lacking the features the engine was built for;
# and build errors: unsupported dtype, missing tokenizer, missing model; and
# serve/bench with a --device the engine was not built for.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}"
M="$TURBINE_SHARED/models/stories260K"
D="$TURBINE_TMP/engine_errors"
mkdir -p "$D"
fails=0
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/good.engine" 2>/dev/null || { echo "FAIL: build"; exit 1; }

# expect CODE PATTERN -- command...: the command must exit CODE and print PATTERN on stderr
expect() {
  local code="$1" pat="$2"; shift 3
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ "$rc" != "$code" ] || ! grep -qiE "$pat" <<<"$err"; then
    echo "FAIL: '$*' exited $rc (want $code), stderr: $err (want /$pat/)"; fails=$((fails+1))
  else
    echo "ok: $pat"
  fi
}
run() { "$TURBINE_BIN" run "$1" -p "Once" -n 4 --temperature 0; }
# a port nobody listens on now (the kernel picks it)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# expect_serve CODE PATTERN ARGS...: `turbine serve ARGS --port P` as expect does; a port taken between
# the probe and the bind is retried with another (the server binds before it loads the engine)
expect_serve() {
  local code="$1" pat="$2"; shift 2
  local err rc attempt
  for attempt in 1 2 3 4 5; do
    err=$(timeout 30 "$TURBINE_BIN" serve "$@" --port "$(free_port)" 2>&1 >/dev/null); rc=$?
    grep -q "Address already in use" <<<"$err" || break
  done
  if [ "$rc" != "$code" ] || ! grep -qiE "$pat" <<<"$err"; then
    echo "FAIL: 'serve $*' exited $rc (want $code), stderr: $err (want /$pat/)"; fails=$((fails+1))
  else
    echo "ok: $pat"
  fi
}

expect 1 "cannot open .*no-such" -- run "$D/no-such.engine"
printf 'hello world, not an engine at all................................................' >"$D/notengine.engine"
expect 1 "not a Turbine engine" -- run "$D/notengine.engine"
size=$(stat -c %s "$D/good.engine")
head -c $((size / 2)) "$D/good.engine" >"$D/trunc.engine"
expect 1 "truncated" -- run "$D/trunc.engine"
head -c 40 "$D/good.engine" >"$D/tiny.engine"
expect 1 "truncated|not a Turbine engine|corrupted" -- run "$D/tiny.engine"
cp "$D/good.engine" "$D/corrupt.engine"
# flip one byte near the end (inside the weights)
off=$((size - 5000))
printf '\xAB' | dd of="$D/corrupt.engine" bs=1 seek=$off conv=notrunc status=none
expect 1 "section 'weights' is corrupted" -- run "$D/corrupt.engine"
cp "$D/good.engine" "$D/ver.engine"
printf '\x63\x00\x00\x00' | dd of="$D/ver.engine" bs=1 seek=8 conv=notrunc status=none
expect 1 "format version 99.*newer" -- run "$D/ver.engine"
# the engine was built for this CPU's AVX2 kernels; pretend the CPU lacks them
if grep -q avx2 /proc/cpuinfo; then
  expect 1 "lacks avx2" -- env TB_CPU_MASK=0 "$TURBINE_BIN" run "$D/good.engine" -p Once -n 4
fi
expect 1 "dtype i32 is not supported" -- "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --dtype i32 -o "$D/x.engine"
# quantized builds: what they refuse, and why
QB=("$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/x.engine")
expect 1 "awq needs calibration data" -- "${QB[@]}" --dtype int4 --awq
expect 2 "group-size is for --dtype int4" -- "${QB[@]}" --dtype int8 --group-size 32
expect 2 "group.*32, 64 or 128" -- "${QB[@]}" --dtype int4 --group-size 48
expect 1 "zero-point is for --dtype int4" -- "${QB[@]}" --dtype int8 --zero-point
expect 1 "override 'lm_hed'.*no weight is named so" -- "${QB[@]}" --dtype int8 --override lm_hed=f16
expect 1 "NAME_GLOB=DTYPE" -- "${QB[@]}" --dtype int8 --override lm_head
expect 1 "unknown weight dtype 'int3'" -- "${QB[@]}" --dtype int8 --override 'l0.*=int3'
expect 1 "embedding table embed stays a float dtype" -- "${QB[@]}" --dtype int8 --override embed=int8
expect 1 "unknown device 'metal' .use cpu or cuda" -- "${QB[@]}" --dtype int8 --device metal
expect 1 "pass --tokenizer" -- "$TURBINE_BIN" build "$M/stories260K.bin" -o "$D/x.engine"
expect 1 "cannot open|no such|not found" -- "$TURBINE_BIN" build "$D/missing-model" -o "$D/x.engine"
expect 1 "context|too long|tokens" -- "$TURBINE_BIN" run "$D/good.engine" --prompt-ids "$(seq -s, 1 600 | sed 's/[0-9]\+/5/g')" -n 700
expect 1 "not a token id" -- "$TURBINE_BIN" run "$D/good.engine" --prompt-ids 1,2,99999 -n 4
# serve and bench take --device too: a CPU engine asked to run on the GPU is refused by name
expect_serve 1 "built for the cpu backend.*cuda" "$D/good.engine" --device cuda
expect_serve 1 "has no GPU memory" "$D/good.engine" --gpu-memory-fraction 0.9
expect 2 "gpu-memory-fraction must be in \(0, 1\], got 1.5" -- "$TURBINE_BIN" serve "$D/good.engine" --gpu-memory-fraction 1.5
expect 1 "built for the cpu backend.*cuda" -- "$TURBINE_BIN" bench --engine "$D/good.engine" --device cuda --batch 1 --output-len 4
# inspect names the sections and the fingerprint
out=$("$TURBINE_BIN" inspect "$D/good.engine")
for w in meta hardware tokenizer graph weights "format version" "profiles" "avx2"; do
  grep -q "$w" <<<"$out" || { echo "FAIL: inspect lacks '$w'"; fails=$((fails+1)); }
done
# 40 random byte changes (fixed seed), a quarter of them in the first 256 bytes (header, section
# table): each load fails with exit 1 and a message, or (the 1% of bytes no section covers: alignment
# padding) runs; never a crash
RANDOM=4242
flipped=0 refused=0
for i in $(seq 40); do
  cp "$D/good.engine" "$D/flip.engine"
  if [ $((i % 4)) = 0 ]; then off=$((RANDOM % 256)); else off=$(( (RANDOM * 32768 + RANDOM) % size )); fi
  printf "\\x$(printf %02x $((RANDOM % 255 + 1)))" | dd of="$D/flip.engine" bs=1 seek=$off conv=notrunc status=none
  cmp -s "$D/flip.engine" "$D/good.engine" && continue  # the same byte again
  flipped=$((flipped + 1))
  err=$(timeout 60 "$TURBINE_BIN" run "$D/flip.engine" -p Once -n 4 --temperature 0 2>&1 >/dev/null); rc=$?
  if [ "$rc" = 1 ] && [ -n "$err" ]; then refused=$((refused + 1))
  elif [ "$rc" != 0 ]; then echo "FAIL: a byte changed at offset $off: exit $rc, stderr: $err"; fails=$((fails+1)); fi
done
echo "ok: $flipped random byte changes: $refused refused with a message, none crashed"
[ "$refused" -ge $((flipped - 2)) ] || { echo "FAIL: only $refused of $flipped changed engines refused"; fails=$((fails+1)); }

[ "$fails" = 0 ] && echo "all engine error paths ok" || { echo "$fails failures"; exit 1; }

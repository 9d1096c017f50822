#!/usr/bin/env bash
# Quantized engines (--dtype int8 | int4 | fp8) end to end:
#  (1) stories260K: each dtype builds, loads and generates; its KV cache is
#      f16 by default; a byte flipped in a weight's codes is refused by the
#      weights section's checksum;
#  (2) random checkpoints (llama-gqa: untied head, K = 172 so int4 falls back
#      to int8 for the down projection; qwen2: q/k/v biases, tied head):
#      the logits of the quantized engine equal, within 1e-4 of their
#      largest magnitude, those of an f32 engine built from the same
#      checkpoint with its weights replaced by their dequantised values
#      (tests/quant_dequant.py): the quantisation is the only difference
#      (built with --qmm-tactics exact: the kernels that sum in f32); built
#      with --qmm-tactics q8 (activations rounded to int8 per block of 32),
#      one-token runs equal the float64 reference with that rounding
#      (tests/quant_q8_ref.py) within 1e-5, 12 of 16 at least (an
#      activation on a rounding half-step may flip), where the exact twin
#      differs 10x more;
#  (3) `turbine inspect`: per-tensor dtype, shape and bytes, and the bits
#      per weight against the figure computed from the model's shape;
#  (4) overrides: lm_head=int8 makes the head a quantized matmul (int4
#      engines have an int8 head by default; lm_head=f16 gives the f16 one).
# The accuracy gates are tests/test_quant_accuracy.sh.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
PY=/usr/bin/python3
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: /usr/bin/python3 with numpy is needed"; exit 77; }
D="$TURBINE_TMP/quant_engines"
rm -rf "$D"; mkdir -p "$D"
M="$TURBINE_SHARED/models/stories260K"
TOK="$M/tok512.bin"
fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# ---- (1) stories260K: build, load, run; corruption
for dt in int8 int4 fp8; do
  if ! "$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$TOK" --dtype $dt -o "$D/s_$dt.engine" >"$D/b.log" 2>&1; then
    fail "stories260K $dt build: $(tail -1 "$D/b.log")"; continue
  fi
  out=$("$TURBINE_BIN" run "$D/s_$dt.engine" -p "Once upon a time" -n 24 --temperature 0 2>/dev/null)
  [ "${#out}" -gt 40 ] && ok "stories260K $dt generates: ${out:0:60}..." || fail "stories260K $dt: '$out'"
done
# a quantized engine's KV cache is f16 on the CPU unless --kv-dtype says otherwise
kvd() { "$TURBINE_BIN" run "$D/s_int8.engine" -p Once -n 4 --temperature 0 "$@" 2>&1 >/dev/null | sed -n 's/^timing:.* kv_dtype=\([a-z0-9]*\).*/\1/p'; }
k1=$(kvd); k2=$(kvd --kv-dtype f32)
[ "$k1" = f16 ] && [ "$k2" = f32 ] && ok "int8 engine: KV cache f16 by default, f32 with --kv-dtype f32" \
  || fail "int8 engine KV dtype: default '$k1' (want f16), --kv-dtype f32 '$k2'"
# the bytes of l0.wqkv's codes: its offset in the weights section (inspect)
# plus the section's offset; flip one in the middle
woff=$("$TURBINE_BIN" inspect "$D/s_int8.engine" | awk '$1 == "weights" && $2 == "offset" {print $3}')
coff=$("$TURBINE_BIN" inspect "$D/s_int8.engine" | awk '$1 == "l0.wqkv" {print $NF}')
cbytes=$("$TURBINE_BIN" inspect "$D/s_int8.engine" | awk '$1 == "l0.wqkv" {print $5}')
if [ -n "$woff" ] && [ -n "$coff" ] && [ -n "$cbytes" ]; then
  cp "$D/s_int8.engine" "$D/bad.engine"
  at=$((woff + coff + cbytes / 2))
  b=$(od -An -tu1 -j "$at" -N1 "$D/bad.engine" | tr -d ' ')
  printf "\\x$(printf %02x $(((b + 1) % 256)))" | dd of="$D/bad.engine" bs=1 seek="$at" conv=notrunc status=none
  err=$("$TURBINE_BIN" run "$D/bad.engine" -p Once -n 2 2>&1 >/dev/null); rc=$?
  [ $rc = 1 ] && grep -q "section 'weights' is corrupted" <<<"$err" && ok "a flipped codes byte is refused: $err" \
    || fail "flipped codes byte: rc $rc, '$err'"
else
  fail "inspect gave no offsets for l0.wqkv (weights '$woff', l0.wqkv '$coff' '$cbytes')"
fi

# ---- (2) logits against the dequantised f32 twin
IDS=$("$PY" -c 'print(",".join(str(3 + (i * 53) % 500) for i in range(32)))')
rel_diff() { # A.bin B.bin -> max |a - b| / max |b|
  "$PY" -c "import numpy as np, sys; a = np.fromfile(sys.argv[1], '<f4'); b = np.fromfile(sys.argv[2], '<f4')
print('%.3e' % (np.abs(a - b).max() / np.abs(b).max()) if a.size == b.size and a.size > 0 else 'size %d vs %d' % (a.size, b.size))" "$1" "$2"
}
for preset in llama-gqa qwen2; do
  CK="$D/ck_$preset"
  "$PY" "$TURBINE_SRC/tests/gen_checkpoints.py" --preset $preset --dtype f32 --out "$CK" >/dev/null || { fail "gen $preset"; continue; }
  for v in "int8" "fp8" "int4 32" "int4 32 asym" "int4 64"; do
    read -r dt group asym <<<"$v"
    args=(--dtype "$dt"); [ -n "${group:-}" ] && args+=(--group-size "$group"); [ -n "${asym:-}" ] && args+=(--zero-point)
    qdt=$dt; [ $dt = int8 ] && qdt=i8; [ $dt = int4 ] && qdt=i4; [ $dt = fp8 ] && qdt=fp8_e4m3
    tag="$preset ${v// /_}"
    TW="$D/twin_$preset"
    rm -rf "$TW"
    "$PY" "$TURBINE_SRC/tests/quant_dequant.py" "$CK" "$TW" $qdt ${group:-0} ${asym:-} || { fail "$tag: dequantised twin"; continue; }
    "$TURBINE_BIN" build "$CK" --tokenizer "$TOK" "${args[@]}" --qmm-tactics exact -o "$D/q.engine" >"$D/b.log" 2>&1 || { fail "$tag build: $(tail -1 "$D/b.log")"; continue; }
    "$TURBINE_BIN" build "$TW" --tokenizer "$TOK" --dtype f32 -o "$D/t.engine" >/dev/null 2>&1 || { fail "$tag twin build"; continue; }
    # an f32 cache as the twin's (a quantized engine's own default is f16)
    "$TURBINE_BIN" run "$D/q.engine" --prompt-ids "$IDS" -n 1 --temperature 0 --kv-dtype f32 --logits-out "$D/q.bin" >/dev/null 2>&1
    "$TURBINE_BIN" run "$D/t.engine" --prompt-ids "$IDS" -n 1 --temperature 0 --logits-out "$D/t.bin" >/dev/null 2>&1
    # and the quantisation does change the logits (the comparison can fail)
    [ -f "$D/f_$preset.bin" ] || { "$TURBINE_BIN" build "$CK" --tokenizer "$TOK" -o "$D/f.engine" >/dev/null 2>&1;
      "$TURBINE_BIN" run "$D/f.engine" --prompt-ids "$IDS" -n 1 --temperature 0 --logits-out "$D/f_$preset.bin" >/dev/null 2>&1; }
    r=$(rel_diff "$D/q.bin" "$D/t.bin"); rq=$(rel_diff "$D/q.bin" "$D/f_$preset.bin")
    if "$PY" -c "import sys; sys.exit(0 if float('$r') <= 1e-4 and float('$rq') > 1e-3 else 1)" 2>/dev/null; then
      ok "$tag: logits = dequantised f32 twin within $r (the f32 engine differs by $rq)"
    else
      fail "$tag: logits vs dequantised twin $r (want <= 1e-4), vs f32 $rq (want > 1e-3)"
    fi
    [ "$dt" = fp8 ] && continue # Q8 is for int8 and int4 weights
    # Q8: the engine against the reference that rounds each projection's
    # input as the tactic does. Q8 is discontinuous: an activation that the
    # f32 engine and the float64 reference put on either side of a rounding
    # half-step (about 1 in 40,000) moves its position's logits, and through
    # attention every later position's, by as much as the whole rounding.
    # So each of 16 ids runs as a one-token sequence: a flip spoils one row;
    # at least 12 rows must equal the reference within 1e-5 (with ~1,300
    # rounded activations a row, 16 rows see about 0.5 flips), and there the
    # exact twin must differ by over 10x more (the rounding is visible).
    "$TURBINE_BIN" build "$CK" --tokenizer "$TOK" "${args[@]}" --qmm-tactics q8 -o "$D/q8.engine" >"$D/b.log" 2>&1 || { fail "$tag q8 build: $(tail -1 "$D/b.log")"; continue; }
    "$TURBINE_BIN" inspect "$D/q8.engine" >"$D/q8_inspect.txt" 2>&1
    nq8=$(sed -n 's/.*"q8_decode_nodes": \([0-9]*\).*/\1/p' "$D/q8_inspect.txt")
    if [ "${nq8:-0}" = 0 ]; then echo "note: $tag: no Q8 kernels on this CPU (q8_decode_nodes '$nq8'): Q8 not checked"; continue; fi
    ONE=$(seq 3 31 468 | head -16 | paste -sd,)
    : >"$D/q8.bin"; : >"$D/t1.bin"
    for id in ${ONE//,/ }; do
      "$TURBINE_BIN" run "$D/q8.engine" --prompt-ids "$id" -n 1 --temperature 0 --kv-dtype f32 --logits-out "$D/one.bin" >/dev/null 2>&1
      head -c $((4 * 512)) "$D/one.bin" >>"$D/q8.bin"
      "$TURBINE_BIN" run "$D/t.engine" --prompt-ids "$id" -n 1 --temperature 0 --logits-out "$D/one.bin" >/dev/null 2>&1
      head -c $((4 * 512)) "$D/one.bin" >>"$D/t1.bin"
    done
    hq=(); [ "$dt" = int4 ] && hq=(--head-q8) # int4 engines: the int8 head is a qmatmul too
    "$PY" "$TURBINE_SRC/tests/quant_q8_ref.py" "$TW" "$ONE" "$D/q8ref.bin" --each "${hq[@]}" || { fail "$tag: q8 reference"; continue; }
    res=$("$PY" -c "import numpy as np, sys
e, r, t = (np.fromfile(f, '<f4') for f in sys.argv[1:4])
if not (e.size == r.size == t.size == 16 * 512): print('sizes %d %d %d' % (e.size, r.size, t.size)); sys.exit()
e, r, t = e.reshape(16, -1), r.reshape(16, -1), t.reshape(16, -1)
m = np.abs(r).max(axis=1)
de, dt = np.abs(e - r).max(axis=1) / m, np.abs(t - r).max(axis=1) / m
good = de <= 1e-5
print(int(good.sum()), '%.1e' % de[good].max() if good.any() else '-', '%.1e' % dt[good].min() if good.any() else '-')" "$D/q8.bin" "$D/q8ref.bin" "$D/t1.bin")
    read -r ngood re rt <<<"$res"
    if [ "${ngood:-0}" -ge 12 ] 2>/dev/null && "$PY" -c "import sys; sys.exit(0 if float('$rt') >= 10 * float('$re') else 1)" 2>/dev/null; then
      ok "$tag q8 ($nq8 Q8 matmuls): $ngood of 16 one-token runs = the Q8 reference within $re (the exact twin differs by >= $rt)"
    else
      fail "$tag q8: '$ngood' of 16 one-token runs equal the Q8 reference within 1e-5 (want >= 12; worst of them '$re', exact twin '$rt')"
    fi
  done
done

# ---- (3) inspect
DEMO="$TURBINE_SRC/models/demo/shakespeare"
"$TURBINE_BIN" build "$DEMO" --dtype int4 --group-size 32 -o "$D/d_int4.engine" >/dev/null 2>&1 || fail "demo int4 build"
"$TURBINE_BIN" inspect "$D/d_int4.engine" >"$D/inspect.txt" 2>&1 || fail "inspect"
grep -qE "^  l0\.wqkv +i4 +\(512, 256\) +65536 bytes" "$D/inspect.txt" && ok "inspect: l0.wqkv i4 (512, 256) 65536 bytes" \
  || fail "inspect: no 'l0.wqkv i4 (512, 256) 65536 bytes' line: $(grep wqkv "$D/inspect.txt")"
grep -qE "^  l0\.wqkv\.scales +f32 +\(512, 8\) +16384 bytes" "$D/inspect.txt" && ok "inspect: l0.wqkv.scales f32 (512, 8)" \
  || fail "inspect: scales line: $(grep wqkv.scales "$D/inspect.txt")"
grep -qE "^  embed +f16 +\(1024, 256\)" "$D/inspect.txt" && ok "inspect: embed f16" || fail "inspect: embed line"
grep -q "qmatmul x25" "$D/inspect.txt" && ok "inspect: 25 qmatmul nodes (the head too)" || fail "inspect ops: $(grep ops: "$D/inspect.txt")"
grep -qE "^  lm_head +i8 +\(1024, 256\) +262144 bytes" "$D/inspect.txt" && ok "inspect: an int4 engine's head is int8 by default" \
  || fail "inspect: int4 head: $(grep lm_head "$D/inspect.txt")"
# bits per matmul weight: the 6 layers' matrices at 4 + 32/32 bits, the head
# (tied to the embedding, so its own int8 copy) at 8 + 32/256
bpw() { "$PY" -c "l = 6 * (512*256 + 256*256 + 1024*256 + 256*512); h = 1024*256; print('%.3f' % ((l * 5 + h * $1) / (l + h)))"; }
want=$(bpw 8.125)
got=$(sed -n 's/^bits per weight: \([0-9.]*\) over the matmul.*/\1/p' "$D/inspect.txt")
[ "$got" = "$want" ] && ok "inspect: $got bits per matmul weight (int4 g32 + int8 head)" || fail "bits per weight '$got', want $want"
# --override lm_head=f16 gives the former engine: the head reads the f16 table
"$TURBINE_BIN" build "$DEMO" --dtype int4 --group-size 32 --override 'lm_head=f16' -o "$D/d_int4h16.engine" >/dev/null 2>&1 \
  || fail "demo int4 lm_head=f16 build"
"$TURBINE_BIN" inspect "$D/d_int4h16.engine" >"$D/inspect16.txt" 2>&1
want=$(bpw 16)
got=$(sed -n 's/^bits per weight: \([0-9.]*\) over the matmul.*/\1/p' "$D/inspect16.txt")
grep -q "qmatmul x24" "$D/inspect16.txt" && ! grep -qE "^  lm_head " "$D/inspect16.txt" && [ "$got" = "$want" ] \
  && ok "int4 --override lm_head=f16: 24 qmatmul nodes, the tied f16 head, $got bits per weight" \
  || fail "int4 --override lm_head=f16: bits '$got' (want $want), $(grep -E "ops:|lm_head" "$D/inspect16.txt")"

# ---- (4) overrides: by a fused weight's name (l*.wgu), by a part's (l0.wq: q apart from k|v), the head
S=(--tokenizer "$TOK" -o "$D/ov.engine")
if "$TURBINE_BIN" build "$M/stories260K.bin" "${S[@]}" --dtype f16 --override 'l*.wgu=int8' --override 'l0.wq=f32' >"$D/b.log" 2>&1; then
  "$TURBINE_BIN" inspect "$D/ov.engine" >"$D/inspect_ov.txt" 2>&1
  grep -qE "^  l3\.wgu +i8 +\(344, 64\)" "$D/inspect_ov.txt" && grep -qE "^  l0\.wq +f32 +\(64, 64\)" "$D/inspect_ov.txt" \
    && grep -qE "^  l0\.wk +f16" "$D/inspect_ov.txt" && grep -qE "^  l1\.wqkv +f16" "$D/inspect_ov.txt" \
    && grep -q "concat_cols x1" "$D/inspect_ov.txt" \
    && ok "--override l*.wgu=int8, l0.wq=f32: fused gate|up int8; layer 0 q f32, k and v f16, unmerged" \
    || fail "overrides by name: $(grep -E "^  l[013]\.w" "$D/inspect_ov.txt")"
  out=$("$TURBINE_BIN" run "$D/ov.engine" -p "Once upon a time" -n 24 --temperature 0 2>/dev/null)
  [ "${#out}" -gt 40 ] && ok "the mixed engine generates" || fail "mixed engine: '$out'"
else
  fail "override build: $(tail -1 "$D/b.log")"
fi
# ---- (4) an override: the head quantized too
"$TURBINE_BIN" build "$DEMO" --dtype int8 --override 'lm_head=int8' -o "$D/d_head8.engine" >/dev/null 2>&1 || fail "override build"
"$TURBINE_BIN" inspect "$D/d_head8.engine" >"$D/inspect8.txt" 2>&1
grep -qE "^  lm_head +i8 +\(1024, 256\)" "$D/inspect8.txt" && grep -qE "^  embed +f16" "$D/inspect8.txt" \
  && grep -q "qmatmul x25" "$D/inspect8.txt" && ok "--override lm_head=int8: a quantized head beside the f16 embedding" \
  || fail "--override lm_head=int8: $(grep -E "lm_head|embed|ops:" "$D/inspect8.txt")"

[ $fails = 0 ] && echo "all passed" || echo "$fails failure(s)"
exit $((fails > 0))

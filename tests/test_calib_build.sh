#!/usr/bin/env bash
# turbine build --calib: (1) calibrating stories260K over text writes a cache
# whose header names the format version, the calibrator and the model's
# fingerprint, with one scale per matmul input, and shows progress; the
# engine's meta records it; (2) a build with that cache reuses it without
# running the model (no progress, the scales read back); (3) a cache of
# another calibrator, of another model, and of another format version is
# refused with a message naming which; (4) token ids work as calibration
# data, and each calibrator gives its own scales (minmax the largest);
# (5) bad arguments are refused; (6) on a random checkpoint the first
# matmul's statistics (max |x|, per-channel mean |x|) equal numpy's; (7) the
# quantize pass gets the calibration: fp8 activation scales, --awq and its refusals.
. "$(dirname "$0")/tb_test.sh"
tb_test_dir calib_build
B=("$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --calib-threads 2)
head -c 30000 "$TURBINE_SHARED/data/tinyshakespeare.txt" > "$D/calib.txt"

# (1) calibrate and write the cache
"${B[@]}" -o "$D/a.engine" --calib "$D/calib.txt" --calib-tokens 2048 --calib-cache "$D/e.cache" 2>"$D/a.err" \
  || fail "calibrating build: $(cat "$D/a.err")"
grep -q "calibrating: 2048/2048 tokens" "$D/a.err" && ok "progress shown" || fail "no progress: $(cat "$D/a.err")"
head -1 "$D/e.cache" | grep -Eq "^TURBINE-CALIB-CACHE 1 calibrator=entropy fingerprint=[0-9a-f]{16} tokens=2048$" \
  && ok "cache header" || fail "cache header: $(head -1 "$D/e.cache")"
# stories260K: 5 layers x (qkv, wo, gate|up, down) + the (tied) LM head
n=$(grep -Ec '^[^ ]+: [0-9.e+-]+$' "$D/e.cache")
[ "$n" = 21 ] && ok "21 scales" || fail "scales: $n"
grep -q '^l0.wqkv: ' "$D/e.cache" && grep -q '^l4.wdown: ' "$D/e.cache" && grep -q '^l0.wqkv mean_abs: ' "$D/e.cache" \
  && ok "names are the matmul weights" || fail "names: $(cut -c1-60 "$D/e.cache")"
"$TURBINE_BIN" inspect "$D/a.engine" > "$D/a.txt" 2>&1 # a file, not a pipe: see (7)
grep -q '"calibrator": "entropy"' "$D/a.txt" && ok "meta records it" || fail "meta"

# (2) reuse: no model run
"${B[@]}" -o "$D/b.engine" --calib-cache "$D/e.cache" 2>"$D/b.err" || fail "cached build: $(cat "$D/b.err")"
grep -q "calibration: 21 scales read from" "$D/b.err" && ! grep -q "calibrating" "$D/b.err" \
  && ok "cache reused without running the model" || fail "reuse: $(cat "$D/b.err")"
cp "$D/e.cache" "$D/copy.cache"
"${B[@]}" -o "$D/b.engine" --calib "$D/calib.txt" --calib-cache "$D/copy.cache" 2>"$D/b2.err" \
  && ! grep -q "calibrating" "$D/b2.err" && cmp -s "$D/e.cache" "$D/copy.cache" \
  && ok "an existing cache wins over --calib" || fail "cache with --calib: $(cat "$D/b2.err")"

# (3) refusals
"${B[@]}" -o "$D/c.engine" --calib-cache "$D/e.cache" --calibrator mse 2>"$D/c.err"
[ $? = 1 ] && grep -q "made by calibrator entropy, this build asks for mse" "$D/c.err" \
  && ok "another calibrator refused" || fail "calibrator refusal: $(cat "$D/c.err")"
CK="$D/other"
"$PY" "$TURBINE_SRC/tests/gen_checkpoints.py" --preset llama-gqa --dtype f32 --out "$CK" >/dev/null || fail "checkpoint"
"$TURBINE_BIN" build "$CK" --tokenizer "$M/tok512.bin" -o "$D/o.engine" --calib-cache "$D/e.cache" 2>"$D/o.err"
[ $? = 1 ] && grep -q "is for another model (fingerprint" "$D/o.err" \
  && ok "another model refused" || fail "model refusal: $(cat "$D/o.err")"
sed '1s/CACHE 1 /CACHE 2 /' "$D/e.cache" > "$D/v2.cache"
"${B[@]}" -o "$D/c.engine" --calib-cache "$D/v2.cache" 2>"$D/v.err"
[ $? = 1 ] && grep -q "has format version 2; this turbine reads version 1" "$D/v.err" \
  && ok "another version refused" || fail "version refusal: $(cat "$D/v.err")"
"${B[@]}" -o "$D/c.engine" --calib-cache "$D/missing.cache" 2>"$D/m.err"
[ $? = 1 ] && grep -q "needs --calib FILE" "$D/m.err" && ok "missing cache without --calib refused" \
  || fail "missing cache: $(cat "$D/m.err")"

# (4) token ids, and the calibrators
"$PY" -c 'print(" ".join(str(1 + (i * 37) % 500) for i in range(1024)))' > "$D/ids.txt"
for c in minmax entropy percentile=99.9 mse; do
  "${B[@]}" -o "$D/i.engine" --calib "$D/ids.txt" --calibrator "$c" --calib-cache "$D/ids_$c.cache" 2>"$D/i.err" \
    || fail "ids calibrator $c: $(cat "$D/i.err")"
  head -1 "$D/ids_$c.cache" | grep -q "calibrator=$c .*tokens=1024$" || fail "ids header $c: $(head -1 "$D/ids_$c.cache")"
done
# minmax keeps the whole range: no other calibrator's scale is above its own
"$PY" - "$D" <<'PY' && ok "minmax is the widest" || fail "calibrator scales"
import sys
d = sys.argv[1]
def load(c):
    out = {}
    for line in open("%s/ids_%s.cache" % (d, c)).read().splitlines()[1:]:
        k, v = line.split(":", 1)
        if " " not in k:
            out[k] = float(v)
    return out
mm = load("minmax")
for c in ("entropy", "percentile=99.9", "mse"):
    o = load(c)
    assert o.keys() == mm.keys(), c
    assert all(o[k] <= mm[k] * (1 + 1e-6) + 1e-12 for k in mm), c
    assert any(o[k] < mm[k] * 0.99 for k in mm), c   # and they do clip somewhere
PY
echo "1 2 99999" > "$D/bad_ids.txt"
"${B[@]}" -o "$D/i.engine" --calib "$D/bad_ids.txt" 2>"$D/bi.err"
[ $? = 1 ] && grep -q "outside the vocabulary" "$D/bi.err" && ok "bad ids refused" || fail "bad ids: $(cat "$D/bi.err")"

# (6) the statistics are those of the right buffers: on the random llama-gqa checkpoint, the first
# matmul's input is RMSNorm(embedding[ids]) for every token (no position dependence), so its minmax
# threshold (scale x 127) and per-channel mean |x| equal numpy's over the 1024 calibration ids
"$TURBINE_BIN" build "$CK" --tokenizer "$M/tok512.bin" -o "$D/g.engine" --calib "$D/ids.txt" --calibrator minmax \
  --calib-cache "$D/g.cache" --calib-threads 2 2>"$D/g.err" || fail "llama-gqa calibration: $(cat "$D/g.err")"
"$PY" - "$TURBINE_SRC/tests" "$CK" "$D/ids.txt" "$D/g.cache" <<'PY' && ok "layer 0 statistics match numpy" \
  || fail "layer 0 statistics"
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import reference as R
cfg, w = R.load_model(sys.argv[2])
ids = [int(t) for t in open(sys.argv[3]).read().split()][:1024]
x = R.rmsnorm(w["model.embed_tokens.weight"][ids].astype(np.float64), w["model.layers.0.input_layernorm.weight"],
              cfg["eps"])
lines = open(sys.argv[4]).read().splitlines()
scales = {l.split(":")[0]: float(l.split(":")[1]) for l in lines[1:] if " " not in l.split(":")[0]}
means = {l.split(" ")[0]: np.array([float(v) for v in l.split(":")[1].split()]) for l in lines[1:]
         if " mean_abs:" in l}
name = lines[1].split(":")[0]          # the first matmul: layer 0's q|k|v
amax, mean = np.abs(x).max(), np.abs(x).mean(axis=0)
print(name, scales[name] * 127, amax)
assert abs(scales[name] * 127 - amax) <= 1e-5 * amax
assert means[name].shape == mean.shape and np.allclose(means[name], mean, rtol=1e-4, atol=1e-7)
assert len(scales) == 3 * 4 + 1       # 3 layers x (qkv, o, gate|up, down) + the LM head
PY

# (7) calibration reaches the quantize pass: an fp8 engine stores each matmul's static activation
# scale (the cache's threshold / 448; inspect lists them), and an int4 --awq build from the cache
# searches AWQ scales on q|k|v and gate|up (folded into the norms) and wo (folded into wv's rows),
# 3 per layer; wdown is int8 here (K = 172 is not whole groups of 32) and the head f16, so neither
# is searched; every int4 matmul is clipped
"${B[@]}" -o "$D/f8.engine" --dtype fp8 --calib-cache "$D/e.cache" 2>"$D/f8.err" || fail "fp8 build: $(cat "$D/f8.err")"
"$TURBINE_BIN" inspect "$D/f8.engine" > "$D/f8.txt" 2>&1
"$PY" - "$D/e.cache" "$D/f8.txt" <<'PY' && ok "fp8 engine stores the calibrated activation scales" \
  || fail "fp8 act scales: $(grep -A3 'activation scales' "$D/f8.txt")"
import sys
cache = {l.split(":")[0]: float(l.split(":")[1]) for l in open(sys.argv[1]).read().splitlines()[1:]
         if " " not in l.split(":")[0]}
lines = open(sys.argv[2]).read().splitlines()
i = lines.index("activation scales (static, per tensor):")
got = {}
for l in lines[i + 1:]:
    if not l.startswith("  "):
        break
    k, v = l.split()
    got[k] = float(v)
print(len(got), "scales, l0.wqkv", got.get("l0.wqkv"), "cache (int8)", cache["l0.wqkv"])
# fp8 matmuls: every layer's (the head stays f16); the scale is the int8 one x 127 / 448
assert len(got) == 20, got
for k, v in got.items():
    assert v > 0 and abs(v - cache[k] * 127 / 448) <= 1e-4 * v, (k, v, cache[k])
PY
"${B[@]}" -o "$D/aw.engine" --dtype int4 --group-size 32 --awq --calib-cache "$D/e.cache" --verbose 2>"$D/aw.err" \
  || fail "awq build: $(cat "$D/aw.err")"
n=$(grep -c "awq l[0-9]*\.w.*alpha" "$D/aw.err")
grep -q "AWQ scales on 30 matmuls, clipping on 30" "$D/aw.err" && [ "$n" = 15 ] && grep -q "awq l4\.wo " "$D/aw.err" \
  && ! grep -q "awq l[0-9]*\.wdown " "$D/aw.err" \
  && ok "awq: 15 groups searched (q|k|v, wo, gate|up), wdown (int8) left, 30 matmuls clipped" \
  || fail "awq report ($n): $(grep -i awq "$D/aw.err")"
# (into a file: grep -q stops reading early and pipefail would count inspect's SIGPIPE)
"$TURBINE_BIN" inspect "$D/aw.engine" > "$D/aw.txt" 2>&1
grep -q '"method": "awq"' "$D/aw.txt" && ok "meta records awq" || fail "awq meta: $(grep -m1 method "$D/aw.txt")"
"${B[@]}" -o "$D/u.engine" --dtype int4 --awq 2>"$D/u.err"
[ $? = 1 ] && grep -q "needs calibration data: pass --calib FILE .* or --calib-cache FILE" "$D/u.err" \
  && ok "--awq without calibration refused" || fail "--awq without calibration: $(cat "$D/u.err")"
"${B[@]}" -o "$D/u.engine" --dtype int8 --awq --calib-cache "$D/e.cache" 2>"$D/u.err"
[ $? = 1 ] && grep -q "awq is for --dtype int4" "$D/u.err" && ok "--awq with int8 refused" \
  || fail "--awq int8: $(cat "$D/u.err")"

# (5) usage errors
"${B[@]}" -o "$D/u.engine" --calib "$D/calib.txt" --calibrator kl 2>"$D/u.err"
[ $? = 2 ] && grep -q "unknown calibrator 'kl'" "$D/u.err" && ok "unknown calibrator" || fail "calibrator usage: $(cat "$D/u.err")"
"${B[@]}" -o "$D/u.engine" --calib "$D/calib.txt" --calib-tokens 1 2>"$D/u.err"
[ $? = 2 ] && ok "--calib-tokens range" || fail "--calib-tokens 1: $(cat "$D/u.err")"

tb_test_finish test_calib_build

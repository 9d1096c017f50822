#!/usr/bin/env bash
# Zero weights take no disk space: a shape-only checkpoint
# (bench/gpu/torch_ckpt.py --empty: a safetensors header and a hole) builds
# into an engine whose weights are holes too (the writer seeks over whole
# zero MiB chunks, the build never copies them), and the engine loads (every
# section's checksum verified over the holes) and runs. The nonzero bytes
# between holes survive: with only two embedding rows, the final norm and one
# LM-head row set, the logits of the prompt are that row's dot product at
# that token and zero elsewhere.
. "$(dirname "$0")/tb_test.sh"
tb_test_dir engine_sparse
CK="$D/ck"
"$PY" "$TURBINE_SRC/bench/gpu/torch_ckpt.py" --shape llama7b --layers 1 --out "$CK" --empty > "$D/ckpt.txt" 2>&1 ||
    { cat "$D/ckpt.txt"; fail "torch_ckpt.py --empty"; tb_test_finish test_engine_sparse; }
# allocated bytes / apparent size of a file
used() { stat -c '%b %B %s' "$1" | awk '{printf "%.4f", $1 * $2 / $3}'; }
u=$(used "$CK/model.safetensors")
awk -v u="$u" 'BEGIN { exit !(u < 0.01) }' && ok "empty checkpoint is sparse ($u of its size allocated)" ||
    fail "empty checkpoint has $u of its size allocated (want < 1%)"

"$TURBINE_BIN" build "$CK" -o "$D/zero.engine" --tokenizer "$TURBINE_SHARED/models/llama2_tokenizer.bin" --dtype f16 \
    --max-seq-len 64 > "$D/build_zero.txt" 2>&1 || { cat "$D/build_zero.txt"; fail "build of the zero checkpoint"; }
size=$(stat -c %s "$D/zero.engine" 2>/dev/null || echo 0)
u=$(used "$D/zero.engine")
if [ "$size" -gt 600000000 ] && awk -v u="$u" 'BEGIN { exit !(u < 0.05) }'; then
    ok "zero-weight engine of $size bytes has $u of them allocated"
else
    fail "zero-weight engine: $size bytes, $u allocated (want > 600 MB, < 5%)"
fi
"$TURBINE_BIN" run "$D/zero.engine" --prompt-ids 1,450 -n 2 --temperature 0 --logits-out "$D/zero.bin" \
    > "$D/run_zero.txt" 2>&1 && ok "zero-weight engine loads and runs" || { cat "$D/run_zero.txt"; fail "run of the zero engine"; }

# a few nonzero tensor rows written into the holes of a copy of the checkpoint
cp --sparse=always -r "$CK" "$D/ck2"
"$PY" - "$D/ck2/model.safetensors" <<'PYEOF' || fail "writing rows into the checkpoint"
import json, struct, sys
import numpy as np
p = sys.argv[1]
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    D = h["model.norm.weight"]["shape"][0]
    def put(name, row, value):
        t = h[name]
        width = t["shape"][-1]
        f.seek(8 + n + t["data_offsets"][0] + 2 * row * width)
        f.write(np.full(width, value, dtype=np.float16).tobytes())
    put("model.embed_tokens.weight", 1, 0.5)
    put("model.embed_tokens.weight", 450, 0.5)
    put("model.norm.weight", 0, 1.0)
    put("lm_head.weight", 7, 0.01)
PYEOF
"$TURBINE_BIN" build "$D/ck2" -o "$D/rows.engine" --tokenizer "$TURBINE_SHARED/models/llama2_tokenizer.bin" --dtype f16 \
    --max-seq-len 64 > "$D/build_rows.txt" 2>&1 || { cat "$D/build_rows.txt"; fail "build of the checkpoint with rows"; }
u=$(used "$D/rows.engine")
awk -v u="$u" 'BEGIN { exit !(u < 0.05) }' && ok "engine with a few rows is still sparse ($u allocated)" ||
    fail "engine with a few rows has $u of its size allocated"
"$TURBINE_BIN" run "$D/rows.engine" --prompt-ids 1,450 -n 1 --temperature 0 --logits-out "$D/rows.bin" \
    > "$D/run_rows.txt" 2>&1 || { cat "$D/run_rows.txt"; fail "run of the engine with rows"; }
"$PY" - "$D/rows.bin" "$D/zero.bin" <<'PYEOF' && ok "the rows between holes reach the logits" || fail "logits of the engine with rows"
import sys
import numpy as np
V = 32000
a = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, V)
z = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, V)
want = 4096 * float(np.float16(0.01))  # RMSNorm of a constant row is ones: the LM-head row's sum
ok = a.shape[0] >= 2 and z.shape[0] >= 2
for r in range(2 if ok else 0):
    rest = np.delete(a[r], 7)
    print("row %d: logit 7 = %.4f (want %.4f), largest other |logit| %.3g" % (r, a[r, 7], want, np.abs(rest).max()))
    ok = ok and abs(a[r, 7] - want) <= 1e-2 * want and np.abs(rest).max() == 0
print("zero engine: largest |logit| %.3g" % np.abs(z).max())
sys.exit(0 if ok and np.abs(z).max() == 0 else 1)
PYEOF
tb_test_finish test_engine_sparse

#!/usr/bin/env bash
# INT8 ONNX engines through the CLI (docs/ONNX.md, "INT8"):
#   - explicit quantization: a conv net and an MLP with QuantizeLinear /
#     DequantizeLinear around weights and activations (tests/onnx/int8_models.py)
#     run by `turbine exec` on the .onnx and on a built engine, against a
#     float64 numpy evaluation of the same Q/DQ graph; the pass must have
#     folded every Conv / Gemm / MatMul;
#   - calibrated quantization of an f32 conv net (.npy calibration inputs):
#     the report, the engine's outputs within 5% of the f32 numpy result, the
#     calibration cache reused (same outputs, bit for bit), --override;
#   - each refusal with its message: no calibration data, a cache of another
#     model / calibrator / format version, --device cuda;
#   - ResNet-18 and the BERT-style encoder of tests/onnx/make_models.py
#     --small (reused from test_onnx_models.sh when it ran): ResNet-18 top-1
#     agreement with f32 >= 90% on its calibration inputs, the encoder's
#     error reported.
# Skipped (exit 77) without python3-onnx or an ONNX front end.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
if ! /usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null; then
  echo "skip: no python3-onnx"; exit 77
fi
if ! "$TURBINE_BIN" exec --list-ops >/dev/null 2>&1; then
  echo "skip: $TURBINE_BIN exec --list-ops failed (no ONNX front end)"; exit 77
fi
T="$TURBINE_TMP/onnx_int8"
rm -rf "$T"
mkdir -p "$T"
PY="/usr/bin/python3 $TURBINE_SRC/tests/onnx/int8_models.py"
$PY make "$T"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# ---- explicit quantization (Q/DQ)
for m in qdq_conv qdq_mlp; do
  d="$T/$m"
  "$TURBINE_BIN" exec "$d/model.onnx" --inputs "$d/test_data_set_0" --outputs "$d/out_onnx" >/dev/null
  $PY compare "$d/out_onnx/output_0.pb" "$d/test_data_set_0/output_0.pb" 0.005 || bad "$m: exec .onnx"
  "$TURBINE_BIN" build "$d/model.onnx" -o "$d/e.engine" --verbose >"$d/build.txt" 2>&1 || { cat "$d/build.txt"; bad "$m: build"; continue; }
  want=$([ $m = qdq_conv ] && echo 3 || echo 2)
  grep -q "pass quantize-int8 .* $want Conv / Gemm / MatMul with Q/DQ around them quantized" "$d/build.txt" ||
    { grep quantize "$d/build.txt"; bad "$m: expected $want quantized nodes"; }
  "$TURBINE_BIN" inspect "$d/e.engine" >"$d/inspect.txt" 2>&1
  grep -q '"dtype": "i8"' "$d/inspect.txt" || bad "$m: the engine's meta does not say i8"
  grep -q "ops: Q[A-Za-z]* x$want" "$d/inspect.txt" || { grep ops: "$d/inspect.txt"; bad "$m: the engine's ops"; }
  "$TURBINE_BIN" exec "$d/e.engine" --inputs "$d/test_data_set_0" --outputs "$d/out_engine" >/dev/null
  $PY compare "$d/out_engine/output_0.pb" "$d/test_data_set_0/output_0.pb" 0.005 || bad "$m: exec engine"
done

# ---- calibrated
c="$T/convnet"
"$TURBINE_BIN" build "$c/model.onnx" -o "$c/i8.engine" --shapes x:2x3x16x16 --dtype int8 --calib-data "$c/calib" \
  --calib-cache "$c/calib.cache" >"$c/build.txt" 2>&1 || { cat "$c/build.txt"; bad "convnet: build"; }
cat "$c/build.txt"
grep -q "int8: 5 Conv / Gemm / MatMul quantized, 0 left in f32" "$c/build.txt" || bad "convnet: quantized count"
grep -q "top-1 agreement" "$c/build.txt" || bad "convnet: no top-1 agreement reported"
grep -q "^TURBINE-CALIB-CACHE 1 calibrator=percentile=99.99 fingerprint=" "$c/calib.cache" || bad "convnet: cache header"
"$TURBINE_BIN" exec "$c/i8.engine" --inputs "$c/test_data_set_0" --outputs "$c/out1" >/dev/null
$PY compare "$c/out1/output_0.pb" "$c/test_data_set_0/output_0.pb" 0.05 || bad "convnet: int8 outputs"
# the cache alone (no --calib-data): the same engine
"$TURBINE_BIN" build "$c/model.onnx" -o "$c/i8b.engine" --shapes x:2x3x16x16 --dtype int8 \
  --calib-cache "$c/calib.cache" >"$c/build2.txt" 2>&1 || { cat "$c/build2.txt"; bad "convnet: build from cache"; }
grep -q "calibration from the cache" "$c/build2.txt" || bad "convnet: cache not used"
"$TURBINE_BIN" exec "$c/i8b.engine" --inputs "$c/test_data_set_0" --outputs "$c/out2" >/dev/null
cmp -s "$c/out1/output_0.pb" "$c/out2/output_0.pb" || bad "convnet: the cached build computes other outputs"

# --override: the weight w2 kept in f32; everything but the Gemm (output y) kept
"$TURBINE_BIN" build "$c/model.onnx" -o "$c/ov.engine" --shapes x:2x3x16x16 --dtype int8 --calib-data "$c/calib" \
  --override 'w2=f32' >"$c/ov.txt" 2>&1 || bad "convnet: build with --override"
grep -q "int8: 4 Conv / Gemm / MatMul quantized, 1 left in f32" "$c/ov.txt" || bad "convnet: --override w2=f32"
"$TURBINE_BIN" build "$c/model.onnx" -o "$c/ov.engine" --shapes x:2x3x16x16 --dtype int8 --calib-data "$c/calib" \
  --override '*=f32' --override 'y=int8' >"$c/ov.txt" 2>&1 || bad "convnet: build with --override"
grep -q "int8: 1 Conv / Gemm / MatMul quantized, 4 left in f32" "$c/ov.txt" || bad "convnet: --override *=f32 y=int8"

# ---- refusals
refused() { # NAME PATTERN COMMAND...
  local name=$1 pat=$2; shift 2
  if "$@" >"$T/refusal.txt" 2>&1; then bad "$name: not refused"; return; fi
  grep -q -- "$pat" "$T/refusal.txt" || { cat "$T/refusal.txt"; bad "$name: message lacks '$pat'"; }
}
refused "no calibration data" "needs calibration data: --calib-data DIR" \
  "$TURBINE_BIN" build "$c/model.onnx" -o "$T/x.engine" --shapes x:2x3x16x16 --dtype int8
refused "cache of another model" "is for another model" \
  "$TURBINE_BIN" build "$c/model_b.onnx" -o "$T/x.engine" --shapes x:2x3x16x16 --dtype int8 --calib-cache "$c/calib.cache"
refused "cache of another calibrator" "was made by calibrator percentile=99.99" \
  "$TURBINE_BIN" build "$c/model.onnx" -o "$T/x.engine" --shapes x:2x3x16x16 --dtype int8 --calib-cache "$c/calib.cache" \
  --calibrator minmax
sed '1s/^TURBINE-CALIB-CACHE 1 /TURBINE-CALIB-CACHE 99 /' "$c/calib.cache" >"$T/v99.cache"
refused "cache of another version" "has format version 99" \
  "$TURBINE_BIN" build "$c/model.onnx" -o "$T/x.engine" --shapes x:2x3x16x16 --dtype int8 --calib-cache "$T/v99.cache"
refused "cuda" "run on the CPU only" \
  "$TURBINE_BIN" build "$c/model.onnx" -o "$T/x.engine" --shapes x:2x3x16x16 --dtype int8 --calib-data "$c/calib" \
  --device cuda
[ ! -e "$T/x.engine" ] || bad "a refused build wrote an engine"

# ---- ResNet-18 and the encoder (small exports)
M="$TURBINE_TMP/onnx_models"
if [ ! -f "$M/resnet18_opset13/model.onnx" ] || [ ! -f "$M/bert_opset13/model.onnx" ]; then
  if /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
    M="$TURBINE_TMP/onnx_int8_models"
    [ -f "$M/resnet18_opset13/model.onnx" ] ||
      /usr/bin/python3 "$TURBINE_SRC/tests/onnx/make_models.py" "$M" --small --models resnet18,bert --opsets 13 >/dev/null
  else
    echo "no python3-torch: ResNet-18 and the encoder not checked"; M=""
  fi
fi
if [ -n "$M" ]; then
  r="$M/resnet18_opset13"
  $PY npy "$T/rcal" input_0 6 4x3x64x64 normal
  "$TURBINE_BIN" build "$r/model.onnx" -o "$T/r18.engine" --shapes input:4x3x64x64 --dtype int8 --calib-data "$T/rcal" \
    >"$T/r18.txt" 2>&1 || { cat "$T/r18.txt"; bad "resnet18: build"; }
  cat "$T/r18.txt"
  agree=$(sed -n 's/.*top-1 agreement \([0-9.]*\)%.*/\1/p' "$T/r18.txt" | head -1)
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('${agree:-0}') >= 90 else 1)" ||
    bad "resnet18: top-1 agreement ${agree:-none}% < 90%"
  b="$M/bert_opset13"
  $PY npy "$T/bcal" input_ids 4 2x16 ids:1000
  $PY npy "$T/bcal" attention_mask 4 2x16 ones
  "$TURBINE_BIN" build "$b/model.onnx" -o "$T/bert.engine" --shapes input_ids:2x16,attention_mask:2x16 --dtype int8 \
    --calib-data "$T/bcal" >"$T/bert.txt" 2>&1 || { cat "$T/bert.txt"; bad "bert: build"; }
  cat "$T/bert.txt"
  grep -q "last_hidden_state *max abs err" "$T/bert.txt" || bad "bert: no error reported"
  grep -q "int8: [1-9][0-9]* Conv / Gemm / MatMul quantized" "$T/bert.txt" || bad "bert: nothing quantized"
fi
[ $fail = 0 ] && echo "test_onnx_int8_cli: all passed"
exit $fail

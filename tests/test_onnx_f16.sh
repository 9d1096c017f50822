#!/usr/bin/env bash
# f16 ONNX engines against PyTorch: the small BERT-style encoder and
# ResNet-18 of tests/onnx/make_models.py --small, built with --dtype f16 and
# one profile per data set (--profile, fixed shapes), run by `turbine exec`
# on the CPU (f16 ops run the reference kernels there) on both data sets;
# every output within f16 tolerance of PyTorch's f32 output (|d| <= 2e-2 |ref|
# + 2e-2 max |ref|) with the same arg-max per row, and the build's accuracy
# report printed. Models: $TURBINE_ONNX_MODELS (a make_models.py --small
# folder), else made with tests/onnx/make_models.py when it and its Python
# packages are there; skipped (77) otherwise.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
PY=/usr/bin/python3
D="$TURBINE_TMP/onnx_f16"
rm -rf "$D"
mkdir -p "$D"
"$PY" -c 'import onnx, numpy' 2>/dev/null || { echo "skip: python3-onnx / numpy missing"; exit 77; }
M="${TURBINE_ONNX_MODELS:-}"
if [ -z "$M" ]; then
  MAKE="$TURBINE_SRC/tests/onnx/make_models.py"
  [ -f "$MAKE" ] || { echo "skip: no TURBINE_ONNX_MODELS and no tests/onnx/make_models.py"; exit 77; }
  "$PY" -c 'import torch, torchvision' 2>/dev/null || { echo "skip: python3-torch / torchvision missing"; exit 77; }
  M="$D/models"
  "$PY" "$MAKE" "$M" --small --models resnet18,bert --opsets 17 >"$D/make.log" 2>&1 ||
    { cat "$D/make.log"; echo "FAIL: make_models.py"; exit 1; }
fi
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# the --profile value of a data set: every input at its own (fixed) shape
profile_of() {
  "$PY" - "$1" "$2" <<'EOF'
import sys, onnx
m = onnx.load(sys.argv[1] + "/model.onnx", load_external_data=False)
inits = {t.name for t in m.graph.initializer}
names = [i.name for i in m.graph.input if i.name not in inits]
parts = []
for k, n in enumerate(names):
    t = onnx.load_tensor(f"{sys.argv[1]}/{sys.argv[2]}/input_{k}.pb")
    parts.append(n + ":" + "x".join(str(d) for d in t.dims))
print(",".join(parts))
EOF
}

compare() { # REF_DIR OUT_DIR
  "$PY" - "$1" "$2" <<'EOF'
import os, sys, onnx, numpy as np
from onnx import numpy_helper
ref, got = sys.argv[1], sys.argv[2]
ok, k = True, 0
while os.path.exists(f"{ref}/output_{k}.pb"):
    a = numpy_helper.to_array(onnx.load_tensor(f"{ref}/output_{k}.pb")).astype(np.float64)
    b = numpy_helper.to_array(onnx.load_tensor(f"{got}/output_{k}.pb")).astype(np.float64)
    scale = float(np.abs(a).max()) or 1.0
    err = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
    good = a.shape == b.shape and np.allclose(b, a, rtol=2e-2, atol=2e-2 * scale)
    if good and a.ndim > 1 and a.shape[-1] > 1:
        good = bool((a.argmax(-1) == b.argmax(-1)).all())
    print(f"  output_{k} {a.shape}: max abs err {err:.3g} (values up to {scale:.3g}) {'ok' if good else 'BAD'}")
    ok &= good
    k += 1
sys.exit(0 if ok and k > 0 else 1)
EOF
}

for name in bert_opset17 resnet18_opset17; do
  dir="$M/$name"
  [ -f "$dir/model.onnx" ] || { fail "$name: $dir/model.onnx missing"; continue; }
  p0=$(profile_of "$dir" test_data_set_0) && p1=$(profile_of "$dir" test_data_set_1) || { fail "$name: data sets"; continue; }
  eng="$D/$name.f16.engine"
  if ! "$TURBINE_BIN" build "$dir/model.onnx" -o "$eng" --dtype f16 --profile "$p0" --profile "$p1" \
      --calib-data "$dir" >"$D/$name.build.log" 2>&1; then
    cat "$D/$name.build.log"; fail "$name: build"; continue
  fi
  grep -q "f16 on .* against f32" "$D/$name.build.log" && grep -q "top-1 agreement" "$D/$name.build.log" ||
    { cat "$D/$name.build.log"; fail "$name: no accuracy report"; }
  grep "max abs err" "$D/$name.build.log"
  for ds in test_data_set_0 test_data_set_1; do
    out="$D/$name.$ds"
    if ! "$TURBINE_BIN" exec "$eng" --inputs "$dir/$ds" --outputs "$out" >"$out.log" 2>&1; then
      cat "$out.log"; fail "$name $ds: exec"; continue
    fi
    echo "$name $ds (f16 engine vs PyTorch):"
    compare "$dir/$ds" "$out" || fail "$name $ds: outside f16 tolerance"
  done
done
[ "$fails" -eq 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }

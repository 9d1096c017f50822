#!/usr/bin/env bash
# ResNet-18, a BERT-style encoder and a GPT-2-style decoder exported from PyTorch
# (small configurations, opsets 13 and 17, tests/onnx/make_models.py) through
# `turbine exec` on the .onnx and through `turbine build` + `turbine exec` on
# the engine, against PyTorch's outputs (rtol 1e-3, atol 1e-4). Models with an
# op type turbine does not list are skipped by name. Skipped (exit 77) without
# python3-onnx / python3-torchvision, an ONNX front end, or any model to run.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
if ! /usr/bin/python3 -c 'import onnx, torch, torchvision' 2>/dev/null; then
  echo "skip: no python3-onnx / python3-torch / python3-torchvision"; exit 77
fi
if ! "$TURBINE_BIN" exec --list-ops >/dev/null 2>&1; then
  echo "skip: $TURBINE_BIN exec --list-ops failed (no ONNX front end)"; exit 77
fi
D="$TURBINE_TMP/onnx_models"
# exported again only when make_models.py changed
if [ ! -f "$D/manifest.json" ] || [ "$TURBINE_SRC/tests/onnx/make_models.py" -nt "$D/manifest.json" ]; then
  rm -rf "$D"
  /usr/bin/python3 "$TURBINE_SRC/tests/onnx/make_models.py" "$D" --small
fi
exec /usr/bin/python3 "$TURBINE_SRC/tests/onnx/run_models.py" --turbine "$TURBINE_BIN" --dir "$D" \
  --mode both --only-supported

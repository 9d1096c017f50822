#!/usr/bin/env bash
# turbine serve over KServe v2: a small ONNX MLP built into an engine and
# served on a loopback port; every v2 endpoint and error through
# http.client and curl, JSON and binary tensors, outputs against numpy and
# `turbine exec`, the per-model metrics; an LLM engine on both APIs.
# Skipped (77) without Debian's python3-onnx and numpy.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || { echo "skip: python3-onnx / numpy missing"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl missing"; exit 77; }
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/v2_test.py"

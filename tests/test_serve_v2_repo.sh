#!/usr/bin/env bash
# turbine serve --model-repository: two good models (an engine and an ONNX
# model built at load) and a broken one; the index, both good ones
# answering, unload/load while requests run. Skipped (77) without Debian's
# python3-onnx and numpy.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || { echo "skip: python3-onnx / numpy missing"; exit 77; }
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/v2_repo_test.py"

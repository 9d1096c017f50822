#!/usr/bin/env bash
# turbine serve's dynamic batcher over KServe v2: batched answers equal
# unbatched ones, batch sizes above 1 and a preferred size in the
# turbine_inference_batch_size histogram, 429 on a full queue, 504 past a
# request's timeout. Skipped (77) without Debian's python3-onnx and numpy.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || { echo "skip: python3-onnx / numpy missing"; exit 77; }
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/v2_batching_test.py"

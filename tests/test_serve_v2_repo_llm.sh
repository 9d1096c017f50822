#!/usr/bin/env bash
# turbine serve --model-repository with an LLM engine beside an ONNX-built
# one: both listed and ready, v2 infer on both (the LLM through text_input /
# text_output BYTES, JSON and binary), the LLM's OpenAI API by its name
# equal to the greedy text of a plain `turbine serve ENGINE` and of the
# stories260K reference, a broken LLM reported while the others serve, and
# an unload/load of the LLM while the ONNX model keeps answering. Skipped
# (77) without Debian's python3-onnx and numpy.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || { echo "skip: python3-onnx / numpy missing"; exit 77; }
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/v2_repo_llm_test.py"

#!/usr/bin/env bash
# turbine serve: bad input gets OpenAI-style errors (400, 401, 404, 413, 429) and the server keeps serving.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/errors_test.py"

#!/usr/bin/env bash
# turbine serve: batching (see tests/serve/batching_test.py).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/batching_test.py" batching

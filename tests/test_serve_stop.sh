#!/usr/bin/env bash
# turbine serve: stop strings across token boundaries, streaming and not.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/stop_test.py"

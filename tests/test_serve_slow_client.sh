#!/usr/bin/env bash
# turbine serve: stalled clients hold no engine slot and are dropped after --timeout.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/slow_client_test.py"

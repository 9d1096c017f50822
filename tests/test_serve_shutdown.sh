#!/usr/bin/env bash
# turbine serve: graceful shutdown: SIGTERM drains accepted requests, refuses new ones, exits 0.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/shutdown_test.py"

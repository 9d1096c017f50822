#!/usr/bin/env bash
# turbine serve: GET /metrics passes promtool check metrics and counts the requests.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/metrics_test.py"

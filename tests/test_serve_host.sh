#!/usr/bin/env bash
# turbine serve: --host takes names (localhost) and IPv6 addresses (::1, ::).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/host_test.py"

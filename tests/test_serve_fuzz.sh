#!/usr/bin/env bash
# turbine serve: 500 random malformed requests (fixed seed) get well-formed replies and never stop the server.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/fuzz_test.py"

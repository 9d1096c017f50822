#!/usr/bin/env bash
# turbine serve: a client that half-closes (shutdown(SHUT_WR)) after its request still gets the whole reply.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/halfclose_test.py"

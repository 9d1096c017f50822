#!/usr/bin/env bash
# turbine serve: a client that disconnects is cancelled and frees its slot and KV blocks.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/cancel_test.py"

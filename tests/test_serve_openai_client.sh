#!/usr/bin/env bash
# turbine serve: the official openai npm client (needs `npm ci` in tests/serve).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/openai_test.py"

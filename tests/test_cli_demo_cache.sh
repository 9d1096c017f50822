#!/usr/bin/env bash
# turbine serve with no engine: the cached demo engine is keyed by the demo's
# files and the engine format, and checked by its own hash (see the script).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/demo_cache_test.py"

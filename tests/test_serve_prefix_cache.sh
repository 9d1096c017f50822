#!/usr/bin/env bash
# turbine serve: prompts that begin alike reuse cached KV blocks, with the same text as without.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/prefix_cache_test.py"

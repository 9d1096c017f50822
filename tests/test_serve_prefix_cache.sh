#!/usr/bin/env bash
# turbine serve: prompts that begin alike reuse cached KV blocks, with the same text as without;
# then the same with an int8 KV cache (its blocks carry their scales, so sharing them is the same).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
/usr/bin/python3 "$TURBINE_SRC/tests/serve/prefix_cache_test.py"
echo "--- with --kv-dtype int8"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/prefix_cache_test.py" int8

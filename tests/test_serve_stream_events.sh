#!/usr/bin/env bash
# turbine serve: one SSE event per generated token (each with its own
# log-probabilities); --stream-interval N merges N tokens per event.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/stream_events_test.py"

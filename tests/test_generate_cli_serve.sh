#!/usr/bin/env bash
# One generation loop: `turbine run` and `turbine serve` give the same text
# for the same prompt, greedy or seeded, with and without stop strings.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/cli_serve_same_test.py"

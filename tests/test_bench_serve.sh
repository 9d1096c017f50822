#!/usr/bin/env bash
# `turbine bench` against a real `turbine serve` of the bundled demo model:
# default lengths fitted to max_model_len, explicit ones warned about with the
# server's message and exit 1, and sweep points that never reuse an earlier
# point's prompts (~0% prefix-cache reuse). See tests/bench/serve_bench_test.py.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/bench/serve_bench_test.py"

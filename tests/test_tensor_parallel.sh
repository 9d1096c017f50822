#!/usr/bin/env bash
# Tensor parallelism on the CPU: tp 2 / 4 engines against tp 1 (logits,
# greedy text, serve, bench --engine) and the refusals.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/tensor_parallel_test.py"

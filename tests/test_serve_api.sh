#!/usr/bin/env bash
# turbine serve: the OpenAI wire format (completions, chat, streaming, usage,
# token-id prompts, /v1/models, /health, /tokenize, /detokenize, logprobs).
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
exec /usr/bin/python3 "$TURBINE_SRC/tests/serve/api_test.py"

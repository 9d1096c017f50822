#!/usr/bin/env bash
# quickstart.sh — sets up, builds an engine from the stories260K model and
# streams a story from it; then starts the server on the bundled Shakespeare
# demo model and streams a completion through its OpenAI-compatible API.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SHARED="${TURBINE_SHARED:-../shared}"
MODEL="$SHARED/models/stories260K"
mkdir -p build/engines

echo "== turbine build + run (stories260K)"
./build/turbine build "$MODEL/stories260K.bin" --tokenizer "$MODEL/tok512.bin" -o build/engines/stories260K.engine
./build/turbine run build/engines/stories260K.engine -p "Once upon a time" -n 256 --temperature 0.8 --seed 42

echo "== turbine serve (bundled Shakespeare demo model), streaming /v1/completions"
PORT="${TURBINE_PORT:-8000}"
./build/turbine serve --port "$PORT" 2>build/serve.log &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "ROMEO:", "max_tokens": 120, "temperature": 0.8, "seed": 7, "stream": true}' |
  /usr/bin/python3 -c '
import json, sys
print("ROMEO:", end="", flush=True)
for line in sys.stdin:
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        print(json.loads(line[6:])["choices"][0]["text"], end="", flush=True)
print()'

#!/usr/bin/env bash
# quickstart.sh — sets up, builds an engine from the stories260K model and
# streams a story from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SHARED="${TURBINE_SHARED:-../shared}"
MODEL="$SHARED/models/stories260K"
mkdir -p build/engines
./build/turbine build "$MODEL/stories260K.bin" --tokenizer "$MODEL/tok512.bin" -o build/engines/stories260K.engine
./build/turbine run build/engines/stories260K.engine -p "Once upon a time" -n 256 --temperature 0.8 --seed 42

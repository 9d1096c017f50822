#!/usr/bin/env bash
# test.sh — sets up (packages, build, test references) and runs the whole
# test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
TURBINE_TEST_DEPS=1 bash scripts/setup.sh
export TURBINE_SHARED="${TURBINE_SHARED:-$(cd .. && pwd)/shared}"
# the JavaScript references and clients the tests use, and the ONNX Runtime peer of
# bench/onnx (pinned by package-lock.json; bench/onnx/.npmrc skips install scripts)
for d in tests/*/ bench/onnx/; do
  if [ -f "$d/package-lock.json" ]; then
    (cd "$d" && { npm ci --no-audit --no-fund --silent 2>/dev/null || npm install --no-audit --no-fund --silent; })
  fi
done
cd build
ctest --output-on-failure -j1

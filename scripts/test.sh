#!/usr/bin/env bash
# test.sh — sets up (packages, build, test references) and runs the whole
# test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
TURBINE_TEST_DEPS=1 bash scripts/setup.sh
export TURBINE_SHARED="${TURBINE_SHARED:-$(cd .. && pwd)/shared}"
# the JavaScript references and clients the tests use (pinned by package-lock.json)
for d in tests/*/; do
  if [ -f "$d/package-lock.json" ]; then
    (cd "$d" && { npm ci --no-audit --no-fund --silent 2>/dev/null || npm install --no-audit --no-fund --silent; })
  fi
done
cd build
ctest --output-on-failure -j1

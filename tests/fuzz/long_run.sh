#!/usr/bin/env bash
# long_run.sh [FUZZ_BUILD_DIR] — the long fuzzing run recorded in
# docs/TESTING.md ("Fuzzing"): each harness in turn for 10 million
# executions (FUZZ_RUNS) in one worker process, so that other work on the
# machine keeps a core. Build first (cmake --build build; the harnesses land
# in build/fuzz). FUZZ_MAX_SECONDS bounds each harness's time when set;
# FUZZ_DEADLINE (seconds since the epoch) shares the time left among the
# harnesses still to run; FUZZ_ONLY="NAME ..." runs those, in that order.
# The table of executions, time, exec/s, corpus, coverage and crashes is
# printed at the end and kept in WORK/results.md (WORK: $FUZZ_WORK,
# default build/fuzz/fuzz_long).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin_dir=${1:-$here/../../build/fuzz}
bin_dir=$(cd "$bin_dir" && pwd)
export TURBINE_BIN=${TURBINE_BIN:-$bin_dir/../turbine}
echo "long fuzzing run: $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
TURBINE_TMP= exec bash "$here/run.sh" long "$bin_dir"

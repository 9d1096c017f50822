#!/usr/bin/env bash
# run.sh short|long FUZZ_BUILD_DIR — runs every libFuzzer harness built in
# FUZZ_BUILD_DIR (tests/fuzz/CMakeLists.txt; the top level builds it into
# build/fuzz), one after the other, on seeds made by make_seeds.py.
#
#   short (ctest's test_fuzz_short): first replays every input kept in
#         tests/fuzz/regress/HARNESS/ (inputs that once crashed a parser),
#         then fuzzes each harness for FUZZ_SECONDS (default: 110 s shared
#         among the harnesses, at least 8 s each).
#   long  (long_run.sh): FUZZ_RUNS executions per harness (default 10
#         million; FUZZ_MAX_SECONDS, when set, bounds each harness's time;
#         FUZZ_DEADLINE, a time in seconds since the epoch, shares the time
#         left among the harnesses not yet run, so that one that reaches
#         FUZZ_RUNS early leaves its time to the next), in one worker
#         process (-jobs=1; FUZZ_JOBS=N shares FUZZ_RUNS among N worker
#         processes on one corpus, for a many-core machine), and a table
#         of what each did (executions summed over the workers).
#   FUZZ_SEEDS=DIR uses seeds made earlier by make_seeds.py (a machine
#         without the turbine binary or python3) instead of making them.
#
# Limits: 2 GiB of RSS (-rss_limit_mb=2048), 10 s per input (-timeout=10).
# Any crash, sanitizer report, leak, out-of-memory or timeout fails the
# run; libFuzzer writes the input to WORK/artifacts/ and the message says
# how to replay it. FUZZ_ONLY="NAME ..." runs those harnesses, in that order.
set -uo pipefail
mode=${1:?usage: run.sh short|long FUZZ_BUILD_DIR}
bin_dir=${2:?usage: run.sh short|long FUZZ_BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export TURBINE_SRC=${TURBINE_SRC:-$(cd "$here/../.." && pwd)}
export TURBINE_SHARED=${TURBINE_SHARED:-$(cd "$TURBINE_SRC/.." && pwd)/shared}
tmp=${TURBINE_TMP:-$bin_dir}
work=${FUZZ_WORK:-$tmp/fuzz_$mode}
rm -rf "$work" && mkdir -p "$work/artifacts" "$work/corpus" "$work/logs"

harnesses=()
if [ -n "${FUZZ_ONLY:-}" ]; then
  for n in $FUZZ_ONLY; do [ -x "$bin_dir/$n" ] && harnesses+=("$n") || echo "no harness $bin_dir/$n"; done
else
  for b in "$bin_dir"/fuzz_*; do
    [ -f "$b" ] && [ -x "$b" ] && harnesses+=("$(basename "$b")")
  done
fi
if [ ${#harnesses[@]} = 0 ]; then echo "FAIL: no harnesses in $bin_dir"; exit 1; fi
if [ -n "${FUZZ_SEEDS:-}" ]; then
  # seeds made earlier (make_seeds.py needs the turbine binary and python3): copied, not regenerated
  cp -r "$FUZZ_SEEDS" "$work/seeds" || { echo "FAIL: seeds: cannot copy $FUZZ_SEEDS"; exit 1; }
else
  python3 "$here/make_seeds.py" "$work/seeds" >"$work/logs/seeds.log" 2>&1 || { cat "$work/logs/seeds.log"; echo "FAIL: seeds"; exit 1; }
fi

# ASan/UBSan options: every report is fatal, leaks are checked at exit of each input
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
common=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=1)

per=${FUZZ_SECONDS:-$(( 110 / ${#harnesses[@]} ))}
[ "$per" -ge 8 ] || per=8
fails=0
results="$work/results.md"
printf '| harness | executions | time (s) | exec/s | corpus | cov | ft | crashes |\n|---|---|---|---|---|---|---|---|\n' >"$results"
left=${#harnesses[@]}
for n in "${harnesses[@]}"; do
  max_s=${FUZZ_MAX_SECONDS:-}
  if [ -n "${FUZZ_DEADLINE:-}" ]; then
    max_s=$(( (FUZZ_DEADLINE - $(date +%s)) / left ))
    [ "$max_s" -ge 10 ] || max_s=10
  fi
  left=$((left - 1))
  b="$bin_dir/$n"
  seeds="$work/seeds/$n"; mkdir -p "$seeds"
  corpus="$work/corpus/$n"; mkdir -p "$corpus"
  log="$work/logs/$n.log"
  if [ "$mode" = short ] && [ -d "$here/regress/$n" ] && ls "$here/regress/$n"/* >/dev/null 2>&1; then
    if ! "$b" "${common[@]}" "$here/regress/$n"/* >"$work/logs/$n.regress.log" 2>&1; then
      echo "FAIL: $n: an input of tests/fuzz/regress/$n crashes it again:"
      grep -m1 -B2 -A20 -E "ERROR:|runtime error|fuzz expectation" "$work/logs/$n.regress.log" | head -40
      fails=$((fails + 1)); continue
    fi
  fi
  t0=$(date +%s)
  if [ "$mode" = short ]; then
    "$b" "${common[@]}" -max_total_time="$per" -artifact_prefix="$work/artifacts/$n-" "$corpus" "$seeds" >"$log" 2>&1
    rc=$?
  else
    # FUZZ_JOBS worker processes (default 1, so that other work keeps a
    # core), each running its share of FUZZ_RUNS on the one shared corpus
    # folder (libFuzzer reloads what the others add); job J's output is
    # fuzz-J.log of the current folder. The executions are summed.
    jobs=${FUZZ_JOBS:-1}
    runs=${FUZZ_RUNS:-10000000}
    per_job=$(( (runs + jobs - 1) / jobs ))
    ( cd "$work/logs" && mkdir -p "$n.job" && cd "$n.job" &&
      "$b" "${common[@]}" -runs="$per_job" ${max_s:+-max_total_time=$max_s} \
        -jobs="$jobs" -workers="$jobs" -artifact_prefix="$work/artifacts/$n-" "$corpus" "$seeds" >"$log.outer" 2>&1 )
    rc=$?
    cat "$work/logs/$n.job"/fuzz-*.log >"$log" 2>/dev/null
    for j in $(seq 0 $((jobs - 1))); do
      grep -q "Job $j exited with exit code 0" "$log.outer" || rc=${rc/#0/1}
    done
  fi
  secs=$(( $(date +%s) - t0 ))
  # one final stats block per worker process: executions and rates add up
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | awk '{s += $1} END {if (NR) print s}')
  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | awk '{s += $1} END {if (NR) print s}')
  ncorp=$(ls "$corpus" | wc -l)
  ncrash=$(ls "$work/artifacts" | grep -c "^$n-")
  # coverage: the last status line's cov (edges) and ft (features)
  cov=$(grep -o 'cov: [0-9]*' "$log" | grep -o '[0-9]*$' | sort -n | tail -1)
  ft=$(grep -o 'ft: [0-9]*' "$log" | grep -o '[0-9]*$' | sort -n | tail -1)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${execs:-?}" "$secs" "${eps:-?}" "$ncorp" "${cov:-?}" \
    "${ft:-?}" "$ncrash" >>"$results"
  if [ "$rc" != 0 ] || [ "$ncrash" != 0 ]; then
    echo "FAIL: $n (exit $rc after ${secs} s); its report:"
    grep -m1 -B2 -A25 -E "ERROR:|runtime error|fuzz expectation|assertion failed|deadly signal" "$log" | head -45
    for a in "$work/artifacts/$n"-*; do
      [ -e "$a" ] && echo "  input: $a (replay: $b $a; keep it as tests/fuzz/regress/$n/NAME once fixed)"
    done
    fails=$((fails + 1))
  else
    echo "ok: $n: ${execs:-?} executions in ${secs} s (${eps:-?}/s), corpus $ncorp"
  fi
done
cat "$results"
[ "$fails" = 0 ] && echo "ok: ${#harnesses[@]} harnesses, no crash, leak or timeout" || echo "FAIL: $fails of ${#harnesses[@]} harnesses"
[ "$fails" = 0 ]

#!/usr/bin/env bash
# The whole suite again, built with AddressSanitizer + UndefinedBehaviorSanitizer
# (CPU backend; -DTB_CUDA=OFF): every C test, CLI run and server the tests
# start runs instrumented, and any report (invalid access, leak, undefined
# behaviour) fails this test — also one printed only into a server's log.
set -uo pipefail
: "${TURBINE_SRC:?}" "${TURBINE_TMP:?}" "${TURBINE_SHARED:?}"
B="$TURBINE_TMP/sanitized"
mkdir -p "$B"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# LeakSanitizer needs ptrace-like access some sandboxes refuse: then leaks are not checked (said below)
printf '#include <stdlib.h>\nint main(void){void *p = malloc(7); p = 0; return p != 0;}\n' >"$B/lsan_probe.c"
if gcc -fsanitize=address "$B/lsan_probe.c" -o "$B/lsan_probe" 2>/dev/null; then
  out=$("$B/lsan_probe" 2>&1)
  if ! grep -q "detected memory leaks" <<<"$out"; then
    echo "note: LeakSanitizer cannot run here ($(head -c 200 <<<"$out")); leaks are not checked"
    export ASAN_OPTIONS="detect_leaks=0"
  fi
else
  echo "FAIL: gcc cannot build with -fsanitize=address"; exit 1
fi
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S "$TURBINE_SRC" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTB_CUDA=OFF -DTB_FUZZ=OFF -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >"$B/configure.log" 2>&1 || { tail -20 "$B/configure.log"; echo "FAIL: configure"; exit 1; }
cmake --build "$B" -j"$(nproc)" >"$B/build.log" 2>&1 || { grep -E "error" "$B/build.log" | head -20; echo "FAIL: build"; exit 1; }
rm -rf "$B/testtmp" && mkdir -p "$B/testtmp"
(cd "$B" && ctest -j1 -E '^test_sanitizers$' --output-on-failure >"$B/ctest.log" 2>&1); rc=$?
grep -E "tests passed|tests failed" "$B/ctest.log"
reports=$(grep -rlE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$B/testtmp" "$B/ctest.log" 2>/dev/null)
fails=0
if [ "$rc" != 0 ]; then
  echo "FAIL: the sanitized suite failed:"; grep -E "\(Failed\)|\(Timeout\)|\*\*\*" "$B/ctest.log" | head -20; fails=1
fi
if [ -n "$reports" ]; then
  echo "sanitizer reports in $(wc -l <<<"$reports") files; the first ones:"
  for f in $(head -n 4 <<<"$reports"); do
    echo "FAIL: sanitizer report in $f:"
    grep -m1 -A12 -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$f"
  done
  fails=1
fi
[ "$fails" = 0 ] && echo "ok: the whole suite runs clean under AddressSanitizer and UndefinedBehaviorSanitizer"
exit "$fails"

#!/usr/bin/env bash
# Every subcommand takes --help and -h, anywhere among its options: its usage
# on stdout (starting "usage: turbine CMD"), nothing on stderr, exit 0; so
# does `turbine help CMD`. Usage errors exit 2, runtime errors 1, and the
# help says so.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/cli_help"
mkdir -p "$D"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# check_help CMD ARGS...: `turbine ARGS` prints CMD's usage on stdout only and exits 0
check_help() {
  local cmd=$1; shift
  "$TURBINE_BIN" "$@" >"$D/out" 2>"$D/err"; local rc=$?
  if [ "$rc" != 0 ]; then fail "'turbine $*' exited $rc: $(head -c 300 "$D/err")"; return; fi
  [ -s "$D/err" ] && { fail "'turbine $*' wrote on stderr: $(head -c 300 "$D/err")"; return; }
  grep -q "^usage: turbine $cmd" "$D/out" || { fail "'turbine $*' printed no 'usage: turbine $cmd': $(head -c 300 "$D/out")"; return; }
  ok "turbine $*"
}

for c in build run inspect serve bench perplexity; do
  check_help "$c" "$c" --help
  check_help "$c" "$c" -h
  check_help "$c" help "$c"
done
# after other arguments too (inspect used to open a file named --help)
check_help run run some.engine -p hi --help
check_help inspect inspect some.engine --help
check_help serve serve --port 9 -h
check_help perplexity perplexity x.engine --ctx 16 --help

# the table commands state the exit codes and their defaults
for c in build run inspect serve perplexity; do
  "$TURBINE_BIN" "$c" --help | grep -q "exit status: 0 ok, 1 runtime or input error, 2 usage error" \
    || fail "$c --help does not state the exit codes"
done
"$TURBINE_BIN" run --help | grep -q "without --seed" || fail "run --help does not say what happens without --seed"
"$TURBINE_BIN" build --help >"$D/build_help.txt" 2>&1; grep -q "default f32" "$D/build_help.txt" || fail "build --help does not give the default dtype"
"$TURBINE_BIN" --help >/dev/null || fail "turbine --help exited $?"

# exit codes: a usage error is 2, a runtime error 1
"$TURBINE_BIN" run >/dev/null 2>&1; [ $? = 2 ] || fail "run with no engine: not 2"
"$TURBINE_BIN" inspect a b >/dev/null 2>&1; [ $? = 2 ] || fail "inspect with two files: not 2"
"$TURBINE_BIN" build >/dev/null 2>&1; [ $? = 2 ] || fail "build with nothing: not 2"
"$TURBINE_BIN" serve --bogus >/dev/null 2>&1; [ $? = 2 ] || fail "serve --bogus: not 2"
"$TURBINE_BIN" inspect "$D/no-such.engine" >/dev/null 2>&1; [ $? = 1 ] || fail "inspect of a missing file: not 1"
"$TURBINE_BIN" nosuchcommand >/dev/null 2>&1; [ $? = 2 ] || fail "an unknown command: not 2"

[ "$fails" = 0 ] && echo "PASS" || { echo "$fails failure(s)"; exit 1; }

#!/usr/bin/env bash
# Option values as the docs promise them: range errors name the limit, sizes
# take K..T with KiB..TiB (binary) and refuse overflow, --stop takes several
# values (and --stop=-x one that starts with '-'), --name=value works for
# long options, --engine FILE is the positional engine in run, inspect,
# perplexity and serve, and --host takes names and IPv6 addresses.
# `turbine help --parse CMD ARGS` runs CMD's own parser and prints the result.
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}"
M="$TURBINE_SHARED/models/stories260K"
D="$TURBINE_TMP/cli_args"
mkdir -p "$D"
# a serve the parser wrongly let through must not touch the user's demo cache
export XDG_CACHE_HOME="$D/cache"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# expect_err CODE TEXT -- ARGS...: `turbine ARGS` exits CODE with TEXT (fixed string) on stderr
expect_err() {
  local code=$1 text=$2; shift 3
  local err; err=$(timeout 20 "$TURBINE_BIN" "$@" 2>&1 >/dev/null); local rc=$?
  if [ "$rc" = "$code" ] && grep -qF -- "$text" <<<"$err"; then ok "$text"
  else fail "'turbine $*' exited $rc (want $code), stderr: $err (want '$text')"; fi
}
# parsed CMD WANT -- ARGS...: `help --parse CMD ARGS` succeeds and prints the line WANT
parsed() {
  local cmd=$1 want=$2; shift 3
  local out; out=$("$TURBINE_BIN" help --parse "$cmd" "$@" 2>&1); local rc=$?
  if [ "$rc" = 0 ] && grep -qxF -- "$want" <<<"$out"; then ok "$cmd $* -> $want"
  else fail "'$cmd $*': exit $rc, want line '$want' in: $out"; fi
}

# 1. range errors name the limit, from the real commands
expect_err 2 "--max-seq-len must be between 1 and 1048576, got 100000000" -- build m -o x.engine --max-seq-len 100000000
expect_err 2 "--max-batch must be between 1 and 1024, got 0" -- build m -o x.engine --max-batch 0
expect_err 2 "--port must be between 1 and 65535, got 70000" -- serve --port 70000
expect_err 2 "--top-p must be in (0, 1], got 1.5" -- run e.engine -p x --top-p 1.5
expect_err 2 "--temperature must be at least 0, got -1" -- run e.engine -p x --temperature -1
expect_err 2 "--threads needs an integer, got 'two'" -- run e.engine -p x --threads two
expect_err 2 "--ctx must be between 2 and 1048576, got 1" -- perplexity e.engine --ids 1,2 --ctx 1

# 2. sizes: K/M/G/T, KB/KiB..TB/TiB, any case, all binary; overflow refused
parsed serve "--kv-cache-mem=2199023255552" -- --kv-cache-mem 2T
parsed serve "--kv-cache-mem=2199023255552" -- --kv-cache-mem 2TiB
parsed serve "--kv-cache-mem=1099511627776" -- --kv-cache-mem 1tb
parsed serve "--kv-cache-mem=536870912" -- --kv-cache-mem 512MiB
parsed serve "--kv-cache-mem=3221225472" -- --kv-cache-mem 3GB
parsed serve "--kv-cache-mem=1536" -- --kv-cache-mem 1.5K
parsed serve "--kv-cache-mem=1000" -- --kv-cache-mem 1000
parsed serve "--max-body=65536" -- --max-body 64KiB
expect_err 2 "--kv-cache-mem must be between 1 and 1024TiB, got 99999999999T" -- serve --kv-cache-mem 99999999999T
expect_err 2 "--kv-cache-mem must be between 1 and 1024TiB, got 1e30" -- serve --kv-cache-mem 1e30
expect_err 2 "--max-body must be between 1 and 1GiB, got 2GiB" -- serve --max-body 2GiB
expect_err 2 "--kv-cache-mem needs a size such as 512MiB" -- serve --kv-cache-mem 12Q
expect_err 2 "--kv-cache-mem needs a size such as 512MiB" -- serve --kv-cache-mem -5M

# 3. --stop takes values up to the next option; --stop=-x passes a leading '-'
parsed run "--stop=[a],[b c]" -- e.engine -p x --stop a "b c"
parsed run "--stop=[a],[b],[-x]" -- e.engine --stop a b --stop=-x -p x
parsed run "-n=7" -- e.engine --stop a -n 7 -p x
parsed run "-p=x" -- e.engine --stop a -n 7 -p x
expect_err 2 "--stop needs a value" -- run e.engine -p x --stop -n 7

# 4. --name=value
parsed serve "--port=9001" -- --port=9001
parsed run "--temperature=0.5" -- e.engine --temperature=0.5 --prompt=hi
parsed run "-p=hi" -- e.engine --prompt=hi
parsed run "-n=12" -- e.engine -p x --steps=12
expect_err 2 "--no-prefix-caching takes no value" -- serve --no-prefix-caching=1

# 5. --host: names and IPv6 addresses reach the server unrefused
parsed serve "--host=localhost" -- --host localhost
parsed serve "--host=::1" -- --host ::1
parsed serve "--host=::" -- --host=::

# 6. --engine FILE is the positional engine, in the real commands
"$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/s.engine" >/dev/null 2>&1 || fail "build"
"$TURBINE_BIN" run "$D/s.engine" -p "Once upon" -n 24 --temperature 0 >"$D/pos.txt" 2>/dev/null
"$TURBINE_BIN" run --engine "$D/s.engine" -p "Once upon" -n 24 --temperature 0 >"$D/opt.txt" 2>"$D/opt.err"
[ -s "$D/pos.txt" ] && cmp -s "$D/pos.txt" "$D/opt.txt" && ok "run --engine FILE = run FILE" \
  || fail "run --engine: $(cat "$D/opt.txt" "$D/opt.err")"
"$TURBINE_BIN" inspect --engine "$D/s.engine" >"$D/inspect.txt" 2>&1; grep -q "format version" "$D/inspect.txt" && ok "inspect --engine FILE" || fail "inspect --engine"
"$TURBINE_BIN" perplexity --engine="$D/s.engine" --ids 1,400,20,30,40 >"$D/ppl.txt" 2>/dev/null \
  && grep -q "^perplexity " "$D/ppl.txt" && ok "perplexity --engine=FILE" || fail "perplexity --engine: $(cat "$D/ppl.txt")"
parsed serve "FILE.engine=$D/s.engine" -- --engine "$D/s.engine"
expect_err 2 "FILE.engine given twice" -- run "$D/s.engine" --engine "$D/s.engine" -p x

[ "$fails" = 0 ] && echo "PASS" || { echo "$fails failure(s)"; exit 1; }

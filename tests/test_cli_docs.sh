#!/usr/bin/env bash
# The command reference cannot drift from the parser: docs/COMMANDS.md must
# equal `turbine help --markdown` and the README's command list (between its
# commands:begin/end markers) `turbine help --synopsis`, both printed from the
# option tables the parser reads; and every row of those tables must be
# accepted by the parser, under its name, its alias and as --name=VALUE.
# A new option without regenerated docs, or a documented one the parser
# refuses, fails here. (Regenerate: turbine help --markdown > docs/COMMANDS.md)
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D="$TURBINE_TMP/cli_docs"
mkdir -p "$D"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# 1. docs/COMMANDS.md
"$TURBINE_BIN" help --markdown >"$D/commands.md" || fail "help --markdown exited $?"
if diff -u "$TURBINE_SRC/docs/COMMANDS.md" "$D/commands.md" >"$D/commands.diff"; then
  ok "docs/COMMANDS.md is what 'turbine help --markdown' prints"
else
  fail "docs/COMMANDS.md differs from 'turbine help --markdown' (regenerate it):"; head -40 "$D/commands.diff"
fi
# every command and every table option appears in it
for c in build run inspect serve perplexity bench; do
  grep -q "^## turbine $c\$" "$D/commands.md" || fail "COMMANDS.md has no section for $c"
done

# 2. the README's command list
awk '/<!-- commands:begin/{on=1; next} /<!-- commands:end -->/{on=0} on' "$TURBINE_SRC/README.md" \
  | sed '1{/^```/d}; ${/^```$/d}' >"$D/readme.txt"
"$TURBINE_BIN" help --synopsis >"$D/synopsis.txt" || fail "help --synopsis exited $?"
if [ ! -s "$D/readme.txt" ]; then
  fail "README.md has no commands:begin/end block"
elif diff -u "$D/readme.txt" "$D/synopsis.txt" >"$D/readme.diff"; then
  ok "README's command list is what 'turbine help --synopsis' prints"
else
  fail "README's command list differs from 'turbine help --synopsis':"; cat "$D/readme.diff"
fi

# 3. every table row is accepted by the parser (help --parse runs the
# command's own parser on the arguments and prints what it parsed)
base() {  # the least a command needs besides the option under test
  local cmd=$1 name=$2
  case "$cmd:$name" in
    build:*) echo "model -o x.engine" ;;
    run:-p|run:--prompt-ids) echo "e.engine" ;;
    run:--engine) echo "-p x" ;;
    run:*) echo "e.engine -p x" ;;
    perplexity:--text|perplexity:--ids) echo "e.engine" ;;
    perplexity:--engine) echo "--ids 1,2" ;;
    perplexity:*) echo "e.engine --ids 1,2" ;;
    compare:--text) echo "a.engine b.engine" ;;
    compare:*) echo "a.engine b.engine --text t.txt" ;;
    inspect:--engine|serve:*) echo "" ;;
    inspect:*) echo "e.engine" ;;
  esac
}
"$TURBINE_BIN" help --options >"$D/options.tsv" || fail "help --options exited $?"
rows=0
while IFS=$'\t' read -r cmd name alias value; do
  rows=$((rows + 1))
  b=$(base "$cmd" "$name")
  forms=("$name")
  [ "$alias" != "-" ] && forms+=("$alias")
  for form in "${forms[@]}"; do
    # shellcheck disable=SC2086
    if [ "$value" = "-" ]; then out=$("$TURBINE_BIN" help --parse "$cmd" $b "$form" 2>&1)
    else out=$("$TURBINE_BIN" help --parse "$cmd" $b "$form" "$value" 2>&1); fi
    [ $? = 0 ] || fail "$cmd $form $value: refused: $out"
    if [ "$value" != "-" ] && [ "${form:0:2}" = "--" ]; then
      # shellcheck disable=SC2086
      out=$("$TURBINE_BIN" help --parse "$cmd" $b "$form=$value" 2>&1) || fail "$cmd $form=$value: refused: $out"
    fi
  done
  grep -qF -- "\`$name\`" "$D/commands.md" || fail "$cmd $name is not in COMMANDS.md"
done <"$D/options.tsv"
[ "$rows" -gt 40 ] && ok "$rows table options accepted by their parsers (name, alias, --name=VALUE)" \
  || fail "only $rows table options listed"
# and the parser knows nothing the table does not: an option missing from it is refused
"$TURBINE_BIN" help --parse run e.engine -p x --no-such-option >/dev/null 2>&1; [ $? = 2 ] \
  || fail "an unknown option was not a usage error"

[ "$fails" = 0 ] && echo "PASS" || { echo "$fails failure(s)"; exit 1; }

# tests/tb_test.sh — what the shell tests share, as tests/tb_test.h is for
# the C tests. Sourced first thing by a tests/test_*.sh script:
#
#   . "$(dirname "$0")/tb_test.sh"
#   tb_test_dir NAME          # D=$TURBINE_TMP/NAME, emptied
#   ... ok "what holds" || fail "what went wrong"
#   tb_test_finish test_NAME  # the summary line; exit 1 on any failure
#
# It checks that ctest's environment is there (TURBINE_BIN, TURBINE_SHARED,
# TURBINE_TMP, TURBINE_SRC), names Debian's python (PY: numpy and torch
# belong to it) and the shared stories260K folder (M).
set -uo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_SRC:?}"
PY=/usr/bin/python3
M="$TURBINE_SHARED/models/stories260K"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# D: the test's own scratch folder under TURBINE_TMP, empty.
tb_test_dir() {
  D="$TURBINE_TMP/$1"
  rm -rf "$D" && mkdir -p "$D"
}

tb_test_finish() {
  if [ "$fails" = 0 ]; then echo "$1: all passed"; else echo "$1: $fails failed"; exit 1; fi
}

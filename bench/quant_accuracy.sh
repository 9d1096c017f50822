#!/usr/bin/env bash
# quant_accuracy.sh — perplexity of each engine precision on a held-out text,
# as a markdown table (docs/PERFORMANCE.md, "Accuracy of the precisions").
#
#   bench/quant_accuracy.sh TURBINE_BIN MODEL TEXT CTX [build args...]
#
# MODEL is what `turbine build` takes (a folder, or a llama2.c .bin with
# --tokenizer among the build args); TEXT the held-out text; CTX the window.
# Each row: the build options, the engine's bytes and bits per matmul weight
# (`turbine inspect`), nats/token, perplexity and the change against f32.
set -uo pipefail
BIN=${1:?turbine binary}; MODEL=${2:?model}; TEXT=${3:?text}; CTX=${4:?ctx}; shift 4
D=$(mktemp -d "${TMPDIR:-/tmp}/quant_acc.XXXXXX")
trap 'rm -rf "$D"' EXIT
VARIANTS=(
  "--dtype f32" "--dtype f16" "--dtype bf16"
  "--dtype int8" "--dtype int8 --override lm_head=int8"
  "--dtype fp8"
  "--dtype int4 --group-size 32" "--dtype int4 --group-size 64" "--dtype int4 --group-size 128"
  "--dtype int4 --group-size 32 --zero-point" "--dtype int4 --group-size 64 --zero-point"
  "--dtype int4 --group-size 128 --zero-point"
)
echo "| build options | engine bytes | bits per matmul weight | nats/token | perplexity | vs f32 |"
echo "|---|---|---|---|---|---|"
f32=""
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2086
  if ! "$BIN" build "$MODEL" "$@" $v -o "$D/e.engine" >"$D/build.log" 2>&1; then
    echo "| \`$v\` | build failed: $(tail -1 "$D/build.log") | | | | |"; continue
  fi
  bytes=$(stat -c %s "$D/e.engine")
  bpw=$("$BIN" inspect "$D/e.engine" | sed -n 's/^bits per weight: \([0-9.]*\) over the matmul.*/\1/p')
  out=$("$BIN" perplexity "$D/e.engine" --text "$TEXT" --ctx "$CTX" --threads 2 2>/dev/null)
  nll=$(awk '{print $4}' <<<"$out"); ppl=$(awk '{print $2}' <<<"$out")
  [ -z "$f32" ] && f32=$ppl
  rel=$(/usr/bin/python3 -c "print('%+.2f%%' % (100 * (float('$ppl') / float('$f32') - 1)))" 2>/dev/null)
  echo "| \`$v\` | $bytes | $bpw | $nll | $ppl | $rel |"
done

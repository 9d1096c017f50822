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
# CALIB=FILE adds int4 --awq rows (groups 32, 64, 128) calibrated on FILE
# (text the model's tokenizer reads: the training split, not TEXT); KV=1
# adds the f32 engine scored with each quantized KV-cache dtype (--kv-dtype
# f16, int8, fp8; the row's options then name the scoring option).
# ONLY=REGEX keeps the rows whose options match (grep -E; the f32 row, the
# baseline, always runs first). SCORE="ARGS" scores every row without a
# scoring option of its own with ARGS (e.g. SCORE="--kv-dtype f32": the
# cache of the f32 engine, where quantized engines default to f16).
set -uo pipefail
BIN=${1:?turbine binary}; MODEL=${2:?model}; TEXT=${3:?text}; CTX=${4:?ctx}; shift 4
D=$(mktemp -d "${TMPDIR:-/tmp}/quant_acc.XXXXXX")
trap 'rm -rf "$D"' EXIT
VARIANTS=(
  "--dtype f32" "--dtype f16" "--dtype bf16"
  "--dtype int8" "--dtype int8 --override lm_head=int8"
  "--dtype fp8"
  "--dtype int4 --group-size 32" "--dtype int4 --group-size 64" "--dtype int4 --group-size 128"
  "--dtype int4 --group-size 128 --override lm_head=f16"
  "--dtype int4 --group-size 32 --zero-point" "--dtype int4 --group-size 64 --zero-point"
  "--dtype int4 --group-size 128 --zero-point"
)
if [ -n "${CALIB:-}" ]; then
  for g in 32 64 128; do VARIANTS+=("--dtype int4 --group-size $g --awq --calib $CALIB --calib-threads 2"); done
fi
# a row "BUILD OPTIONS | SCORING OPTIONS": the engine built so, perplexity run with the latter
[ "${KV:-0}" = 1 ] && VARIANTS+=("--dtype f32 | --kv-dtype f16" "--dtype f32 | --kv-dtype int8" "--dtype f32 | --kv-dtype fp8")
if [ -n "${ONLY:-}" ]; then
  kept=("--dtype f32")
  for row in "${VARIANTS[@]}"; do
    [ "$row" != "--dtype f32" ] && grep -qE -- "$ONLY" <<<"$row" && kept+=("$row")
  done
  VARIANTS=("${kept[@]}")
fi
echo "| build options | engine bytes | bits per matmul weight | nats/token | perplexity | vs f32 |"
echo "|---|---|---|---|---|---|"
f32=""
for row in "${VARIANTS[@]}"; do
  v=${row%% | *}; score=""; label="\`$v\`"
  [ "$v" != "$row" ] && score=${row#* | } && label="\`$v\`, scored with \`$score\`"
  [ "$v" = "$row" ] && score=${SCORE:-}
  # shellcheck disable=SC2086
  if ! "$BIN" build "$MODEL" "$@" $v -o "$D/e.engine" >"$D/build.log" 2>&1; then
    echo "| $label | build failed: $(tail -1 "$D/build.log") | | | | |"; continue
  fi
  bytes=$(stat -c %s "$D/e.engine")
  bpw=$("$BIN" inspect "$D/e.engine" | sed -n 's/^bits per weight: \([0-9.]*\) over the matmul.*/\1/p')
  # shellcheck disable=SC2086
  out=$("$BIN" perplexity "$D/e.engine" --text "$TEXT" --ctx "$CTX" --threads 2 $score 2>/dev/null)
  nll=$(awk '{print $4}' <<<"$out"); ppl=$(awk '{print $2}' <<<"$out")
  [ -z "$f32" ] && f32=$ppl
  rel=$(/usr/bin/python3 -c "print('%+.2f%%' % (100 * (float('$ppl') / float('$f32') - 1)))" 2>/dev/null)
  echo "| $label | $bytes | $bpw | $nll | $ppl | $rel |"
done

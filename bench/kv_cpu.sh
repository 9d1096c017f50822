#!/usr/bin/env bash
# kv_cpu.sh — decode speed at long context for each KV-cache dtype on the CPU.
#
# The random 134M Llama (tests/gen_checkpoints.py --preset llama134m: 12
# layers, 12 heads = kv heads, hd 64, context 1024), f16 weights: per KV dtype
# (f32, f16, int8, fp8) `turbine bench --engine` prefills INPUT_LEN tokens and
# times OUTPUT_LEN decode steps after them, so every step reads ~INPUT_LEN
# positions of K and V in each layer; rounds take the dtypes in turn, so that
# load on a shared machine hits each alike, and the median over the rounds
# of each run's p50 decode ms per step is reported. Then kernels_bench's `attnkv` mode times
# the decode attention alone (cache evicted from L3 before each step) at
# batch 1 and 8.
#
# usage: bench/kv_cpu.sh        env: BUILD (build dir), OUT (work dir),
#        THREADS (2), ROUNDS (3), INPUT_LEN (960), OUTPUT_LEN (48), WDT (f16)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
OUT=${OUT:-/tmp/turbine-kv-bench}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
INPUT_LEN=${INPUT_LEN:-960}
OUTPUT_LEN=${OUTPUT_LEN:-48}
WDT=${WDT:-f16}
SHARED=${TURBINE_SHARED:-$ROOT/../shared}
TB=$BUILD/turbine
mkdir -p "$OUT"

CK=$OUT/llama134m_f32
[ -f "$CK/model.safetensors" ] ||
  /usr/bin/python3 "$ROOT/tests/gen_checkpoints.py" --preset llama134m --dtype f32 --out "$CK" >/dev/null
E=$OUT/llama134m_$WDT.engine
[ -f "$E" ] || "$TB" build "$CK" --tokenizer "$SHARED/models/llama2_tokenizer.bin" --dtype "$WDT" -o "$E" >/dev/null 2>&1

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "134M Llama, $WDT weights, batch 1, $INPUT_LEN prompt tokens then $OUTPUT_LEN decode steps, $THREADS threads"
declare -A steps
for r in $(seq "$ROUNDS"); do
  for kv in f32 f16 int8 fp8; do
    line=$("$TB" bench --engine "$E" --batch 1 --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --threads "$THREADS" \
      --kv-dtype $kv | awk '$1 == 1 {print $5}')
    steps[$kv]="${steps[$kv]:-} $line"
  done
done
f32ms=
for kv in f32 f16 int8 fp8; do
  med=$(tr ' ' '\n' <<<"${steps[$kv]}" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  [ -z "$f32ms" ] && f32ms=$med
  printf "  kv %-5s decode %8.2f ms per step  %6.1f tok/s  %.2fx f32 KV   (rounds:%s)\n" $kv "$med" \
    "$(awk -v m="$med" 'BEGIN {print 1000 / m}')" "$(awk -v a="$f32ms" -v m="$med" 'BEGIN {print a / m}')" "${steps[$kv]}"
done
for b in 1 8; do KB_BATCH=$b "$BUILD/kernels_bench" 0.3 attnkv | tail -n 5; done

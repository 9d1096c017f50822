#!/bin/bash
# bench/gpu/qgemv_tma.sh — the quantized decode GEMVs (int8, e4m3, int4 of
# groups of 128) on the bulk-copy ring (TB_CUDA_GEMV_TMA bit 4: one token
# of int8 / e4m3, bit 7: of int4, bit 5: 2..8 tokens; bit 3: rows of K <
# 8192 on 2 slots; bit 6: matrices of few tiles split in K over clusters of
# two; the default is 25, 9 the f16 ring alone, the baseline here), on the
# GPU machine in one run: correctness first
# (test_backend_ops with both bits on, on 2 and on 4 slots; test_batch,
# every engine, with both bits on), beside the 7B engines'
# builds; then the matmuls alone at a 7B layer's shapes (qgemv_bench,
# against the streaming read); then the 7B int8 / int4 / fp8 b1 and b8
# steps (gpu_bench --variants).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/qgemv_tma.sh
#
# Env: QT_VALUES (the TB_CUDA_GEMV_TMA values timed beside 9, default
# "25 153 57 89"), QT_CHECK (the values test_backend_ops runs with,
# default "249 113": every bit, on 2 and on 4 slots; test_batch runs with
# the first), QT_STEPS (0: checks and
# matmuls alone only, no engines or steps; default 1), TB_PREBUILT (default /tmp/pb: binaries from
# bench/gpu/pack.sh), OUT (results, default ./qgemv_tma), TB_GPU_DATA
# (folder with models/llama2_tokenizer.bin and the demo model, default
# .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/qgemv_tma}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
VALS=${QT_VALUES:-25 153 57 89}
CHK=${QT_CHECK:-249 113}
mkdir -p "$OUT/tb"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
B=(--tokenizer "$DATA/models/llama2_tokenizer.bin" --device cuda --max-seq-len 1024 --max-batch 16)
STEPS=${QT_STEPS:-1}
( set -e
  [ "$STEPS" = 0 ] && exit 0
  python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/qt_7b
  for d in int8 int4 fp8; do
      g=(); [ $d = int4 ] && g=(--group-size 128)
      "$PB/turbine" build /tmp/qt_7b -o /tmp/qt_$d.engine --dtype $d "${g[@]}" "${B[@]}"
      touch /tmp/qt_$d.ok
  done
) > "$OUT/engine.txt" 2>&1 &
eng=$!
pids=()
for c in $CHK; do
    TB_CUDA_GEMV_TMA=$c TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops$c.txt" 2>&1 &
    pids+=($!)
done
TB_CUDA_GEMV_TMA=${CHK%% *} TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
    TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_FP8_TOL=0.15 timeout 300 "$PB/test_batch" \
    > "$OUT/batch.txt" 2>&1 &
pids+=($!)
wait "${pids[@]}"
nf=0
for c in $CHK; do
    n=$(grep -c 'FAIL' "$OUT/ops$c.txt")
    nf=$((nf + n))
    echo "ops TMA=$c: $(grep -c ' ok$' "$OUT/ops$c.txt") ok, $n FAIL"
    grep 'FAIL' "$OUT/ops$c.txt" | head -5
done
echo "batch (${CHK%% *}): $(tail -1 "$OUT/batch.txt") ($(el) s)"
{ [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || {
    echo "checks failed: no timings"
    for c in $CHK; do tail -3 "$OUT/ops$c.txt"; done
    tail -5 "$OUT/batch.txt"
    exit 1
}
for r in 9 $VALS; do
    echo "== qgemv_bench int8,fp8,int4, TB_CUDA_GEMV_TMA=$r"
    TB_CUDA_GEMV_TMA=$r timeout 60 "$PB/qgemv_bench" --t 1,8 --kinds int8,fp8,int4 --reps 3 2>&1 |
        tee -a "$OUT/qgemv.txt" | grep -E '^device| 4096x4096| 4096x11008|sum'
done
V="base;base"
for r in $VALS; do V="$V;TB_CUDA_GEMV_TMA=$r"; done
V="$V;base;TB_CUDA_GEMV_TMA=${VALS%% *}"
[ "$STEPS" = 0 ] && { echo "done ($(el) s)"; exit 0; }
for d in int8 int4 fp8; do
    while kill -0 $eng 2>/dev/null && [ ! -f /tmp/qt_$d.ok ]; do sleep 2; done
    [ -f /tmp/qt_$d.ok ] || { echo "$d engine build FAIL ($(el) s)"; tail -3 "$OUT/engine.txt"; exit 1; }
    echo "== 7B $d ($(el) s)"
    timeout 150 "$PB/gpu_bench" /tmp/qt_$d.engine --device cuda --prefill 0 --decode 32 --ctx 128 --batch 1,8 \
        --variants "$V" 2>&1 | grep -E 'decode|error|fail'
done
echo "done ($(el) s)"

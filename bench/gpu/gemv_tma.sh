#!/bin/bash
# bench/gpu/gemv_tma.sh — the f16 decode GEMVs on the bulk-copy ring
# kernel (TB_CUDA_GEMV_TMA: bit 0 steps of 3..8 tokens, bit 1 of 1..2, bit
# 2 only rows of K >= 8192, bit 3 rows of K < 8192 on a 2-slot ring;
# the default 25 has bits 0 and 3 of these) on the GPU machine in one run: correctness first
# (test_backend_ops with it on every shape and step of 1..8 tokens, 4 slots
# (3) and 2 slots (11), test_batch's float engines with 11, beside the 7B engine's
# build), then the matmuls alone at a 7B layer's shapes (qgemv_bench
# against the streaming read), then the 7B f16 b1 / b8 steps (gpu_bench
# --variants).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemv_tma.sh
#
# Env: GT_QGEMV (the qgemv_bench values of TB_CUDA_GEMV_TMA, default "0 3 11 5"),
# TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./gemv_tma), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/gemv_tma}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
mkdir -p "$OUT/tb"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
( python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/gt_7b &&
  "$PB/turbine" build /tmp/gt_7b -o /tmp/gt_f16.engine --dtype f16 --tokenizer "$DATA/models/llama2_tokenizer.bin" \
      --device cuda --max-seq-len 1024 --max-batch 16 ) > "$OUT/engine.txt" 2>&1 &
eng=$!
TB_CUDA_GEMV_TMA=3 TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops.txt" 2>&1 &
p1=$!
TB_CUDA_GEMV_TMA=11 TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops11.txt" 2>&1 &
p3=$!
TB_CUDA_GEMV_TMA=11 TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
    TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_BATCH_ENGINES=float timeout 300 "$PB/test_batch" \
    > "$OUT/batch.txt" 2>&1 &
p2=$!
wait $p1 $p2 $p3
nf=$(cat "$OUT/ops.txt" "$OUT/ops11.txt" | grep -c 'FAIL')
echo "ops TMA=3: $(grep -c ' ok$' "$OUT/ops.txt") ok, TMA=11: $(grep -c ' ok$' "$OUT/ops11.txt") ok, $nf FAIL;" \
    "batch (11): $(tail -1 "$OUT/batch.txt") ($(el) s)"
grep 'FAIL' "$OUT/ops.txt" "$OUT/ops11.txt" | head -5
{ [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || { echo "checks failed: no timings"; tail -5 "$OUT/ops.txt"; exit 1; }
for r in ${GT_QGEMV:-0 3 11 5}; do
    echo "== qgemv_bench f16, TB_CUDA_GEMV_TMA=$r"
    TB_CUDA_GEMV_TMA=$r timeout 60 "$PB/qgemv_bench" --t 1,2,8 --kinds f16 --reps 3 2>&1 | tee -a "$OUT/qgemv.txt" |
        grep -E '^device| 4096x4096| 4096x11008|sum'
done
wait $eng || { echo "7B engine build FAIL"; tail -3 "$OUT/engine.txt"; exit 1; }
echo "== 7B f16 ($(el) s)"
timeout 200 "$PB/gpu_bench" /tmp/gt_f16.engine --device cuda --prefill 0 --decode 32 --ctx 128 --batch 1,8 \
    --variants "base;base;TB_CUDA_GEMV_TMA=0;TB_CUDA_GEMV_TMA=1;TB_CUDA_GEMV_TMA=9;TB_CUDA_GEMV_TMA=11;base;TB_CUDA_GEMV_TMA=0;TB_CUDA_GEMV_TMA=9" \
    2>&1 | grep -E 'decode|error|fail'
echo "done ($(el) s)"

#!/bin/bash
# bench/gpu/gemv_rot.sh — the decode GEMVs reading their rows from
# rotated starts (TB_CUDA_GEMV_ROT: bit 0 the f16 tensor-core kernel of
# 3..8 tokens, bit 1 the f16 SIMT row kernel of 1..2, bit 2 the quantized
# cp.async ring kernel), on the GPU machine in one run: correctness first
# (test_backend_ops and test_batch, every engine, with all three on,
# beside the engines' builds), then the matmuls alone at a 7B layer's
# shapes (qgemv_bench, against the streaming read), then 8-layer 7B-shape
# decode steps of f16, int4 and fp8 engines (gpu_bench --variants).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemv_rot.sh
#
# Env: GR_STEP=0 skips the 7B engine and its steps; TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./gemv_rot), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/gemv_rot}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
mkdir -p "$OUT/tb"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
STEP=${GR_STEP:-1}
TOK="$DATA/models/llama2_tokenizer.bin"
[ "$STEP" = 0 ] || ( python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --layers 8 --out /tmp/gr_7b &&
    for dt in f16 int4 fp8; do
        gs=""; [ $dt = int4 ] && gs="--group-size 128"
        "$PB/turbine" build /tmp/gr_7b -o /tmp/gr_$dt.engine --dtype $dt $gs --tokenizer "$TOK" \
            --device cuda --max-seq-len 1024 --max-batch 16 || exit 1
    done ) > "$OUT/engine.txt" 2>&1 &
eng=$!
TB_CUDA_GEMV_ROT=7 TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops.txt" 2>&1 &
p1=$!
TB_CUDA_GEMV_ROT=7 TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
    TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_FP8_TOL=0.15 timeout 300 "$PB/test_batch" \
    > "$OUT/batch.txt" 2>&1 &
p2=$!
wait $p1 $p2
nf=$(grep -c 'FAIL' "$OUT/ops.txt")
echo "ROT=7 ops: $(grep -c ' ok$' "$OUT/ops.txt") ok, $nf FAIL; batch: $(tail -1 "$OUT/batch.txt") ($(el) s)"
grep 'FAIL' "$OUT/ops.txt" | head -3
{ [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || { echo "checks failed: no timings"; exit 1; }
for r in 1 3 1 3; do
    echo "== qgemv_bench f16, TB_CUDA_GEMV_ROT=$r"
    TB_CUDA_GEMV_ROT=$r timeout 60 "$PB/qgemv_bench" --t 1,8 --kinds f16 --reps 3 2>&1 | grep -v '^#' | tail -12
done
for r in 1 5 1 5; do
    echo "== qgemv_bench int8,fp8,int4 (default variants), TB_CUDA_GEMV_ROT=$r"
    TB_CUDA_GEMV_ROT=$r timeout 90 "$PB/qgemv_bench" --t 1,8 --kinds int8,fp8,int4 --reps 3 2>&1 | tee -a "$OUT/qgemv.txt" |
        grep -E 'sum|device' 
done
[ "$STEP" = 0 ] && { echo "done ($(el) s)"; exit 0; }
wait $eng || { echo "engine build FAIL"; tail -3 "$OUT/engine.txt"; exit 1; }
echo "== f16 8-layer ($(el) s)"
timeout 150 "$PB/gpu_bench" /tmp/gr_f16.engine --device cuda --prefill 0 --decode 32 --ctx 128 --batch 1,8 \
    --variants "TB_CUDA_GEMV_ROT=1;TB_CUDA_GEMV_ROT=3;TB_CUDA_GEMV_ROT=0;TB_CUDA_GEMV_ROT=1;TB_CUDA_GEMV_ROT=3" \
    2>&1 | grep -E 'decode|error|fail'
for dt in int4 fp8; do
    echo "== $dt 8-layer ($(el) s)"
    timeout 120 "$PB/gpu_bench" /tmp/gr_$dt.engine --device cuda --prefill 0 --decode 32 --ctx 128 --batch 1,8 \
        --variants "TB_CUDA_GEMV_ROT=1;TB_CUDA_GEMV_ROT=5;TB_CUDA_GEMV_ROT=1;TB_CUDA_GEMV_ROT=5" \
        2>&1 | grep -E 'decode|error|fail'
done
echo "done ($(el) s)"

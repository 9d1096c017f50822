#!/bin/bash
# bench/gpu/gemv_rot.sh — the f16 decode GEMVs reading their rows from
# rotated starts (TB_CUDA_GEMV_ROT: bit 0 the tensor-core kernel of 3..8
# tokens, bit 1 the SIMT row kernel of 1..2; default both), on the GPU
# machine in one run: correctness first (test_backend_ops, and again with
# every one-token int8 / int4 step on the Q8 kernel; test_batch, every
# engine), beside the engines' builds; then the matmuls
# alone at a 7B layer's shapes (qgemv_bench, against the streaming read);
# then whole decode steps (gpu_bench --variants): the 7B f16 engine built
# with the default (its row tactics timed rotated) and one built with bit 1
# off, TinyLlama f16, and the 7B int8 engine with and without the Q8
# tactic (--qmm-tactics q8).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemv_rot.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
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
TOK="$DATA/models/llama2_tokenizer.bin"
B=(--tokenizer "$TOK" --device cuda --max-seq-len 1024 --max-batch 16)
# engines, in the order they are timed; the bit-1-off f16 engine in memory (disk)
( set -e
  python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/gr_7b
  TB_CUDA_TUNE=2 "$PB/turbine" build /tmp/gr_7b -o /tmp/gr_f16.engine --dtype f16 "${B[@]}"
  TB_CUDA_TUNE=2 TB_CUDA_GEMV_ROT=1 "$PB/turbine" build /tmp/gr_7b -o /dev/shm/gr_f16_r1.engine --dtype f16 "${B[@]}"
  touch /tmp/gr_f16.ok
  python3 "$SRC/bench/gpu/torch_ckpt.py" --shape tinyllama --out /tmp/gr_tl
  "$PB/turbine" build /tmp/gr_tl -o /tmp/gr_tl.engine --dtype f16 "${B[@]}"
  touch /tmp/gr_tl.ok
  "$PB/turbine" build /tmp/gr_7b -o /tmp/gr_i8.engine --dtype int8 "${B[@]}"
  "$PB/turbine" build /tmp/gr_7b -o /tmp/gr_i8q8.engine --dtype int8 --qmm-tactics q8 "${B[@]}"
) > "$OUT/engine.txt" 2>&1 &
eng=$!
TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops.txt" 2>&1 &
p1=$!
TB_CUDA_QGEMV_V=15 TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops15.txt" 2>&1 &
p3=$!
TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
    TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_FP8_TOL=0.15 timeout 300 "$PB/test_batch" \
    > "$OUT/batch.txt" 2>&1 &
p2=$!
wait $p1 $p2 $p3
nf=$(grep -c 'FAIL' "$OUT/ops.txt")
nf15=$(grep -c 'FAIL' "$OUT/ops15.txt")
echo "ops: $(grep -c ' ok$' "$OUT/ops.txt") ok, $nf FAIL; with V=15: $(grep -c ' ok$' "$OUT/ops15.txt") ok, $nf15 FAIL"
echo "batch: $(tail -1 "$OUT/batch.txt") ($(el) s)"
grep 'FAIL' "$OUT/ops.txt" "$OUT/ops15.txt" | head -4
{ [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || { echo "checks failed: no timings"; exit 1; }
for r in 1 3; do
    echo "== qgemv_bench f16 --t 1,2, TB_CUDA_GEMV_ROT=$r"
    TB_CUDA_GEMV_ROT=$r timeout 60 "$PB/qgemv_bench" --t 1,2 --kinds f16 --reps 3 2>&1 | tee -a "$OUT/qgemv.txt" |
        grep -E 'sum'
done
for r in 1 2; do
    echo "== qgemv_bench int8,int4 --t 1, default and Q8 (variant 15), round $r"
    for v in -1 15; do
        timeout 60 "$PB/qgemv_bench" --t 1 --kinds int8,int4 --variant $v --reps 3 2>&1 |
            tee -a "$OUT/qgemv.txt" | grep -vE '^#|^device|^kind'
    done
done
bench() { # engine, batches, variants
    timeout 150 "$PB/gpu_bench" "$1" --device cuda --prefill 0 --decode 32 --ctx 128 --batch "$2" --variants "$3" \
        2>&1 | grep -E 'decode|error|fail'
}
while kill -0 $eng 2>/dev/null && [ ! -f /tmp/gr_f16.ok ]; do sleep 2; done
[ -f /tmp/gr_f16.ok ] || { echo "f16 engine build FAIL ($(el) s)"; tail -5 "$OUT/engine.txt"; exit 1; }
grep -E '^cuda: gemv' "$OUT/engine.txt"
echo "== 7B f16, row tactics timed rotated ($(el) s)"
bench /tmp/gr_f16.engine 1,8 "base;base;TB_CUDA_GEMV_ROT=1;TB_CUDA_TUNE=0;base"
echo "== 7B f16, row tactics timed unrotated ($(el) s)"
bench /dev/shm/gr_f16_r1.engine 1 "TB_CUDA_GEMV_ROT=1;base;TB_CUDA_GEMV_ROT=1;base"
rm -f /dev/shm/gr_f16_r1.engine
while kill -0 $eng 2>/dev/null && [ ! -f /tmp/gr_tl.ok ]; do sleep 2; done
echo "== TinyLlama f16 ($(el) s)"
[ -f /tmp/gr_tl.ok ] && bench /tmp/gr_tl.engine 1 "base;TB_CUDA_GEMV_ROT=1;base;TB_CUDA_GEMV_ROT=1"
wait $eng || { echo "int8 engine build FAIL ($(el) s)"; tail -5 "$OUT/engine.txt"; exit 1; }
echo "== 7B int8 ($(el) s)"
bench /tmp/gr_i8.engine 1 "base;base"
echo "== 7B int8, Q8 tactic ($(el) s)"
bench /tmp/gr_i8q8.engine 1 "base;base"
echo "done ($(el) s)"

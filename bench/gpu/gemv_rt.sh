#!/bin/bash
# bench/gpu/gemv_rt.sh — the f16 tensor-core decode GEMV (steps of 3..8
# tokens) with 1, 2 or 4 16-row tiles a block (TB_CUDA_GEMV_RT), on the GPU
# machine in one run: correctness first (test_backend_ops and test_batch
# with each RT forced, both beside the 7B engine's build), then the matmuls
# alone at a 7B layer's shapes (qgemv_bench --kinds f16, against the
# streaming read), then whole 7B-shape decode steps (gpu_bench --variants).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemv_rt.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./gemv_rt), RT_LIST (forced values checked, default
# "2 4"), RT_BATCH (gpu_bench batches, default 8), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/gemv_rt}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
RTS=${RT_LIST:-2 4}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
CK=/tmp/gemv_rt_7b
ENG=/tmp/gemv_rt_f16.engine
( { [ -f $CK/config.json ] || python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out $CK; } &&
    "$PB/turbine" build $CK -o $ENG --tokenizer "$DATA/models/llama2_tokenizer.bin" --dtype f16 --device cuda \
        --max-seq-len 1024 --max-batch 16 ) > "$OUT/engine.txt" 2>&1 &
eng=$!
pids=()
for rt in $RTS; do
    mkdir -p "$OUT/tb$rt"
    TB_CUDA_GEMV_RT=$rt TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops_rt$rt.txt" 2>&1 &
    pids+=($!)
    TB_CUDA_GEMV_RT=$rt TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb$rt" \
        TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_BATCH_ENGINES=float timeout 300 "$PB/test_batch" \
        > "$OUT/batch_rt$rt.txt" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
fail=0
for rt in $RTS; do
    nf=$(grep -c 'FAIL' "$OUT/ops_rt$rt.txt")
    echo "RT=$rt ops: $(grep -c ' ok$' "$OUT/ops_rt$rt.txt") ok, $nf FAIL; batch: $(tail -1 "$OUT/batch_rt$rt.txt")"
    grep 'FAIL' "$OUT/ops_rt$rt.txt" | head -3
    { [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch_rt$rt.txt"; } || fail=1
done
echo "checks done ($(el) s)"
[ $fail = 0 ] || { echo "a forced RT failed its checks: no timings"; exit 1; }
for rt in 1 $RTS; do
    echo "== qgemv_bench f16, TB_CUDA_GEMV_RT=$rt"
    TB_CUDA_GEMV_RT=$rt timeout 60 "$PB/qgemv_bench" --t 8 --kinds f16 --reps 3 2>&1 | grep -v '^#' | tail -7
done
wait $eng || { echo "7B engine build FAIL"; tail -3 "$OUT/engine.txt"; exit 1; }
V="base"
for rt in $RTS; do V="$V;TB_CUDA_GEMV_RT=$rt"; done
timeout 200 "$PB/gpu_bench" $ENG --device cuda --prefill 0 --decode 24 --ctx 128 --batch "${RT_BATCH:-8}" \
    --variants "$V;base" 2>&1 | grep -E 'decode|error|fail'
echo "done ($(el) s)"

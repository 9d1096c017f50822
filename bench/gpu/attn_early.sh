#!/bin/bash
# bench/gpu/attn_early.sh — the decode attention's early loads
# (TB_CUDA_ATTN_EARLY, default on: in steps of one token a sequence,
# attn_mma_kernel reads the split's range, the block table and its first
# tile's keys before waiting on the qkv kernel) on the GPU machine in one
# run: correctness first (test_backend_ops three times at once, as the
# one-device all-reduce failure of 2026-12-07 happened; its attention cases
# with early loads off and without key splits; test_batch, every engine),
# beside the engines' builds (7B shape: f16, fp8, int4 of groups of 128;
# TinyLlama f16); then their b1 / b8 decode steps with and without the
# early loads and with the split merge's old loop (TB_CUDA_ATTN_MERGE=loop),
# interleaved in one process (gpu_bench --variants; by
# default also TB_CUDA_SKIP_ATTN=1: the step without its attention, what
# the attention costs in the captured step, and TB_CUDA_ATTN_BLOCKS=0: no
# key splits).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/attn_early.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./attn_early), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu),
# AE_ENGINES (default "f16 fp8 int4 tiny"), AE_CHECK (0: no checks),
# AE_VARIANTS (gpu_bench --variants).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/attn_early}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
ENGS=${AE_ENGINES:-f16 fp8 int4 tiny}
mkdir -p "$OUT/tb"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
B=(--tokenizer "$DATA/models/llama2_tokenizer.bin" --device cuda --max-seq-len 1024 --max-batch 16)
( set -e
  for e in $ENGS; do
      case $e in
      tiny) python3 "$SRC/bench/gpu/torch_ckpt.py" --shape tinyllama --out /tmp/ae_tiny_ckpt
            "$PB/turbine" build /tmp/ae_tiny_ckpt -o /tmp/ae_tiny.engine --dtype f16 "${B[@]}" ;;
      *) [ -d /tmp/ae_7b ] || python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/ae_7b
         g=(); [ "$e" = int4 ] && g=(--group-size 128)
         "$PB/turbine" build /tmp/ae_7b -o /tmp/ae_"$e".engine --dtype "$e" "${g[@]}" "${B[@]}" ;;
      esac
      touch /tmp/ae_"$e".ok
  done
) > "$OUT/engine.txt" 2>&1 &
eng=$!
if [ "${AE_CHECK:-1}" != 0 ]; then
    pids=()
    for i in 1 2 3; do
        TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops$i.txt" 2>&1 &
        pids+=($!)
    done
    TB_CUDA_ATTN_EARLY=0 TURBINE_TEST_DEVICE=cuda TURBINE_TEST_ONLY=attention timeout 200 "$PB/test_backend_ops" \
        > "$OUT/ops_early0.txt" 2>&1 &
    pids+=($!)
    TB_CUDA_ATTN_BLOCKS=0 TURBINE_TEST_DEVICE=cuda TURBINE_TEST_ONLY=attention timeout 200 "$PB/test_backend_ops" \
        > "$OUT/ops_blocks0.txt" 2>&1 &
    pids+=($!)
    TB_CUDA_ATTN_MERGE=loop TURBINE_TEST_DEVICE=cuda TURBINE_TEST_ONLY=attention timeout 200 "$PB/test_backend_ops" \
        > "$OUT/ops_mergeloop.txt" 2>&1 &
    pids+=($!)
    TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
        TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_FP8_TOL=0.15 timeout 300 "$PB/test_batch" \
        > "$OUT/batch.txt" 2>&1 &
    pids+=($!)
    wait "${pids[@]}"
    nf=0
    for f in ops1 ops2 ops3 ops_early0 ops_blocks0 ops_mergeloop; do
        n=$(grep -c 'FAIL' "$OUT/$f.txt")
        nf=$((nf + n))
        echo "$f: $(grep -c ' ok$' "$OUT/$f.txt") ok, $n FAIL; $(tail -1 "$OUT/$f.txt")"
        grep 'FAIL' "$OUT/$f.txt" | head -5
    done
    echo "batch: $(tail -1 "$OUT/batch.txt") ($(el) s)"
    { [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || {
        echo "checks failed: no timings"
        tail -5 "$OUT/batch.txt"
        exit 1
    }
fi
V=${AE_VARIANTS:-base;TB_CUDA_ATTN_EARLY=0;TB_CUDA_ATTN_MERGE=loop;TB_CUDA_ATTN_EARLY=0 TB_CUDA_ATTN_MERGE=loop;TB_CUDA_SKIP_ATTN=1;TB_CUDA_ATTN_BLOCKS=0;base;TB_CUDA_ATTN_EARLY=0 TB_CUDA_ATTN_MERGE=loop}
for e in $ENGS; do
    while kill -0 $eng 2>/dev/null && [ ! -f /tmp/ae_"$e".ok ]; do sleep 2; done
    [ -f /tmp/ae_"$e".ok ] || { echo "$e engine build FAIL ($(el) s)"; tail -3 "$OUT/engine.txt"; exit 1; }
    echo "== $e ($(el) s)"
    timeout 150 "$PB/gpu_bench" /tmp/ae_"$e".engine --device cuda --prefill 0 --decode 48 --ctx 128 --batch 1,8 \
        --variants "$V" 2>&1 | tee "$OUT/bench_$e.txt" | grep -E 'decode|error|fail'
    [ "$e" = tiny ] || rm -f /tmp/ae_"$e".engine
done
echo "done ($(el) s)"

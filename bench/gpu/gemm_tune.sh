#!/bin/bash
# bench/gpu/gemm_tune.sh — cuBLASLt's candidates timed per shape in steps
# of 9..TB_CUDA_GEMM_TUNE_T tokens (default 256; the f16 / bf16 matmuls of
# those steps on cuBLASLt plans rather than cublasGemmEx) on the GPU
# machine in one run: correctness first (test_backend_ops with tuning on and
# off, test_batch: every engine, batched == unbatched), beside the builds
# of the 7B shape's f16 and fp8 engines; then cuBLASLt's f16 candidates
# against cublasGemmEx alone (fp8_lt_bench --dtype f16), and the engines'
# batch-16 / batch-64 decode steps and 64 (fp8 + fp8 KV: also 256) streams
# of 128/128 with and without the tuning, interleaved in one process
# (gpu_bench --variants), the picks logged (TB_BENCH_LOG=debug).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemm_tune.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./gemm_tune), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu),
# GT_CHECK (0: no checks), GT_VARIANTS (gpu_bench --variants).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/gemm_tune}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
VARS=${GT_VARIANTS:-base;TB_CUDA_GEMM_TUNE_T=0;base;TB_CUDA_GEMM_TUNE_T=0}
mkdir -p "$OUT/tb"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
B=(--tokenizer "$DATA/models/llama2_tokenizer.bin" --device cuda --max-seq-len 1024 --max-batch 64)
( set -e
  python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/gt_7b
  for d in f16 fp8; do
      "$PB/turbine" build /tmp/gt_7b -o /tmp/gt_"$d".engine --dtype "$d" "${B[@]}"
      touch /tmp/gt_"$d".ok
  done
) > "$OUT/engine.txt" 2>&1 &
eng=$!
if [ "${GT_CHECK:-1}" != 0 ]; then
    TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops.txt" 2>&1 &
    p1=$!
    TB_CUDA_GEMM_TUNE_T=0 TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops_notune.txt" 2>&1 &
    p2=$!
    TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb" \
        TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_FP8_TOL=0.15 timeout 300 "$PB/test_batch" \
        > "$OUT/batch.txt" 2>&1 &
    p3=$!
    wait $p1 $p2 $p3
    nf=0
    for f in ops ops_notune; do
        n=$(grep -c 'FAIL' "$OUT/$f.txt")
        nf=$((nf + n))
        echo "$f: $n FAIL; $(tail -1 "$OUT/$f.txt")"
        grep 'FAIL' "$OUT/$f.txt" | head -5
    done
    echo "batch: $(tail -1 "$OUT/batch.txt") ($(el) s)"
    { [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch.txt"; } || {
        echo "checks failed: no timings"
        tail -5 "$OUT/batch.txt"
        kill $eng 2>/dev/null
        exit 1
    }
fi
wait $eng
[ -e /tmp/gt_f16.ok ] || { echo "engine build failed"; tail -5 "$OUT/engine.txt"; exit 1; }
echo "engines built ($(el) s)"
"$PB/fp8_lt_bench" --dtype f16 --t 16,64,256 --algos 16 > "$OUT/lt_f16.txt" 2>&1
echo "== cuBLASLt f16 candidates: cublasGemmEx (-1), the heuristic's first (0), the fastest"
awk 'NR > 1 && $4 + 0 > 0 { k = $1 " " $2; if ($3 == "-1") g[k] = $4; if ($3 == "0") f[k] = $4;
     if (!(k in b) || $4 < b[k]) { b[k] = $4; a[k] = $3 } }
     END { for (k in b) printf "%s  gemmex %.2f us, first %.2f, best #%s %.2f\n", k, g[k], f[k], a[k], b[k] }' \
    "$OUT/lt_f16.txt" | sort -n
for d in f16 fp8; do
    [ -e /tmp/gt_"$d".ok ] || continue
    extra=(--streams 64)
    [ "$d" = fp8 ] && extra=(--streams "64,256" --kv-dtype fp8)
    echo "== 7B $d ($(el) s)"
    TB_BENCH_LOG=debug timeout 240 "$PB/gpu_bench" /tmp/gt_"$d".engine --device cuda --prefill 512 --decode 32 --ctx 128 \
        --batch 16,64 "${extra[@]}" --variants "$VARS" > "$OUT/$d.txt" 2> "$OUT/$d.log"
    grep -v '^load\|^first' "$OUT/$d.txt"
    echo "picks logged: $(grep -c 'timed fastest' "$OUT/$d.log"); not the first: $(grep 'timed fastest' "$OUT/$d.log" | grep -vc 'candidate 0 of')"
    grep 'timed fastest' "$OUT/$d.log" | sort | uniq | head -24
done
echo "done ($(el) s)"

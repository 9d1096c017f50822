#!/bin/bash
# bench/gpu/qgemv_ab.sh — the quantized decode GEMV's variants compared on the
# GPU machine in one run: first test_backend_ops with each variant (the
# quantized cases must pass before any timing counts), then qgemv_bench (the
# matmuls alone at a 7B layer's shapes, against the streaming read bandwidth),
# then whole 7B decode steps of int8 / int4 engines with gpu_bench --variants.
# Each variant's test_batch (batched == unbatched, quantized engines) runs
# beside its op cases.
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/qgemv_ab.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./qgemv_ab), AB_VARIANTS (TB_CUDA_QGEMV_V values, default
# "-1 0 1 2 3": -1 the default choice), AB_U (TB_CUDA_QGEMV_U values for
# qgemv_bench, default "1,2"), AB_T (token counts for qgemv_bench, default "1,8"),
# AB_DTYPES (7B engines to time, default "int8 int4"), AB_SKIP_BATCH=1 (no
# test_batch of the quantized test engines under each variant), AB_EXTRA (more gpu_bench variants for the 7B
# steps, e.g. "TB_CUDA_QGEMV_V=4 TB_CUDA_QGEMV_U=1;..."), AB_SKIP_7B=1 (no 7B
# engines), TB_GPU_DATA (folder with models/llama2_tokenizer.bin, default
# .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/qgemv_ab}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
VARS=${AB_VARIANTS:--1 0 1 2 3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
for v in $VARS; do
    TURBINE_TEST_DEVICE=cuda TB_CUDA_QGEMV_V=$v timeout 120 "$PB/test_backend_ops" > "$OUT/ops_v$v.txt" 2>&1
    echo "test_backend_ops TB_CUDA_QGEMV_V=$v: rc $? $(grep -E 'comparisons' "$OUT/ops_v$v.txt" | tail -1) ($(el) s)"
    grep -E "FAIL" "$OUT/ops_v$v.txt" | head -5; grep -E 'worst error per op' "$OUT/ops_v$v.txt" | cut -c1-200 | head -3
    # batched == unbatched on the int8 / int4 / fp8 test engines (steps of 2..8 tokens take the variant too)
    if [ -z "${AB_SKIP_BATCH:-}" ] && [ -x "$PB/test_batch" ]; then
        mkdir -p "$OUT/tb_v$v"
        TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb_v$v" \
            TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_BATCH_ENGINES=quant TB_CUDA_FP8_GEMM=0 \
            TB_CUDA_QGEMV_V=$v timeout 200 "$PB/test_batch" > "$OUT/batch_v$v.txt" 2>&1
        echo "test_batch (quantized engines) TB_CUDA_QGEMV_V=$v: rc $?, max rel err" \
             "$(grep -o 'max rel err [0-9.e+-]*' "$OUT/batch_v$v.txt" | awk '{print $4}' | tr '\n' ' ')($(el) s)"
        grep -m3 -i 'fail' "$OUT/batch_v$v.txt"
    fi
done
vlist=$(echo $VARS | tr ' ' ',')
timeout 200 "$PB/qgemv_bench" --t "${AB_T:-1,8}" --kinds int8,fp8,int4 --u "${AB_U:-1,2}" --variant "$vlist" > "$OUT/qgemv.txt" 2>&1
echo "qgemv_bench rc $? ($(el) s)"
grep -E "device|sum" "$OUT/qgemv.txt"
[ "${AB_SKIP_7B:-0}" = 1 ] && exit 0
CK=/tmp/qab_7b
python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out $CK > "$OUT/ckpt.txt" 2>&1 || { echo "checkpoint FAIL"; tail -5 "$OUT/ckpt.txt"; exit 1; }
echo "7B checkpoint ($(el) s)"
vs="base"
for v in $VARS; do vs="$vs;TB_CUDA_QGEMV_V=$v"; done
[ -n "${AB_EXTRA:-}" ] && vs="$vs;$AB_EXTRA"
for q in ${AB_DTYPES:-int8 int4}; do
    args=(--dtype "$q")
    [ "$q" = int4 ] && args=(--dtype int4 --group-size 128)
    "$PB/turbine" build $CK -o /tmp/qab_$q.engine --tokenizer "$DATA/models/llama2_tokenizer.bin" "${args[@]}" \
        --device cuda --max-seq-len 1024 --max-batch 64 > "$OUT/build_$q.txt" 2>&1 || { echo "build $q FAIL"; tail -3 "$OUT/build_$q.txt"; continue; }
    echo "built $q ($(el) s)"
    timeout 150 "$PB/gpu_bench" /tmp/qab_$q.engine --device cuda --prefill 0 --decode 64 --ctx 16 --batch 1,8 \
        --variants "$vs" > "$OUT/bench_$q.txt" 2>&1
    echo "gpu_bench $q rc $? ($(el) s)"
    grep -E "decode b" "$OUT/bench_$q.txt" | sed "s/^/$q /"
    rm -f /tmp/qab_$q.engine
done

#!/bin/bash
# bench/gpu/gemv_mma.sh — the loops of the f16 tensor-core decode GEMV
# (steps of 3..8 tokens) on the GPU machine in one run:
# TB_CUDA_GEMV_MMA=small,large (0: 4 steps of loads a thread, x of tokens
# >= T zero behind a branch; 1: x loaded without branches and every load of
# an iteration issued before its first mma; 2: as 1 with 8 steps).
# Correctness first (test_backend_ops and test_batch with each forced,
# beside the engine's build), the instruction order of the kernels
# (cuobjdump), then the matmuls alone at a 7B layer's shapes (qgemv_bench,
# against the streaming read), then whole 7B-shape decode steps (gpu_bench
# --variants).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/gemv_mma.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./gemv_mma), MMA_LIST (forced f16 loops, default "1 2"),
# MMA_BATCH (gpu_bench batches, default 4,8), TB_GPU_DATA (folder with
# models/llama2_tokenizer.bin and the demo model, default .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/gemv_mma}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
CFGS=${MMA_LIST:-1 2}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
TOK="$DATA/models/llama2_tokenizer.bin"
BUILD="--tokenizer $TOK --device cuda --max-seq-len 1024 --max-batch 16"
( python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out /tmp/gm_7b &&
    "$PB/turbine" build /tmp/gm_7b -o /tmp/gm_f16.engine --dtype f16 $BUILD ) > "$OUT/engine_f16.txt" 2>&1 &
eng=$!
pids=()
run_checks() { # name, env assignment, test_batch engines
    mkdir -p "$OUT/tb_$1"
    env "$2" TURBINE_TEST_DEVICE=cuda timeout 300 "$PB/test_backend_ops" > "$OUT/ops_$1.txt" 2>&1 &
    pids+=($!)
    env "$2" TURBINE_TEST_DEVICE=cuda TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$OUT/tb_$1" \
        TURBINE_PYTHON="$(command -v python3)" TURBINE_TEST_BATCH_ENGINES=$3 timeout 400 "$PB/test_batch" \
        > "$OUT/batch_$1.txt" 2>&1 &
    pids+=($!)
}
NAMES=""
for m in $CFGS; do run_checks mma$m TB_CUDA_GEMV_MMA=$m float; NAMES="$NAMES mma$m"; done
# the order of loads (L: LDG), tensor-core steps (M: HMMA) and branches (B)
# in the residual-add kernels (norm, U, D)
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$CUOBJ" -sass "$PB/libturbine_cuda.so" 2>/dev/null | python3 -c '
import re, sys
t = sys.stdin.read()
for f in re.split(r"\n\s+Function : ", t)[1:]:
    name = f.split("\n")[0].strip()
    m = re.search(r"15gemv_mma_kernelILi1ELi3ELb([01])ELi(\d+)ELb([01])E", name)
    if not m: continue
    ins = [l for l in f.split("\n") if re.search(r"/\*[0-9a-f]{4}\*/", l)]
    seq = "".join("L" if "LDG" in l else "M" if "HMMA" in l else "B" if re.search(r"\bBRA\b", l) else "" for l in ins)
    what = "norm=%s U=%s D=%s" % m.groups()
    print("%s %d instructions: %s" % (what, len(ins), seq[:180]))
' > "$OUT/sass.txt" 2>&1
cat "$OUT/sass.txt"
wait "${pids[@]}"
fail=0
for n in $NAMES; do
    nf=$(grep -c 'FAIL' "$OUT/ops_$n.txt")
    echo "$n ops: $(grep -c ' ok$' "$OUT/ops_$n.txt") ok, $nf FAIL; batch: $(tail -1 "$OUT/batch_$n.txt")"
    grep 'FAIL' "$OUT/ops_$n.txt" | head -3
    { [ "$nf" = 0 ] && grep -q ', 0 failed' "$OUT/batch_$n.txt"; } || fail=1
done
echo "checks done ($(el) s)"
[ $fail = 0 ] || { echo "a forced loop failed its checks: no timings"; exit 1; }
for m in 0 $CFGS; do
    echo "== qgemv_bench f16, TB_CUDA_GEMV_MMA=$m"
    TB_CUDA_GEMV_MMA=$m timeout 60 "$PB/qgemv_bench" --t 4,8 --kinds f16 --reps 3 2>&1 | grep -v '^#' | tail -13
done
wait $eng || { echo "7B engine build FAIL"; tail -3 "$OUT/engine_f16.txt"; exit 1; }
V="base"
for m in $CFGS; do V="$V;TB_CUDA_GEMV_MMA=$m,0;TB_CUDA_GEMV_MMA=$m"; done
timeout 240 "$PB/gpu_bench" /tmp/gm_f16.engine --device cuda --prefill 0 --decode 24 --ctx 128 \
    --batch "${MMA_BATCH:-4,8}" --variants "$V;base" 2>&1 | grep -E 'decode|error|fail'
echo "done ($(el) s)"

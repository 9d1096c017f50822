#!/bin/bash
# bench/gpu/attn_ab.sh — the decode attention's variants (TB_CUDA_ATTN_MMA)
# checked, then timed against each other in one process, on the GPU machine:
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && OUT=/tmp/out bash bench/gpu/attn_ab.sh
#
# 1. test_backend_ops's attention cases (TURBINE_TEST_ONLY=attention) under
#    every variant of AB_VARIANTS, with and without key splits
#    (TB_CUDA_ATTN_BLOCKS=0: none, so a warp's tiles wrap the pipelined
#    kernel's ring); a variant that fails is not timed. Then the pipelined
#    kernels (4: with and without GQA rows) under compute-sanitizer's
#    memcheck and racecheck.
# 2. 4-layer fp8 engines (torch_ckpt.py --layers 4, turbine build --dtype fp8
#    --device cuda) of the 7B shape (32 kv heads: fp8, f16 and int8 caches)
#    and of Llama-3-8B's layers (8 kv heads, groups of 4: fp8, f16 and int8 caches;
#    AB_SKIP_GQA=1: not): gpu_bench decode steps at batch 1 / 64 over ctx 128
#    and batch 1 / 16 over ctx 1000, the variants interleaved (ROUNDS rounds)
#    in one process.
# 3. with FULL=1, the 32-layer engine (AB_FULL_SHAPE, default llama7b):
#    streams 64 and 256 of 128 / 128, fp8 KV, the same variants (~150 s for
#    the build, ~60 s a round).
#
# Env: TB_PREBUILT (default /tmp/pb), OUT (default ./attn_ab), AB_SKIP_CHECK=1
# (no step 1: an earlier run checked the variants), AB_SKIP_L4=1 (no step 2), AB_VARIANTS
# (TB_CUDA_ATTN_MMA values, default "1 3 4": 1 the tensor-core kernel, 3 the
# pipelined one, 4 that with a kv head's q heads in one block, 6 / 7 a warp a
# (token, head) where a step has no key splits; the module's
# default, 5, picks among them and is checked too and timed as "base"), AB_EXTRA (more gpu_bench variants, ';'-separated, timed
# after them each round, e.g. "TB_CUDA_ATTN_MMA=3 TB_CUDA_ATTN_SPLIT_MIN=64":
# not checked in step 1), ROUNDS (default 2), FULL, TB_GPU_DATA (folder holding
# models/llama2_tokenizer.bin, default .devdata/gpu), PY (python3 with torch).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/attn_ab}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
VARS=${AB_VARIANTS:-1 3 4}
ROUNDS=${ROUNDS:-2}
PY=${PY:-python3}
W=${TB_WORK:-/tmp/tb-attn-ab}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

echo "== 1. attention cases under each variant"
good=""
checks="default $VARS" # default: the module's own choice (no TB_CUDA_ATTN_MMA)
[ -n "${AB_SKIP_CHECK:-}" ] && { good=" $VARS"; checks=""; echo "skipped (AB_SKIP_CHECK: a run before checked them)"; }
for v in $checks; do
    ok=1
    for blocks in "" 0; do
        n="ops_mma${v}${blocks:+_b$blocks}"
        mv=(TB_CUDA_ATTN_MMA="$v")
        [ "$v" = default ] && mv=(-u TB_CUDA_ATTN_MMA)
        env "${mv[@]}" TURBINE_TEST_DEVICE=cuda TURBINE_TEST_ONLY=attention \
            ${blocks:+TB_CUDA_ATTN_BLOCKS=$blocks} timeout 120 "$PB/test_backend_ops" > "$OUT/$n.txt" 2>&1
        rc=$?
        echo "${mv[*]}${blocks:+ TB_CUDA_ATTN_BLOCKS=$blocks}: rc $rc, $(grep -c ' bound .* ok$' "$OUT/$n.txt") ok," \
             "$(grep -c ' FAIL$' "$OUT/$n.txt") FAIL; $(grep -o 'cuda: worst.*attention [^ ]*' "$OUT/$n.txt") ($(el) s)"
        grep ' FAIL$' "$OUT/$n.txt" | head -5
        [ $rc = 0 ] || ok=0
    done
    [ $ok = 1 ] && [ "$v" != default ] && good="$good $v"
done
[ -n "$good" ] || { echo "no variant passed: nothing timed"; exit 1; }
# the pipelined kernel's shared-memory ring under compute-sanitizer: out-of-range
# accesses (memcheck) and hazards between its lanes' copies and reads (racecheck)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
# (racecheck also without its cp.async tracking where the tool has that
# switch: its internal errors on the ring's copies are then told apart from
# hazards of the plain shared-memory accesses)
if [ -n "$CS" ] && [ -z "${AB_SKIP_CHECK:-}" ] && [[ " $VARS " == *" 4 "* ]]; then
    runs="memcheck:4 racecheck:3 racecheck:4"
    "$CS" --help 2>&1 | grep -q racecheck-memcpy-async && runs="$runs racecheck-noasync:4"
    for r in $runs; do
        tool=${r%%:*} v=${r##*:} extra=""
        [ "$tool" = racecheck-noasync ] && { tool=racecheck; extra="--racecheck-memcpy-async no"; }
        f="$OUT/san_${r//:/_}.txt"
        # shellcheck disable=SC2086 # extra is a list of words
        TURBINE_TEST_DEVICE=cuda TURBINE_TEST_ONLY=attention TB_CUDA_ATTN_MMA=$v TB_CUDA_ATTN_BLOCKS=0 \
            timeout 300 "$CS" --tool $tool $extra --kernel-name kns=attn_mma_pipe "$PB/test_backend_ops" > "$f" 2>&1
        echo "compute-sanitizer $r${extra:+ ($extra)}: rc $?, $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$f" | tail -1)," \
             "$(grep -c ' ok$' "$f") ok, $(grep -c ' FAIL$\|CHECK failed' "$f") failed ($(el) s)"
        grep -m3 -A4 'Internal\|Race reported\|Error:' "$f" | cut -c1-200
    done
fi
vlist="base" # gpu_bench's first variant is the environment as given (the default kernel)
for _ in $(seq 1 "$ROUNDS"); do
    for v in $good; do vlist="$vlist;TB_CUDA_ATTN_MMA=$v"; done
    [ -n "${AB_EXTRA:-}" ] && vlist="$vlist;$AB_EXTRA"
done
echo "timed variants: $vlist"

# l4 SHAPE KVS: a 4-layer fp8 engine of torch_ckpt.py's SHAPE, decode steps over
# each KV dtype of KVS at ctx 128 (b1, b64) and ctx 1000 (b1, b16)
l4() {
    local shape=$1 kvs=$2 ck=$W/ck4_$1 e=$W/l4_$1_fp8.engine
    [ -f "$ck/config.json" ] || "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$shape" --layers 4 --out "$ck" \
        > "$OUT/ck4_$shape.txt" 2>&1
    [ -f "$e" ] || "$PB/turbine" build "$ck" -o "$e" --tokenizer "$DATA/models/llama2_tokenizer.bin" --dtype fp8 \
        --device cuda --max-seq-len 1024 --max-batch 64 > "$OUT/build4_$shape.txt" 2>&1 ||
        { echo "build failed"; tail -5 "$OUT/build4_$shape.txt"; return 1; }
    for kv in $kvs; do
        for run in "--ctx 128 --batch 1,64" "--ctx 1000 --batch 1,16"; do
            local f="$OUT/l4_${shape}_${kv}_${run//[^0-9]/_}.txt"
            # shellcheck disable=SC2086 # run is a list of words
            timeout 240 "$PB/gpu_bench" "$e" --device cuda --prefill 0 --decode 16 $run --kv-dtype "$kv" \
                --variants "$vlist" > "$f" 2>&1
            echo "$shape, kv $kv, $run: rc $? ($(el) s)"
            grep -E "decode b" "$f" | head -24
        done
    done
}
if [ -z "${AB_SKIP_L4:-}" ]; then
    echo "== 2. 4-layer fp8 engines: the 7B shape (32 kv heads), Llama-3-8B's layers (8 kv heads)"
    l4 llama7b "fp8 f16 int8"
    [ -z "${AB_SKIP_GQA:-}" ] && l4 llama3_8b_v32k "fp8 f16 int8"
fi

if [ -n "${FULL:-}" ]; then
    echo "== 3. 32-layer fp8 engine (${AB_FULL_SHAPE:-llama7b}), streams"
    FS=${AB_FULL_SHAPE:-llama7b}
    CK32=$W/ck32_$FS
    [ -f "$CK32/config.json" ] || "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$FS" --out "$CK32" > "$OUT/ck32.txt" 2>&1
    E32=$W/l32_${FS}_fp8.engine
    [ -f "$E32" ] || "$PB/turbine" build "$CK32" -o "$E32" --tokenizer "$DATA/models/llama2_tokenizer.bin" --dtype fp8 \
        --device cuda --max-seq-len 1024 --max-batch 64 > "$OUT/build32.txt" 2>&1 || { echo "build failed"; exit 1; }
    timeout 400 "$PB/gpu_bench" "$E32" --device cuda --prefill 0 --decode 16 --ctx 128 --batch 1,64 \
        --streams 64,256 --kv-dtype fp8 --variants "$vlist" > "$OUT/l32_streams.txt" 2>&1
    echo "streams: rc $? ($(el) s)"
    grep -E "decode b|streams|picks" "$OUT/l32_streams.txt" | head -30
fi
echo "done ($(el) s)"

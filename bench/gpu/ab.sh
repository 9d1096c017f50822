#!/bin/bash
# bench/gpu/ab.sh — correctness, then A/B of backend switches on the ONNX
# engines of bench/gpu/onnx.sh, interleaved, on one GPU:
#
#   TB_PREBUILT=/tmp/pb OUT=/tmp/out bash bench/gpu/ab.sh
#
# 1. test_nn_cuda as bench/gpu/run.sh runs it (TURBINE_TEST_DEVICE=cuda)
#    (SKIP_TESTS=1: not), with TEST_NW1=1 again with every short-sequence
#    sdpa on 1-warp blocks (TB_CUDA_MHA_NW=1)
# 2. BERT-base (seq 128) and ResNet-18 f16 engines built as onnx.sh builds
#    them (the ResNet-18 build verbose: its convolutions' cuDNN algorithms);
#    ENGINES=DIR: onnx.sh's DIR/bert_f16.engine and resnet_f16.engine instead
# 3. the BERT f16 engine on 4 random sequences under each switch set,
#    against the default (max |d|) and against the f32-arithmetic attention
# 4. GPU time of the replayed graph (TB_CUDA_GRAPH_TIMES=1) for each switch
#    set of AB_BERT / AB_RESNET (';'-separated env assignments, "-" for
#    none), batch 1 and 8, ROUNDS rounds interleaved; a table last
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ -f "$SRC/tests/onnx/make_models.py" ] || SRC=$(pwd)
OUT=${OUT:-/tmp/ab}
P=${TB_PREBUILT:-/tmp/pb}
T=$P/turbine
W=${TB_WORK:-/tmp/tb-ab}
ROUNDS=${ROUNDS:-2}
DUR=${DUR:-1}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$P/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== 1. test_nn_cuda"
    S=$(date +%s)
    TURBINE_TEST_DEVICE=cuda TURBINE_SRC="$SRC" TURBINE_TMP="$W" "$P/test_nn_cuda" > "$OUT/test_nn_cuda.txt" 2>&1
    echo "rc $? ($(( $(date +%s) - S )) s): $(grep -c ' ok' "$OUT/test_nn_cuda.txt") ok, $(grep -c FAIL "$OUT/test_nn_cuda.txt") FAIL; $(tail -n 1 "$OUT/test_nn_cuda.txt")"
    grep -E "FAIL|layernorm" "$OUT/test_nn_cuda.txt" | head -30
    [ -n "${TEST_NW1:-}" ] && TB_CUDA_MHA_NW=1 TURBINE_TEST_DEVICE=cuda TURBINE_SRC="$SRC" TURBINE_TMP="$W" "$P/test_nn_cuda" > "$OUT/test_nw1.txt" 2>&1
    [ -n "${TEST_NW1:-}" ] && echo "TB_CUDA_MHA_NW=1: rc $?: $(grep -c ' ok' "$OUT/test_nw1.txt") ok, $(grep -c FAIL "$OUT/test_nw1.txt") FAIL"
    [ -n "${TEST_NW1:-}" ] && grep FAIL "$OUT/test_nw1.txt" | head -10
fi
if [ -n "${ENGINES:-}" ]; then # engines onnx.sh built: $ENGINES/bert_f16.engine, resnet_f16.engine
    ln -sf "$ENGINES/bert_f16.engine" "$W/bert.engine"
    ln -sf "$ENGINES/resnet_f16.engine" "$W/resnet.engine"
else
echo "== 2. engines"
python3 "$SRC/tests/onnx/make_models.py" "$W/big" --models bert,resnet18 --opsets 17 --no-data > "$OUT/exports.txt" 2>&1 ||
    echo "FAIL: exports"
$T build "$W/big/bert_opset17/model.onnx" -o "$W/bert.engine" --device cuda --dtype f16 \
    --min-shapes input_ids:1x128,attention_mask:1x128 --opt-shapes input_ids:8x128,attention_mask:8x128 \
    --max-shapes input_ids:8x128,attention_mask:8x128 > "$OUT/build_bert.txt" 2>&1 || echo "FAIL: build bert"
grep -iE "top-1|max abs" "$OUT/build_bert.txt" | head -4
$T build "$W/big/resnet18_opset17/model.onnx" -o "$W/resnet.engine" --device cuda --dtype f16 \
    --min-shapes input:1x3x224x224 --opt-shapes input:8x3x224x224 --max-shapes input:8x3x224x224 --verbose \
    > "$OUT/build_resnet.txt" 2>&1 || echo "FAIL: build resnet"
grep -iE "top-1|max abs" "$OUT/build_resnet.txt" | head -4
grep -E "graph replays, ms" "$OUT/build_resnet.txt" | sed 's/.*Conv x //' | cut -c1-330 | head -24
fi
echo "== 3. BERT f16 outputs under each switch set"
python3 - "$W/in" <<'PY'
import os, sys
import numpy as np
from onnx import numpy_helper
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(5)
ids = rng.integers(0, 30522, size=(4, 128)).astype(np.int64)
m = np.zeros((4, 128), np.float32)
m[1, 90:] = -10000.0
m[3, 21:] = -10000.0
for k, a in enumerate([ids, m]):
    open(f"{d}/input_{k}.pb", "wb").write(numpy_helper.from_array(a).SerializeToString())
PY
IFS=';' read -r -a BS <<< "${AB_BERT:--}"
IFS=';' read -r -a RS <<< "${AB_RESNET:--}"
k=0
for E in "${BS[@]}" "TB_CUDA_SDPA_F32=1 TB_CUDA_MHA_SHORT=0"; do
    [ "$E" = "-" ] && E=""
    env $E $T exec "$W/bert.engine" --inputs "$W/in" --outputs "$W/o$k" > "$OUT/exec$k.txt" 2>&1 || echo "FAIL: exec [$E]"
    k=$((k + 1))
done
python3 - "$W" "$k" "${BS[@]}" "f32 attention" <<'PY'
import glob, sys
import numpy as np
from onnx import TensorProto, numpy_helper
w, n, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rd(p):
    t = TensorProto()
    t.ParseFromString(open(p, "rb").read())
    return numpy_helper.to_array(t).astype(np.float32)
for f in sorted(glob.glob(f"{w}/o0/*.pb")):
    b = f.split("/")[-1]
    a = rd(f)
    for k in range(1, n):
        o = rd(f"{w}/o{k}/{b}")
        d = np.abs(a - o).max()
        print(f"{b}: [{names[0]}] vs [{names[k]}] max|d| {d:.3g} (max|x| {np.abs(a).max():.3g})"
              f"{'  FAIL' if not d <= 0.01 * np.abs(a).max() else ''}")
PY
echo "== 4. GPU time of the replayed graph, ms (mean; $ROUNDS rounds interleaved)"
: > "$OUT/times.txt"
for R in $(seq 1 "$ROUNDS"); do
    for E in "${BS[@]}"; do
        for B in 1 8; do
            env $([ "$E" = "-" ] || echo "$E") TB_CUDA_GRAPH_TIMES=1 $T bench --engine "$W/bert.engine" --device cuda \
                --duration "$DUR" --shapes input_ids:${B}x128,attention_mask:${B}x128 > "$W/b.txt" 2>&1
            echo "bert b$B [$E] r$R $(grep -oE 'GPU time mean [0-9.]+ ms, min [0-9.]+' "$W/b.txt") $(grep -oE 'graph of [0-9]+' "$W/b.txt" | tail -1)" >> "$OUT/times.txt"
        done
    done
    for E in "${RS[@]}"; do
        for B in 1 8; do
            env $([ "$E" = "-" ] || echo "$E") TB_CUDA_GRAPH_TIMES=1 $T bench --engine "$W/resnet.engine" --device cuda \
                --duration "$DUR" --shapes input:${B}x3x224x224 > "$W/b.txt" 2>&1
            echo "resnet b$B [$E] r$R $(grep -oE 'GPU time mean [0-9.]+ ms, min [0-9.]+' "$W/b.txt") $(grep -oE 'graph of [0-9]+' "$W/b.txt" | tail -1)" >> "$OUT/times.txt"
        done
    done
done
sort "$OUT/times.txt"

#!/bin/bash
# bench/gpu/onnx.sh — ONNX engines on one GPU: correctness first, then timing.
#
#   TB_PREBUILT=/tmp/pb OUT=/tmp/out bash bench/gpu/onnx.sh
#
# 1. exports : tests/onnx/make_models.py --small (ResNet-18, BERT-style,
#              GPT-2-style at opset 17) with PyTorch's outputs
# 2. models  : every small model and data set through `turbine exec --device
#              cuda` (in memory) and `turbine build --device cuda` + exec,
#              against PyTorch (tests/onnx/run_models.py)
#    2b      : the tune cache: the small BERT engine benched twice on one
#              fresh TURBINE_TUNE_CACHE folder; the second run adds no pick
# 3. nodes   : ONNX's node tests shipped with the onnx package there, opsets
#              13-21, through `turbine exec --device cuda`
# 4. timing  : BERT-base shape (seq 128) and ResNet-18 (224x224), batch 1 and
#              8: `turbine bench --engine` of f32 (and, with TB_F16=1, f16)
#              engines built for cuda; PyTorch eager and CUDA-graph on the same
#              modules (bench/onnx/torch_gpu.py) in the same run
#              the engines run with TB_CUDA_GRAPH_TIMES=1: besides the run's
#              latency (input upload and output download included) the
#              backend reports the GPU time of the replayed CUDA graph alone
#              (CUDA events), the figure comparable with PyTorch's graph
#              replays; with TB_F16, PyTorch f16 ResNet-18 channels-last too
# 5. f16     : (TB_F16) the BERT-base f16 engine on 4 random sequences with the
#              attention Transposes folded and not (TB_CUDA_FOLD_TRANSPOSE=0:
#              outputs must be identical) and with the f32-arithmetic
#              attention kernel (TB_CUDA_SDPA_F32=1: outputs close)
# 6. passes  : (TB_F16) BERT-base f16 built without attention-heads / merge-qkv
#              (TB_OPT_SKIP), benched interleaved with the default engine (GPU
#              time and the captured graph's node count), outputs compared
# Env: TB_PREBUILT (folder with turbine and libturbine_cuda.so), OUT,
# TB_SKIP_NODES, TB_SKIP_TIMING, TB_SKIP_PASSES (step 6), TB_F16, TB_TORCH_DTYPES (PyTorch baselines, default "f32 f16"),
# TB_DTYPES (turbine engines timed in step 4, default "f32" and "f16" with TB_F16).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$SRC/bench/out/gpu-onnx}
T=${TB_PREBUILT:-$SRC/build}/turbine
PY=${TB_PYTHON:-python3}
W=${TB_WORK:-/tmp/tb-onnx}
mkdir -p "$OUT" "$W"
LOG=$OUT/onnx_log.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
export LD_LIBRARY_PATH=${TB_PREBUILT:-/nonexistent}/lib:${LD_LIBRARY_PATH:-}

say "== 1. exports"
$PY "$SRC/tests/onnx/make_models.py" "$W/small" --small --opsets 17 >> "$LOG" 2>&1 || say "FAIL: small exports"

say "== 2. models on cuda"
$PY "$SRC/tests/onnx/run_models.py" --turbine "$T" --dir "$W/small" --mode both \
    --exec-arg=--device --exec-arg=cuda --build-arg=--device --build-arg=cuda 2>&1 | tee -a "$LOG" | tail -12

# 2b. the tune cache (src/tune/tune_cache.h): a first run of the small BERT
# engine times cuBLASLt's candidates of its matmuls and keeps each pick
# ("nn" records) in a fresh folder; a second run reads them and times none
say "== 2b. tune cache: general engines' cuBLASLt picks kept on disk"
TC=$W/tunecache
rm -rf "$TC"
if $T build "$W/small/bert_opset17/model.onnx" -o "$W/tc_bert.engine" --device cuda \
        --shapes input_ids:2x16,attention_mask:2x16 >> "$LOG" 2>&1; then
    tc_n=()
    for _ in 1 2; do
        TURBINE_TUNE_CACHE=$TC $T bench --engine "$W/tc_bert.engine" --device cuda --iterations 5 --duration 0 \
            >> "$LOG" 2>&1
        tc_n+=("$(cat "$TC"/tune-*.txt 2>/dev/null | grep -c '^nn ')")
    done
    if [ "${tc_n[0]}" -gt 0 ] && [ "${tc_n[1]}" = "${tc_n[0]}" ]; then
        say "PASS tune cache: ${tc_n[0]} picks kept by the first run, none added by the second"
    else
        say "FAIL tune cache: the first run kept ${tc_n[0]}, the file after the second has ${tc_n[1]}"
    fi
else
    say "FAIL tune cache: build of the small BERT engine"
fi

if [ -z "${TB_SKIP_NODES:-}" ]; then
    say "== 3. node tests on cuda"
    NODE=$($PY -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node"))')
    TURBINE_EXEC_ARGS="--device cuda" $PY "$SRC/tests/onnx/run_node_tests.py" --turbine "$T" --data "$NODE" \
        --opsets 13-21 --jobs 8 --allow-fail "$SRC/tests/onnx/node_allow_fail.txt" \
        --markdown "$OUT/node_tests_cuda.md" > "$OUT/node_tests_cuda.txt" 2>&1
    tail -3 "$OUT/node_tests_cuda.txt" | tee -a "$LOG"
fi

if [ -z "${TB_SKIP_TIMING:-}" ]; then
    say "== 4. timing"
    $PY "$SRC/tests/onnx/make_models.py" "$W/big" --models bert,resnet18 --opsets 17 --no-data >> "$LOG" 2>&1 ||
        say "FAIL: big exports"
    for DT in ${TB_DTYPES:-f32 ${TB_F16:+f16}}; do
        $T build "$W/big/bert_opset17/model.onnx" -o "$W/bert_$DT.engine" --device cuda --dtype $DT \
            --min-shapes input_ids:1x128,attention_mask:1x128 --opt-shapes input_ids:8x128,attention_mask:8x128 \
            --max-shapes input_ids:8x128,attention_mask:8x128 >> "$LOG" 2>&1 || say "FAIL: build bert $DT"
        $T build "$W/big/resnet18_opset17/model.onnx" -o "$W/resnet_$DT.engine" --device cuda --dtype $DT \
            --min-shapes input:1x3x224x224 --opt-shapes input:8x3x224x224 --max-shapes input:8x3x224x224 \
            >> "$LOG" 2>&1 || say "FAIL: build resnet18 $DT"
        for B in 1 8; do
            TB_CUDA_GRAPH_TIMES=1 $T bench --engine "$W/bert_$DT.engine" --device cuda \
                --shapes input_ids:${B}x128,attention_mask:${B}x128 --json "$OUT/bert_${DT}_b$B.json" 2>&1 |
                tee -a "$LOG" | grep -E "engine:|latency|compute|GPU time"
            TB_CUDA_GRAPH_TIMES=1 $T bench --engine "$W/resnet_$DT.engine" --device cuda --shapes input:${B}x3x224x224 \
                --json "$OUT/resnet_${DT}_b$B.json" 2>&1 | tee -a "$LOG" | grep -E "engine:|latency|compute|GPU time"
        done
        $T bench --engine "$W/bert_$DT.engine" --device cuda --shapes input_ids:1x128,attention_mask:1x128 \
            --dump-profile --iterations 20 --duration 0 > "$OUT/bert_${DT}_profile.txt" 2>&1
        $T bench --engine "$W/resnet_$DT.engine" --device cuda --shapes input:1x3x224x224 \
            --dump-profile --iterations 20 --duration 0 > "$OUT/resnet_${DT}_profile.txt" 2>&1
    done
    for DT in ${TB_TORCH_DTYPES:-f32 f16}; do
        $PY "$SRC/bench/onnx/torch_gpu.py" --models bert,resnet18 --batch 1,8 --dtype $DT \
            --json "$OUT/torch_$DT.json" 2>&1 | tee -a "$LOG" | grep '"model"'
    done
    if [ -n "${TB_F16:-}" ]; then
        $PY "$SRC/bench/onnx/torch_gpu.py" --models resnet18 --batch 1,8 --dtype f16 --channels-last \
            --json "$OUT/torch_f16_cl.json" 2>&1 | tee -a "$LOG" | grep '"model"'
    fi
fi

if [ -n "${TB_F16:-}" ] && [ -z "${TB_SKIP_TIMING:-}" ] && [ -f "$W/bert_f16.engine" ]; then
    say "== 5. f16 attention: folded Transposes and the tensor-core kernel against the others"
    $PY - "$W/f16in" <<'PY' >> "$LOG" 2>&1
import os, sys
import numpy as np
from onnx import numpy_helper
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(3)
ids = rng.integers(0, 30522, size=(4, 128)).astype(np.int64)
m = np.zeros((4, 128), np.float32)
m[1, 100:] = -10000.0
m[3, 17:] = -10000.0
for k, a in enumerate([ids, m]):
    open(f"{d}/input_{k}.pb", "wb").write(numpy_helper.from_array(a).SerializeToString())
PY
    $T exec "$W/bert_f16.engine" --inputs "$W/f16in" --outputs "$W/f16_fold" >> "$LOG" 2>&1 || say "FAIL: exec f16"
    TB_CUDA_FOLD_TRANSPOSE=0 $T exec "$W/bert_f16.engine" --inputs "$W/f16in" --outputs "$W/f16_nofold" \
        >> "$LOG" 2>&1 || say "FAIL: exec f16 unfolded"
    TB_CUDA_FOLD_TRANSPOSE=0 TB_CUDA_SDPA_F32=1 $T exec "$W/bert_f16.engine" --inputs "$W/f16in" \
        --outputs "$W/f16_f32attn" >> "$LOG" 2>&1 || say "FAIL: exec f16 f32 attention"
    $PY - "$W" <<'PY' 2>&1 | tee -a "$LOG"
import glob, sys
import numpy as np
from onnx import TensorProto, numpy_helper
w = sys.argv[1]
def rd(p):
    t = TensorProto()
    t.ParseFromString(open(p, "rb").read())
    return numpy_helper.to_array(t).astype(np.float32)
bad = 0
for f in sorted(glob.glob(f"{w}/f16_fold/*.pb")):
    b = f.split("/")[-1]
    a, n, r = rd(f), rd(f"{w}/f16_nofold/{b}"), rd(f"{w}/f16_f32attn/{b}")
    dn, dr, top = np.abs(a - n).max(), np.abs(n - r).max(), np.abs(r).max()
    ok = dn == 0 and dr <= 0.01 * top
    bad += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {b}: folded vs not max|d| {dn:.3g}; tensor-core vs f32 attention max|d| {dr:.3g} "
          f"(max|x| {top:.3g})")
print(f"f16 attention check: {'FAIL' if bad else 'ok'}")
PY
fi
if [ -n "${TB_F16:-}" ] && [ -z "${TB_SKIP_TIMING:-}" ] && [ -z "${TB_SKIP_PASSES:-}" ] && [ -f "$W/bert_f16.engine" ] &&
    [ -d "$W/f16in" ]; then
    say "== 6. BERT f16 without the attention layout passes (TB_OPT_SKIP), same run, interleaved"
    SKIP=attention-heads,merge-qkv
    TB_OPT_SKIP=$SKIP $T build "$W/big/bert_opset17/model.onnx" -o "$W/bert_f16_nolayout.engine" --device cuda \
        --dtype f16 --min-shapes input_ids:1x128,attention_mask:1x128 --opt-shapes input_ids:8x128,attention_mask:8x128 \
        --max-shapes input_ids:8x128,attention_mask:8x128 >> "$LOG" 2>&1 || say "FAIL: build bert f16 without $SKIP"
    for R in 1 2; do
        for E in bert_f16 bert_f16_nolayout; do
            for B in 1 8; do
                say "-- $E batch $B (round $R)"
                TB_CUDA_GRAPH_TIMES=1 $T bench --engine "$W/$E.engine" --device cuda --duration 2 \
                    --shapes input_ids:${B}x128,attention_mask:${B}x128 2>&1 | tee -a "$LOG" |
                    grep -E "latency|GPU time|graph of"
            done
        done
    done
    $T exec "$W/bert_f16_nolayout.engine" --inputs "$W/f16in" --outputs "$W/f16_nolayout" >> "$LOG" 2>&1 ||
        say "FAIL: exec f16 without $SKIP"
    $PY - "$W" <<'PY' 2>&1 | tee -a "$LOG"
import glob, sys
import numpy as np
from onnx import TensorProto, numpy_helper
w = sys.argv[1]
def rd(p):
    t = TensorProto()
    t.ParseFromString(open(p, "rb").read())
    return numpy_helper.to_array(t).astype(np.float32)
for f in sorted(glob.glob(f"{w}/f16_fold/*.pb")):
    b = f.split("/")[-1]
    a, n = rd(f), rd(f"{w}/f16_nolayout/{b}")
    print(f"{b}: with vs without the layout passes max|d| {np.abs(a - n).max():.3g} (max|x| {np.abs(n).max():.3g})")
PY
fi
say "== done"

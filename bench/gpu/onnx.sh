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
# 3. nodes   : ONNX's node tests shipped with the onnx package there, opsets
#              13-21, through `turbine exec --device cuda`
# 4. timing  : BERT-base shape (seq 128) and ResNet-18 (224x224), batch 1 and
#              8: `turbine bench --engine` of f32 (and, with TB_F16=1, f16)
#              engines built for cuda; PyTorch eager and CUDA-graph on the same
#              modules (bench/onnx/torch_gpu.py) in the same run
# Env: TB_PREBUILT (folder with turbine and libturbine_cuda.so), OUT,
# TB_SKIP_NODES, TB_SKIP_TIMING, TB_F16, TB_TORCH_DTYPES (PyTorch baselines, default "f32 f16").
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
    for DT in f32 ${TB_F16:+f16}; do
        $T build "$W/big/bert_opset17/model.onnx" -o "$W/bert_$DT.engine" --device cuda --dtype $DT \
            --min-shapes input_ids:1x128,attention_mask:1x128 --opt-shapes input_ids:8x128,attention_mask:8x128 \
            --max-shapes input_ids:8x128,attention_mask:8x128 >> "$LOG" 2>&1 || say "FAIL: build bert $DT"
        $T build "$W/big/resnet18_opset17/model.onnx" -o "$W/resnet_$DT.engine" --device cuda --dtype $DT \
            --min-shapes input:1x3x224x224 --opt-shapes input:8x3x224x224 --max-shapes input:8x3x224x224 \
            >> "$LOG" 2>&1 || say "FAIL: build resnet18 $DT"
        for B in 1 8; do
            $T bench --engine "$W/bert_$DT.engine" --device cuda --shapes input_ids:${B}x128,attention_mask:${B}x128 \
                --json "$OUT/bert_${DT}_b$B.json" 2>&1 | tee -a "$LOG" | grep -E "throughput|latency|compute"
            $T bench --engine "$W/resnet_$DT.engine" --device cuda --shapes input:${B}x3x224x224 \
                --json "$OUT/resnet_${DT}_b$B.json" 2>&1 | tee -a "$LOG" | grep -E "throughput|latency|compute"
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
fi
say "== done"

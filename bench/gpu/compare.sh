#!/bin/bash
# bench/gpu/compare.sh — the precision experiment (bench/compare_precisions.sh)
# on one GPU, from packed binaries and carried model files, in about 5 minutes:
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz &&
#     TB_PREBUILT=/tmp/pb OUT=$OUT bash bench/gpu/compare.sh
#
# ONNX: ResNet-18 (TB_GPU_DATA/resnet18/model.onnx, or model.onnx.xz, which is
# unpacked into TB_WORK, or else exported there by tests/onnx/make_models.py
# when python has torch, torchvision and onnx), f32 and f16 engines built and served on the GPU,
# int8 on the CPU (turbine's int8 ONNX engines are CPU-only; the report says
# so), calibrated on TB_GPU_DATA/resnet18/calib/input_K.npy when carried, else
# on 8 seeded random inputs made with numpy. KServe v2 load: closed loop
# at TB_ONNX_C (default 1,8,32), each point bounded by 400 requests and
# 3 s.
# LLM: TB_LLM (a checkpoint; default: the 134M Llama-shape preset of
# tests/gen_checkpoints.py in f16, random weights, made here with numpy, with
# TB_GPU_DATA/models/llama2_tokenizer.bin); engines f32 (the accuracy
# reference) f16 int8 int4 fp8 (TB_LLM_DTYPES), each compared with f32 by
# turbine compare on the first 512 tokens of tinyshakespeare
# (TB_GPU_DATA/data/tinyshakespeare.txt; without it, of docs/*.md), served over the OpenAI API and loaded
# at TB_LLM_C (default 1,8,32) with 128-token prompts and 64 output tokens,
# each point bounded by 64 requests and 3 s; SLO: TTFT p99 <= 200 ms.
# Estimated: ~2 min ONNX, ~3 min LLM (5 engines: build, compare, serve, 3
# points each) on an H200 host with 16 cores.
# Random weights make perplexity meaningless (it is about the vocabulary
# size); top-1 agreement and KL against f32 still measure the precision.
#
# Writes $OUT/report.html, $OUT/report.json, $OUT/llm.json, $OUT/log.txt and
# every engine's build / serve / bench logs under $OUT (engines are kept in
# TB_WORK, not $OUT). The whole experiment runs under `timeout` (TB_BUDGET_S,
# default 330 s); on a timeout the report is written from the precisions
# that finished.
#
# Env: OUT, TB_PREBUILT, TB_GPU_DATA (default .devdata/gpu), TB_WORK (default
# /tmp/tb-gpu-compare), TB_DEVICE (cuda), TB_BUDGET_S, TB_ONNX_DTYPES
# (f32,f16,int8), TB_ONNX_C, TB_ONNX_MAXB (32), TB_LLM, TB_LLM_TOKENIZER,
# TB_LLM_DTYPES, TB_LLM_C, TB_PYTHON (python3; numpy only, no onnx module).
# What .devdata/gpu needs besides prebuilt.tar.xz: resnet18/model.onnx (45 MiB)
# or resnet18/model.onnx.xz (41 MiB, `xz -6`), models/llama2_tokenizer.bin;
# optionally resnet18/calib/ (bench/onnx/run.sh's calib_resnet18) and
# data/tinyshakespeare.txt.
#
# Dry run on a machine without a GPU: TB_DEVICE=cpu bash bench/gpu/compare.sh
# (build/turbine unless TB_PREBUILT; the stories260K checkpoint of
# TB_GPU_DATA/models or ../shared/models instead of the 134M preset; ResNet-18
# from /tmp/big when TB_GPU_DATA has none; two short points per sweep).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$SRC/bench/out/gpu-compare}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
W=${TB_WORK:-/tmp/tb-gpu-compare}
PY=${TB_PYTHON:-python3}
DEV=${TB_DEVICE:-cuda}
BUDGET=${TB_BUDGET_S:-330}
mkdir -p "$OUT" "$W"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
T0=$(date +%s)

# binaries and the libraries they load, as bench/gpu/run.sh sets them up
LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && LIBS="$d" && break
done
if [ -z "$LIBS" ] && [ "$DEV" != cpu ]; then
    f=$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS=$(dirname "$f")
fi
if [ -n "${TB_PREBUILT:-}" ]; then
    TB=$TB_PREBUILT/turbine
    LIBS="$TB_PREBUILT/lib${LIBS:+:$LIBS}"
else
    TB=${TURBINE:-$SRC/build/turbine}
fi
[ -x "$TB" ] || { say "compare.sh: no turbine at $TB (TB_PREBUILT=DIR or TURBINE=FILE)"; exit 1; }
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "== $(date -u '+%Y-%m-%d %H:%M UTC') device $DEV, turbine $TB"
[ "$DEV" != cpu ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"

# the ONNX model and its calibration inputs
M=""
for f in "$DATA/resnet18/model.onnx" "$DATA/resnet18/model.onnx.xz" /tmp/big/resnet18_opset17/model.onnx; do
    [ -f "$f" ] && M=$f && break
done
# none carried: exported here when this machine's python has torch, torchvision and onnx
if [ -z "$M" ] && "$PY" -c 'import torch, torchvision, onnx' > /dev/null 2>&1; then
    say "exporting ResNet-18 (tests/onnx/make_models.py, random weights, opset 17)"
    "$PY" "$SRC/tests/onnx/make_models.py" "$W/onnx" --models resnet18 --opsets 17 --no-data >> "$LOG" 2>&1 &&
        M=$W/onnx/resnet18_opset17/model.onnx
fi
[ -n "$M" ] || { say "compare.sh: no ResNet-18 ONNX (copy /tmp/big/resnet18_opset17/model.onnx to $DATA/resnet18/)"; exit 1; }
if [ "${M%.xz}" != "$M" ]; then
    xz -dc "$M" > "$W/resnet18.onnx" || { say "compare.sh: cannot unpack $M"; exit 1; }
    M=$W/resnet18.onnx
fi
CAL=""
for c in "$DATA/resnet18/calib" /tmp/big/calib_resnet18; do
    [ -f "$c/input_0.npy" ] && CAL=$c && break
done
if [ -z "$CAL" ]; then
    CAL=$W/calib
    mkdir -p "$CAL"
    "$PY" -c 'import numpy as np, sys
r = np.random.default_rng(1)
for k in range(8): np.save("%s/input_%d.npy" % (sys.argv[1], k), r.standard_normal((1, 3, 224, 224)).astype(np.float32))' "$CAL" \
        >> "$LOG" 2>&1 || { say "compare.sh: no calibration inputs (numpy missing?)"; exit 1; }
fi

# the LLM checkpoint, its tokenizer and the text turbine compare scores
TEXT=$W/text.txt
SHAKES=$DATA/data/tinyshakespeare.txt
[ -f "$SHAKES" ] || SHAKES=$SRC/../shared/data/tinyshakespeare.txt
# without tinyshakespeare, the project's own prose (turbine compare needs some text, not this one)
if [ ! -f "$SHAKES" ]; then
    SHAKES=$W/docs.txt
    cat "$SRC"/docs/*.md > "$SHAKES"
fi
head -c 20000 "$SHAKES" > "$TEXT"
LLM=${TB_LLM:-} LTOK=${TB_LLM_TOKENIZER:-}
if [ -z "$LLM" ]; then
    if [ "$DEV" = cpu ]; then
        S=$DATA/models/stories260K
        [ -f "$S/stories260K.bin" ] || S=$SRC/../shared/models/stories260K
        LLM=$S/stories260K.bin LTOK=$S/tok512.bin
    else
        LLM=$W/llama134m LTOK=$DATA/models/llama2_tokenizer.bin
        if [ ! -f "$LLM/config.json" ]; then
            say "== making the 134M checkpoint ($(( $(date +%s) - T0 )) s)"
            "$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m --dtype f16 --out "$LLM" >> "$LOG" 2>&1 ||
                { say "compare.sh: gen_checkpoints.py llama134m failed (numpy?)"; exit 1; }
        fi
    fi
fi
tokargs=()
[ -n "$LTOK" ] && tokargs=(--llm-tokenizer "$LTOK")

if [ "$DEV" = cpu ]; then
    # f16 ONNX engines are slow on a CPU (seconds a request): the dry run leaves them out
    onnx=(-c "${TB_ONNX_C:-1,2}" -n 8 --max-batch-size 4 --accuracy-n 8 --slo-ms 1000 --dtypes "${TB_ONNX_DTYPES:-f32,int8}")
    llm=(--llm-c "${TB_LLM_C:-1,2}" --llm-n 6 --llm-input-len 32 --llm-output-len 16 --llm-max-tokens 256
         --llm-slo-ms 2000)
else
    onnx=(-c "${TB_ONNX_C:-1,8,32}" -n 400 --duration 3 --max-batch-size 32 --max-queue-delay-us 500
          --accuracy-n 32 --slo-ms 20 --dtypes "${TB_ONNX_DTYPES:-f32,f16,int8}")
    llm=(--llm-c "${TB_LLM_C:-1,8,32}" --llm-n 64 --llm-duration 3 --llm-input-len 128 --llm-output-len 64
         --llm-max-tokens 512 --llm-slo-ms 200 --llm-max-batch 32 --llm-max-seq-len 512)
fi
[ -n "${TB_LLM_DTYPES:-}" ] && llm+=(--llm-dtypes "$TB_LLM_DTYPES")

say "== compare_precisions.sh (budget $BUDGET s)"
TURBINE=$TB TB_PYTHON=$PY timeout "$BUDGET" bash "$SRC/bench/compare_precisions.sh" --device "$DEV" --model "$M" \
    --calib-data "$CAL" --min-shapes input:1x3x224x224 --max-shapes "input:${TB_ONNX_MAXB:-$([ "$DEV" = cpu ] && echo 4 || echo 32)}x3x224x224" \
    --out "$OUT" "${onnx[@]}" --llm "$LLM" "${tokargs[@]}" --llm-text "$TEXT" "${llm[@]}" >> "$LOG" 2>&1
rc=$?
if [ $rc != 0 ]; then
    say "compare_precisions.sh exited $rc ($([ $rc = 124 ] && echo "the $BUDGET s budget ran out" || echo failed)); the report from what finished:"
    tail -n 15 "$LOG"
    slo=$(grep -o '"slo_ms": [0-9.]*' "$OUT/config.json" 2>/dev/null | grep -o '[0-9.]*$')
    "$PY" "$SRC/bench/compare/compare.py" report "$OUT" "${slo:-20}" "$([ "$DEV" = cpu ] && echo 2000 || echo 200)" 2>&1 | tee -a "$LOG"
fi
# the engines stay out of $OUT (it comes back over the wire)
find "$OUT" -name model.engine -delete
grep -E '^(f32|f16|int8|llm) ' "$LOG" | tail -n 12
say "== done in $(( $(date +%s) - T0 )) s: $OUT/report.html"
[ $rc = 0 ]

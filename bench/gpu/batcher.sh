#!/bin/bash
# bench/gpu/batcher.sh — the dynamic batcher of `turbine serve` on the GPU:
# bench/serve_batching.sh on a ResNet-18 f16 engine built for cuda:0, with
# one and with two instances, each run traced (TURBINE_BATCHER_TRACE) and its
# half-load point read back by bench/batcher_trace.py (queue, call times,
# the arrivals' burstiness), on the GPU machine:
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && OUT=$OUT bash bench/gpu/batcher.sh
#
# The model: TB_GPU_DATA/resnet18/model.onnx (or .onnx.xz), else exported by
# tests/onnx/make_models.py (random weights, opset 17) when python3 has
# torch, torchvision and onnx. SIZES="224 64" adds the 64x64 test variant
# (100 classes; a request of 48 KB instead of 588 KB). Env: TB_PREBUILT
# (default /tmp/pb), OUT, BATCH (max batch, default 8), DELAY_US (default
# 2000), CONC (default 32), DUR (seconds a point, default 4), INSTANCES
# (default "1 2"), SIZES (default 224), TB_WORK.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/batcher_out}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
W=${TB_WORK:-/tmp/tb_batcher}
B=${BATCH:-8}
DUR=${DUR:-4}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
for sz in ${SIZES:-224}; do
    M=""
    small=()
    [ "$sz" = 224 ] || small=(--small)
    if [ "$sz" = 224 ]; then
        for f in "$DATA/resnet18/model.onnx" "$DATA/resnet18/model.onnx.xz"; do [ -f "$f" ] && M=$f && break; done
    fi
    if [ -z "$M" ]; then
        python3 "$SRC/tests/onnx/make_models.py" "$W/onnx$sz" "${small[@]}" --models resnet18 --opsets 17 --no-data \
            > "$W/export$sz.txt" 2>&1 && M=$W/onnx$sz/resnet18_opset17/model.onnx
    fi
    [ -n "$M" ] || { echo "batcher.sh: no ResNet-18 ONNX ($sz)"; tail -3 "$W/export$sz.txt"; exit 1; }
    case $M in *.xz) xz -dc "$M" > "$W/r18.onnx" && M=$W/r18.onnx ;; esac
    ENG=$W/r18_${sz}_f16.engine
    "$PB/turbine" build "$M" -o "$ENG" --dtype f16 --device cuda --min-shapes "input:1x3x${sz}x${sz}" \
        --opt-shapes "input:${B}x3x${sz}x${sz}" --max-shapes "input:${B}x3x${sz}x${sz}" > "$W/build$sz.txt" 2>&1 ||
        { echo "build failed ($sz)"; tail -5 "$W/build$sz.txt"; exit 1; }
    echo "== ResNet-18 ${sz}x${sz} f16 engine built ($(el) s)"
    for n in ${INSTANCES:-1 2}; do
        tr=$W/trace_${sz}_$n
        rm -f "$tr".*
        TURBINE_BATCHER_TRACE=$tr TURBINE=$PB/turbine bash "$SRC/bench/serve_batching.sh" "$ENG" --device cuda \
            --max-batch-size "$B" --delay-us "${DELAY_US:-2000}" -c "${CONC:-32}" --duration "$DUR" --rounds 1 \
            --instance-count "$n" --out "$W/out_${sz}_$n" > "$W/run_${sz}_$n.txt" 2>&1
        echo "== ${sz}x${sz}, $n instance(s): rc $? ($(el) s)"
        grep -E '^\| 1 ' "$W/run_${sz}_$n.txt"
        last=$(ls -t "$tr".* 2>/dev/null | head -1)
        [ -n "$last" ] && /usr/bin/python3 "$SRC/bench/batcher_trace.py" "$last" --last "$DUR" 2>&1 |
            tee "$OUT/trace_${sz}_$n.txt"
    done
done

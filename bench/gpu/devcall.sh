#!/bin/bash
# bench/gpu/devcall.sh — one run on the GPU machine (run from the repository root, the packed binaries in
# $TB_DEVDATA): correctness (test_nn_cuda, onnx.sh's exports and f16 checks), onnx.sh's timings against
# PyTorch, then switches A/B on onnx.sh's engines (bench/gpu/ab.sh). AB_BERT / AB_RESNET as ab.sh reads them.
set -u
D=${TB_DEVDATA:-.devdata/gpu} # the packed binaries (bench/gpu/pack.sh), optionally newer ab.sh / onnx.sh
R=$OUT/r
mkdir -p $R
tar -C /tmp -xJf $D/prebuilt.tar.xz || exit 1
[ -f $D/ab.sh ] && cp $D/ab.sh $D/onnx.sh bench/gpu/
export LD_LIBRARY_PATH=/tmp/pb/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
S=$(date +%s)
(TURBINE_TEST_DEVICE=cuda timeout ${T_TEST:-200} /tmp/pb/test_nn_cuda) > $R/nn_cuda.txt 2>&1
echo "test_nn_cuda rc=$? ($(( $(date +%s) - S )) s)"; grep -E "FAIL|layernorm|cases" $R/nn_cuda.txt | tail -16
if [ -z "${SKIP_ONNX:-}" ]; then
S=$(date +%s)
TB_PREBUILT=/tmp/pb TB_F16=1 TB_SKIP_NODES=1 TB_SKIP_PASSES=1 TB_TORCH_DTYPES=f16 TB_DTYPES=f16 OUT=$R/onnx \
    timeout ${T_ONNX:-330} bash bench/gpu/onnx.sh > $R/onnx_stdout.txt 2>&1
echo "onnx.sh rc=$? ($(( $(date +%s) - S )) s)"
grep -E "GPU time|graph of|model|FAIL|max\|d\||==|passed|ok " $R/onnx_stdout.txt | sed 's/turbine warn: cuda: //' | cut -c1-180 | head -50
grep -E "max abs err" $R/onnx/onnx_log.txt | head -4
fi
S=$(date +%s)
SKIP_TESTS=1 ENGINES=/tmp/tb-onnx ROUNDS=${ROUNDS:-1} DUR=1 TB_PREBUILT=/tmp/pb OUT=$R/ab \
    timeout ${T_AB:-170} bash bench/gpu/ab.sh > $R/ab_stdout.txt 2>&1
echo "ab.sh rc=$? ($(( $(date +%s) - S )) s)"
tail -45 $R/ab_stdout.txt | cut -c1-220
tar -C $OUT -czf $OUT/r.tgz r

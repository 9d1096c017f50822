#!/bin/bash
# bench/gpu/devcall2.sh — a shorter run on the GPU machine (binaries as for devcall.sh): test_nn_cuda,
# bench/gpu/ab.sh with its own builds (switches AB_BERT / AB_RESNET, 2 rounds interleaved), PyTorch's f16
# CUDA-graph figures (bench/onnx/torch_gpu.py, also channels-last ResNet-18) in the same run
set -u
D=${TB_DEVDATA:-.devdata/gpu} # the packed binaries (bench/gpu/pack.sh), optionally newer ab.sh / onnx.sh
R=$OUT/r
mkdir -p $R
tar -C /tmp -xJf $D/prebuilt.tar.xz || exit 1
[ -f $D/ab.sh ] && cp $D/ab.sh $D/onnx.sh bench/gpu/
export LD_LIBRARY_PATH=/tmp/pb/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
S=$(date +%s)
(TURBINE_TEST_DEVICE=cuda timeout 200 /tmp/pb/test_nn_cuda) > $R/nn_cuda.txt 2>&1
echo "test_nn_cuda rc=$? ($(( $(date +%s) - S )) s)"; grep -E "FAIL|cases" $R/nn_cuda.txt | tail -6
grep -E "sdpa" $R/nn_cuda.txt | grep -c " ok" 
S=$(date +%s)
SKIP_TESTS=1 ROUNDS=2 DUR=1 TB_PREBUILT=/tmp/pb OUT=$R/ab timeout 250 bash bench/gpu/ab.sh > $R/ab_stdout.txt 2>&1
echo "ab.sh rc=$? ($(( $(date +%s) - S )) s)"
tail -42 $R/ab_stdout.txt | cut -c1-220
S=$(date +%s)
timeout 100 python3 bench/onnx/torch_gpu.py --models bert,resnet18 --batch 1,8 --dtype f16 --json $R/torch_f16.json 2>&1 | grep '"model"'
timeout 60 python3 bench/onnx/torch_gpu.py --models resnet18 --batch 1,8 --dtype f16 --channels-last --json $R/torch_f16_cl.json 2>&1 | grep '"model"'
echo "torch ($(( $(date +%s) - S )) s)"
tar -C $OUT -czf $OUT/r.tgz r

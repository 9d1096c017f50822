#!/bin/bash
# bench/gpu/wgmma.sh — the wgmma + TMA skinny GEMMs of bench/gpu/wgmma_bench.cu
# (f16 weights, and int8 weights widened into the wgmma's A registers) on the
# GPU machine, checked against cuBLAS and timed against it, then the backend's
# mixed-input GEMM (qgemm.cu, what int8 steps of 9..128 tokens run now) at the
# same shapes and steps (qgemv_bench --gemm 0: its block shape and K splits
# by T), so the int8 rows of both compare in one call.
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/wgmma.sh
#
# Env: TB_PREBUILT (default /tmp/pb: binaries from bench/gpu/pack.sh), OUT
# (results, default ./wgmma), WG_T (steps, default 16,32,64), WG_ARGS (more
# wgmma_bench flags, e.g. --no-int8 or --only gu).
# Last lines: wgmma_bench's verdict ("wgmma_bench: PASS" / "FAIL"), then the
# mixed-input GEMM's table.
set -u
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/wgmma}
WG_T=${WG_T:-16,32,64}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
# shellcheck disable=SC2086
timeout 300 "$PB/wgmma_bench" --t "$WG_T" ${WG_ARGS:-} > "$OUT/wgmma_bench.txt" 2>&1
rc=$?
echo "wgmma_bench rc=$rc ($(( $(date +%s) - t0 )) s)"
grep -v "^      TN" "$OUT/wgmma_bench.txt"
grep -m 8 -A1 "FAIL\|NOT REPEATABLE" "$OUT/wgmma_bench.txt"
timeout 300 "$PB/qgemv_bench" --t "$WG_T" --kinds int8 --gemm 0 \
    --shapes 12288x4096,4096x4096,22016x4096,4096x11008 > "$OUT/qgemm.txt" 2>&1
echo "qgemv_bench --gemm 0 rc=$? ($(( $(date +%s) - t0 )) s)"
tail -n 30 "$OUT/qgemm.txt"
exit $rc

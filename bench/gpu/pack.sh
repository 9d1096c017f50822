#!/bin/bash
# bench/gpu/pack.sh — build the GPU binaries on this machine (no GPU needed)
# and pack them for bench/gpu/run.sh on the GPU machine:
#
#   bash bench/gpu/pack.sh            # -> .devdata/gpu/prebuilt.tar.xz
#
# then, on the GPU machine, from the repository root:
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && TB_PREBUILT=/tmp/pb bash bench/gpu/run.sh
#
# Builds turbine, test_batch, test_sample_step, test_backend_ops, test_nn_cuda, test_warmup, test_context_kv,
# gpu_bench, qgemv_bench, fp8_lt_bench, flash_test and wgmma_bench (sm_90a)
# for sm_90 into build-gpu90/ (Release) with the CUDA backend module libturbine_cuda.so,
# which goes beside them (the binaries look for it in their own folder),
# strips them, and adds the shared libraries they load that a bare CUDA
# machine may lack (jansson, libcurl, libmicrohttpd, ... as ldd resolves them
# here, plus the ones loaded with dlopen; glibc, the C++ runtime and the
# CUDA / driver libraries are left to the target). Env: TB_GPU_BUILD (build folder,
# default build-gpu90), TB_CUDA_ARCH (default 90), TB_PACK (output file).
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=${TB_GPU_BUILD:-$SRC/build-gpu90}
ARCH=${TB_CUDA_ARCH:-90}
PACK=${TB_PACK:-$SRC/.devdata/gpu/prebuilt.tar.xz}
BINS="turbine test_batch test_sample_step test_backend_ops test_nn_cuda test_warmup test_context_kv gpu_bench qgemv_bench fp8_lt_bench flash_test wgmma_bench"
if [ ! -f "$B/CMakeCache.txt" ]; then
    cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > /dev/null
else
    cmake "$B" > /dev/null # a target added since the folder was configured
fi
# shellcheck disable=SC2086
make -C "$B" -j"$(nproc)" $BINS > /dev/null
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/pb/lib"
MODULE=libturbine_cuda.so
[ -f "$B/$MODULE" ] || { echo "pack: $B/$MODULE was not built (is nvcc on PATH?)" >&2; exit 1; }
for f in $BINS $MODULE; do
    [ -f "$B/$f" ] || { echo "pack: $B/$f was not built (is nvcc on PATH?)" >&2; exit 1; }
    cp "$B/$f" "$STAGE/pb/$f"
    strip "$STAGE/pb/$f"
done
# libraries the programs open with dlopen (libcurl for bench, libmicrohttpd
# for serve, OpenBLAS for the CPU tactic) are not in their ldd output: list them by soname
DLOPENED=$(for so in libcurl.so.4 libmicrohttpd.so.12 libopenblas.so.0; do ldconfig -p | awk -v s="$so" '$1 == s {print $NF; exit}'; done)
# shellcheck disable=SC2086
{ for f in $BINS $MODULE; do ldd "$B/$f"; done; for l in $DLOPENED; do echo "$l => $l"; ldd "$l"; done; } |
        awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
        libcuda.so*|libcudart*|libcublas*|libnvidia*|libnvrtc*) ;;
        *) cp -L "$lib" "$STAGE/pb/lib/" ;;
    esac
done
mkdir -p "$(dirname "$PACK")"
tar -C "$STAGE" -cJf "$PACK" pb
echo "pack: $PACK ($(du -h "$PACK" | cut -f1)): $BINS $MODULE, $(ls "$STAGE/pb/lib" | wc -l) libraries"

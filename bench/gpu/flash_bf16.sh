#!/bin/bash
# bench/gpu/flash_bf16.sh — the flash prefill's bf16 form (flash.cu with bf16
# operands, the default since 2026-12-07; TB_CUDA_FLASH_BF16=0 turns it off) on the GPU machine: correctness first
# (flash_test's cases over f16 / fp8 / int8 / bf16 caches against its
# double-precision reference; a bf16 134M 2-layer engine's logits against
# tests/compare_logits.py's reference with the switch off and on; the same
# engine under compute-sanitizer memcheck with it on), then a bf16 engine's
# prefill of 512 tokens (TinyLlama and 7B shapes) with it off and on,
# alternating, beside the f16 engine of the same checkpoint.
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/flash_bf16.sh
#
# Env: TB_PREBUILT (/tmp/pb), OUT (./flash_bf16), TB_GPU_DATA (.devdata/gpu:
# models/stories260K/tok512.bin, models/llama2_tokenizer.bin), PY (python3
# with numpy and torch), FB_SHAPES (torch_ckpt.py shapes timed, default
# "tinyllama llama7b"), FB_ROUNDS (2).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/flash_bf16}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
fails=0
# 1. the kernel against the reference
if timeout 300 "$PB/flash_test" --quick --no-bench > "$OUT/flash_test.txt" 2>&1; then
    echo "flash_test: PASS ($(grep -o 'correctness: .*' "$OUT/flash_test.txt"))"
else
    echo "flash_test: FAIL ($(grep -c FAIL "$OUT/flash_test.txt") lines: $(grep FAIL "$OUT/flash_test.txt" | head -3 | tr '\n' ';'))"
    fails=$((fails + 1))
fi
echo "  worst bf16 cases: $(grep ' bf16' "$OUT/flash_test.txt" | sort -g -k8 | tail -n 2 | tr -s ' ' | tr '\n' ';')"
# 2. a bf16 engine end to end (hd 64: the 134M preset's heads; 32-token prompts take the prefill kernels)
C=/tmp/fb_134m
"$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m --layers 2 --dtype bf16 --out $C > /dev/null 2> "$OUT/gen.err" ||
    { echo "checkpoint FAIL: $(tail -2 "$OUT/gen.err")"; exit 1; }
"$PB/turbine" build $C -o /tmp/fb_134m.engine --tokenizer "$DATA/models/stories260K/tok512.bin" --dtype bf16 --device cuda \
    > "$OUT/build_134m.txt" 2>&1 || { echo "build FAIL: $(tail -3 "$OUT/build_134m.txt")"; exit 1; }
ids=$("$PY" -c "import random; r=random.Random(11); print(','.join(str(r.randrange(3,512)) for _ in range(32)))")
for m in 0 1; do
    if TB_CUDA_FLASH_BF16=$m "$PB/turbine" run /tmp/fb_134m.engine --device cuda --prompt-ids "$ids" -n 48 --temperature 0 \
        --logits-out "$OUT/logits_$m.bin" > /dev/null 2> "$OUT/run_$m.err" &&
       out=$("$PY" "$SRC/tests/compare_logits.py" --model $C --logits "$OUT/logits_$m.bin" --prompt-ids "$ids" --tol 2e-2 \
             --quiet 2>&1); then
        echo "134M bf16, TB_CUDA_FLASH_BF16=$m: PASS ($(echo "$out" | tail -n 1))"
    else
        echo "134M bf16, TB_CUDA_FLASH_BF16=$m: FAIL ($(tail -n 2 "$OUT/run_$m.err" | tr '\n' ' ') $(echo "${out:-}" | tail -n 2 | tr '\n' ' '))"
        fails=$((fails + 1))
    fi
done
if command -v compute-sanitizer > /dev/null; then
    TB_CUDA_FLASH_BF16=1 timeout 300 compute-sanitizer --tool memcheck "$PB/turbine" run /tmp/fb_134m.engine --device cuda \
        --prompt-ids "$ids" -n 4 --temperature 0 > "$OUT/san.txt" 2>&1
    echo "compute-sanitizer memcheck, flash bf16: $(grep -E 'ERROR SUMMARY' "$OUT/san.txt")"
    grep -q "ERROR SUMMARY: 0 errors" "$OUT/san.txt" || fails=$((fails + 1))
fi
echo "($(el) s)"
# 3. prefill 512 of bf16 engines, the switch off / on, and the f16 engine of the same checkpoint
for shape in ${FB_SHAPES:-tinyllama llama7b}; do
    CK=/tmp/fb_$shape
    "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$shape" --out "$CK" > "$OUT/ckpt_$shape.txt" 2>&1 ||
        { echo "$shape checkpoint FAIL"; tail -3 "$OUT/ckpt_$shape.txt"; continue; }
    for dt in bf16 f16; do
        "$PB/turbine" build "$CK" -o "/tmp/fb_$shape.$dt.engine" --tokenizer "$DATA/models/llama2_tokenizer.bin" --dtype "$dt" \
            --device cuda --max-seq-len 1024 --max-batch 64 > "$OUT/build_${shape}_$dt.txt" 2>&1 ||
            echo "$shape $dt build FAIL: $(tail -2 "$OUT/build_${shape}_$dt.txt")"
    done
    rm -rf "$CK"
    echo "$shape engines built ($(el) s)"
    for r in $(seq "${FB_ROUNDS:-2}"); do
        for m in 0 1; do
            p=$(TB_CUDA_FLASH_BF16=$m "$PB/gpu_bench" "/tmp/fb_$shape.bf16.engine" --device cuda --prefill 512 --decode 2 --ctx 16 \
                --batch 1 2>&1 | grep -m 1 '^prefill')
            echo "$shape bf16, TB_CUDA_FLASH_BF16=$m, round $r: $p"
        done
        echo "$shape f16, round $r: $("$PB/gpu_bench" "/tmp/fb_$shape.f16.engine" --device cuda --prefill 512 --decode 2 \
            --ctx 16 --batch 1 2>&1 | grep -m 1 '^prefill')"
    done
    rm -f "/tmp/fb_$shape".*.engine
done
echo "flash_bf16: $([ $fails -eq 0 ] && echo PASS || echo "FAIL ($fails)") ($(el) s)"
[ $fails -eq 0 ]

#!/bin/bash
# bench/gpu/upload_ab.sh — the weight upload through pinned staging buffers
# (cuda_backend.c, TB_CUDA_UPLOAD) against the plain cudaMemcpy per weight,
# on the GPU machine: correctness first (stories260K's greedy text byte for
# byte with the staging forced on a small engine, also under
# compute-sanitizer; a 7B f16 engine's greedy ids and logits equal in both
# modes), then engine load and first token of the 7B engine, the two modes
# alternating.
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/upload_ab.sh
#
# Env: TB_PREBUILT (/tmp/pb), OUT (./upload_ab), TB_GPU_DATA (.devdata/gpu:
# models/stories260K/{stories260K.bin,tok512.bin,expected_once_upon_a_time_n200.txt},
# models/llama2_tokenizer.bin), PY (python3 with numpy and torch), UP_ROUNDS (2),
# UP_DTYPES (7B engines, default "f16 int4").
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
OUT=${OUT:-$PWD/upload_ab}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
fails=0
S=$DATA/models/stories260K
"$PB/turbine" build "$S/stories260K.bin" --tokenizer "$S/tok512.bin" -o /tmp/up_s.engine --device cuda > "$OUT/s_build.txt" 2>&1
for m in 1 0; do
    TB_CUDA_UPLOAD=$m "$PB/turbine" run /tmp/up_s.engine --device cuda -n 200 --temperature 0 -p "Once upon a time" \
        > "$OUT/s_$m.txt" 2> "$OUT/s_$m.err"
    if cmp -s "$OUT/s_$m.txt" "$S/expected_once_upon_a_time_n200.txt"; then echo "stories260K TB_CUDA_UPLOAD=$m: PASS byte for byte"
    else echo "stories260K TB_CUDA_UPLOAD=$m: FAIL"; tail -3 "$OUT/s_$m.err"; fails=$((fails + 1)); fi
done
if command -v compute-sanitizer > /dev/null; then
    TB_CUDA_UPLOAD=1 timeout 200 compute-sanitizer --tool memcheck "$PB/turbine" run /tmp/up_s.engine --device cuda -n 20 \
        --temperature 0 -p "Once upon a time" > "$OUT/s_san.txt" 2>&1
    echo "compute-sanitizer, staged upload: $(grep -E 'ERROR SUMMARY' "$OUT/s_san.txt")"
    grep -q "ERROR SUMMARY: 0 errors" "$OUT/s_san.txt" || fails=$((fails + 1))
fi
echo "($(el) s)"
CK=/tmp/up_7b
"$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out $CK > "$OUT/ckpt.txt" 2>&1 ||
    { echo "checkpoint FAIL"; tail -5 "$OUT/ckpt.txt"; exit 1; }
echo "7B checkpoint ($(el) s)"
for q in ${UP_DTYPES:-f16 int4}; do
    args=(--dtype "$q")
    [ "$q" = int4 ] && args=(--dtype int4 --group-size 128)
    "$PB/turbine" build $CK -o /tmp/up_$q.engine --tokenizer "$DATA/models/llama2_tokenizer.bin" "${args[@]}" \
        --device cuda --max-seq-len 1024 --max-batch 64 > "$OUT/build_$q.txt" 2>&1 ||
        { echo "build $q FAIL: $(tail -3 "$OUT/build_$q.txt")"; fails=$((fails + 1)); continue; }
    echo "built 7B $q ($(el) s)"
    for m in 1 0; do
        TB_CUDA_UPLOAD=$m "$PB/turbine" run /tmp/up_$q.engine --device cuda --prompt-ids 1,450,4996,17354,1701,29916 -n 16 \
            --temperature 0 --logits-out "$OUT/logits_${q}_$m.bin" > "$OUT/run_${q}_$m.txt" 2> "$OUT/run_${q}_$m.err" ||
            { echo "run $q TB_CUDA_UPLOAD=$m FAIL: $(tail -3 "$OUT/run_${q}_$m.err")"; fails=$((fails + 1)); }
    done
    if cmp -s "$OUT/logits_${q}_1.bin" "$OUT/logits_${q}_0.bin" && cmp -s "$OUT/run_${q}_1.txt" "$OUT/run_${q}_0.txt" &&
       [ -s "$OUT/logits_${q}_1.bin" ]; then
        echo "7B $q: logits and greedy ids identical, staged against plain upload: PASS"
    else
        echo "7B $q: staged and plain uploads differ: FAIL"; fails=$((fails + 1))
    fi
    for r in $(seq 1 "${UP_ROUNDS:-2}"); do
        for m in 0 1; do
            TB_CUDA_UPLOAD=$m timeout 120 "$PB/gpu_bench" /tmp/up_$q.engine --device cuda --prefill 0 --decode 16 --ctx 4 \
                --batch 1 > "$OUT/bench_${q}_${r}_$m.txt" 2>&1
            echo "7B $q round $r TB_CUDA_UPLOAD=$m: $(grep -E '^load|^first token' "$OUT/bench_${q}_${r}_$m.txt" | tr '\n' ' ')"
        done
    done
    rm -f /tmp/up_$q.engine
done
rm -rf $CK
echo "upload_ab: $fails failed ($(el) s)"
exit $((fails > 0))

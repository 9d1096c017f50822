#!/bin/bash
# bench/gpu/run.sh — the CUDA backend on one GPU: build, correctness, timing.
#
#   bash bench/gpu/run.sh
#
# 1. build  : cmake Release with CUDA into build-gpu/ (or, with TB_PREBUILT=DIR,
#             use DIR/turbine, DIR/test_batch, DIR/test_sample_step,
#             DIR/test_backend_ops, DIR/test_nn_cuda, DIR/test_warmup,
#             DIR/test_context_kv, the CUDA backend module
#             DIR/libturbine_cuda.so (loaded from the binaries' folder),
#             DIR/gpu_bench, DIR/flash_test and DIR/lib/*.so: bench/gpu/pack.sh builds and
#             packs them on a machine without a GPU)
# 2. logits : random checkpoints (tests/gen_checkpoints.py) llama-gqa, qwen2,
#             mistral, llama3-rope in f32 and bf16; engines f32/f16/bf16 built
#             with --device $DEV; 32 prompt ids + 16 greedy steps compared with
#             tests/compare_logits.py (1e-4 f32 engines, 2e-2 f16/bf16), one
#             long run (300 tokens) that takes the split-K decode path; the
#             same logits against transformers' own model of each checkpoint
#             (bench/gpu/hf_logits.py); then re-runs of a few engines with
#             tuning switches flipped;
#             quantized engines (2b): int8, int4 (group 128; group 32 with
#             --zero-point), fp8, one with an fp8 and one with an int8 KV
#             cache, one long int4 run (300 tokens), built for $DEV, against
#             the CPU engine of the same checkpoint and dtype (--qmm-tactics
#             exact, f32 or the same quantized KV cache) over the same token
#             path (tests/compare_logits.py --print-ids / --ref-logits), 2e-2
# 3. text   : stories260K f32 on the GPU, -n 200 greedy, byte for byte; the
#            demo model's perplexity on tinyshakespeare's held-out split
#            (f32, f16) against the PyTorch figure (needs
#            $DATA/data/tinyshakespeare.txt); int8, int4, fp8 engines on
#            $DEV against the CPU engine of the same dtype (--device cpu,
#            exact tactics) within 1e-3 relative
# 4. batch  : tests/test_backend_ops.c, tests/test_nn_cuda.c, tests/test_batch.c
#             tests/test_sample_step.c, tests/test_warmup.c and
#             tests/test_context_kv.c with TURBINE_TEST_DEVICE=$DEV (every
#             op x dtype against its reference kernel with the bounds of
#             docs/TESTING.md; every general op (ONNX engines) f32/f16 against
#             its reference, eager, captured and replayed as a CUDA graph;
#             batched == unbatched, f32/f16 and int8/int4/fp8 engines
#             apart; sampling on the device; a context after serve's
#             warm-up computes what a cold one does; int8 / fp8 caches
#             accepted; the tune cache: a second gpu_bench run reads every
#             cuBLASLt pick the first kept on disk); bench/gpu/flash_test.cu
#             --quick: the flash prefill over f16, fp8 and int8 caches
# 5. timing : Llama-2-7B and TinyLlama-1.1B shapes, f16 random weights:
#             64 streams, prefill 512, decode b1/b8 ms/step, then the same
#             with each variant's switches (one process, one engine load:
#             gpu_bench --variants); transformers eager FP16 on the same
#             weights (unless TB_SKIP_HF); copy bandwidth; for the 7B
#             shape (TB_QUANT_SHAPES) also int8, int4 (group 128) and fp8
#             engines from the same weights (build time, b1, b8, prefill,
#             64 streams, load / first token; decode against the bandwidth
#             floor: the engine's matmul bytes / copy bandwidth), and the
#             fp8 engine with an fp8 KV cache (also 256 streams)
# 6. memchk : compute-sanitizer memcheck on short runs (greedy and sampled;
#             int4 and fp8 engines greedy)
# 7. serve  : turbine serve on the GPU: greedy and sampled completions, a
#             4-stream turbine bench, the NVML gauges (every stage bounded)
# Steps run in this order so that a run cut short by a time limit still has
# the correctness and the 7B figures; every result is appended to $OUT as it
# comes.
# Env: OUT (results folder), TB_GPU_DATA (folder with models/stories260K and
# models/llama2_tokenizer.bin; default .devdata/gpu), TB_SKIP_HF (no
# transformers baseline), TB_SHAPES (default "llama7b tinyllama"),
# TB_SKIP_TIMING, TB_VARIANTS (";"-separated switch sets timed after the
# default; none: no others), TB_BENCH_ARGS (gpu_bench's workload flags), TB_TIMING_ONLY, TB_QUICK (f32 checkpoints only, no long runs, re-runs,
# timing or sanitizer: ~40 s); TB_QUANT=0 (no quantized engine anywhere),
# TB_QUANT_ONLY=1 (only the quantized stages, with the 7B f16 timing as
# their baseline: no float logits, transformers, stories, float perplexity,
# op tests, variants or serve), TB_QUANT_SHAPES (shapes whose quantized
# engines are timed; default llama7b), TB_QUANT_DTYPES (those timed; default
# "int8 int4 fp8"), TB_QBENCH_STREAMS (the fp8-KV run's stream counts;
# default 64,256).
# A dry run on a machine without a GPU: TB_DEVICE=cpu TB_GPU_DATA=../shared
# makes the timing shapes' checkpoints with tests/gen_checkpoints.py
# (TB_SHAPE_LAYERS layers, default 2) instead of torch on the GPU; give it
# small TB_BENCH_ARGS (and TB_COPY_BW, TB/s, for the floor ratios).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$SRC/bench/out/gpu}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
W=${TB_WORK:-/tmp/tb-gpu}
PY=${TB_PYTHON:-python3}
DEV=${TB_DEVICE:-cuda}   # cpu: a dry run of this script on a machine without a GPU
QUANT=1; [ "${TB_QUANT:-1}" = 0 ] && QUANT=""
QONLY=""; [ "${TB_QUANT_ONLY:-0}" = 1 ] && QONLY=1
if [ -n "$QONLY" ] && [ -z "$QUANT" ]; then echo "run.sh: TB_QUANT_ONLY=1 with TB_QUANT=0 leaves nothing to run" >&2; exit 2; fi
T_START=$(date +%s)
mkdir -p "$OUT" "$W"
LOG=$OUT/log.txt
SUM=$OUT/summary.txt
: > "$LOG"; : > "$SUM"
say() { echo "$*" | tee -a "$LOG"; }
row() { printf '%-34s %s\n' "$1" "$2" | tee -a "$SUM" >> "$LOG"; }
elapsed() { echo $(( $(date +%s) - T_START )); }

say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"

# ---------------------------------------------------------------- 1. build
LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && LIBS="$d" && break
done
if [ -z "$LIBS" ]; then
    f=$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS=$(dirname "$f")
fi
if [ -n "${TB_PREBUILT:-}" ]; then
    BIN=$TB_PREBUILT
    LIBS="$TB_PREBUILT/lib:$LIBS"
    say "== using prebuilt binaries in $BIN (libs: $LIBS)"
else
    say "== build (Release, CUDA)"
    BIN=$SRC/build-gpu
    if ! (cmake -S "$SRC" -B "$BIN" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >> "$LOG" 2>&1 &&
          make -C "$BIN" -j"$(nproc)" turbine test_batch test_sample_step test_backend_ops test_nn_cuda test_warmup test_context_kv gpu_bench flash_test >> "$LOG" 2>&1); then
        say "build failed"; row build FAIL; cat "$SUM"; exit 1
    fi
fi
tb() { LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
TB="$BIN/turbine"
if ! tb "$TB" help > /dev/null 2>&1 && ! tb "$TB" --help > /dev/null 2>&1; then
    tb "$TB" --help 2>&1 | head -5 | tee -a "$LOG"
fi
row build "ok ($(elapsed) s)"
# `turbine run --device` where the CLI has it; else the engine's own backend
RUNDEV=()
if ! tb "$TB" run /nonexistent.engine --device $DEV -n 1 -p x 2>&1 | grep -q "unknown option"; then
    RUNDEV=(--device "$DEV")
fi
say "run device flag: ${RUNDEV[*]:-(none: the backend the engine records)}"

TOK512=$DATA/models/stories260K/tok512.bin
STORIES=$DATA/models/stories260K/stories260K.bin
LTOK=$DATA/models/llama2_tokenizer.bin

# TB_TIMING_ONLY=1: the timing step alone (steps 2-4, 6 and 7 skipped)
if [ -z "${TB_TIMING_ONLY:-}" ]; then
# ---------------------------------------------------------------- 2. logits
say "== logits vs reference"
prompt_ids() {
    "$PY" -c "import random,sys; r=random.Random(sys.argv[1]); print(','.join(str(r.randrange(3,512)) for _ in range(32)))" "$1"
}
pass=0; fail=0; worst_lo=0; worst_hi=0
# case NAME MODEL EDTYPE TOL [N]
case_run() {
    local name=$1 model=$2 edt=$3 tol=$4 n=${5:-48}
    local eng=$W/$name.engine lg=$W/$name.logits.bin ids out rc
    ids=$(prompt_ids "$name")
    echo "$model" > "$W/$name.model"
    if ! tb "$TB" build "$model" -o "$eng" --tokenizer "$TOK512" --dtype "$edt" --device $DEV >> "$LOG" 2>&1; then
        say "FAIL $name: build"; fail=$((fail + 1)); return
    fi
    if ! tb "$TB" run "$eng" "${RUNDEV[@]}" --prompt-ids "$ids" -n "$n" --temperature 0 --logits-out "$lg" \
         > /dev/null 2>> "$LOG"; then
        say "FAIL $name: run"; fail=$((fail + 1)); return
    fi
    echo "$name $model $lg $ids $tol" >> "$W/hf_cases.txt"
    out=$("$PY" "$SRC/tests/compare_logits.py" --model "$model" --logits "$lg" --prompt-ids "$ids" --tol "$tol" --quiet 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); say "PASS $name: $(echo "$out" | tail -n 1)"
    else fail=$((fail + 1)); say "FAIL $name: $(echo "$out" | tail -n 2 | tr '\n' ' ')"; fi
}
# rerun NAME ENV...: the engine of case NAME again, with the switches ENV
case_rerun() {
    local name=$1; shift
    local eng=$W/$name.engine lg=$W/$name.rerun.logits.bin ids out rc tol=2e-2
    case $name in *-f32) tol=1e-4 ;; *-f32-long) tol=1e-4 ;; esac
    [ -f "$eng" ] || { say "SKIP $name ($*): no engine"; return; }
    ids=$(prompt_ids "$name")
    local n=48; case $name in *-long) n=300 ;; esac
    if ! tb env "$@" "$TB" run "$eng" "${RUNDEV[@]}" --prompt-ids "$ids" -n "$n" --temperature 0 --logits-out "$lg" \
         > /dev/null 2>> "$LOG"; then
        say "FAIL $name ($*): run"; fail=$((fail + 1)); return
    fi
    local model
    model=$(cat "$W/$name.model")
    out=$("$PY" "$SRC/tests/compare_logits.py" --model "$model" --logits "$lg" --prompt-ids "$ids" --tol "$tol" --quiet 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); say "PASS $name ($*): $(echo "$out" | tail -n 1)"
    else fail=$((fail + 1)); say "FAIL $name ($*): $(echo "$out" | tail -n 2 | tr '\n' ' ')"; fi
}
: > "$W/hf_cases.txt"
CDTS="f32 bf16"
[ -n "${TB_QUICK:-}${QONLY}" ] && CDTS=f32   # TB_QUICK: f32 checkpoints only, no long runs, reruns, timing, sanitizer
for p in llama-gqa qwen2 mistral llama3-rope; do
    for cdt in $CDTS; do
        d=$W/ckpt/$p-$cdt
        "$PY" "$SRC/tests/gen_checkpoints.py" --preset $p --dtype $cdt --out "$d" > /dev/null 2>> "$LOG" || { say "FAIL gen $p $cdt"; continue; }
        [ -n "$QONLY" ] && continue   # the checkpoints only: the quantized cases below use the f32 ones
        case_run "$p-$cdt-f32" "$d" f32 1e-4
        if [ $cdt = f32 ]; then case_run "$p-$cdt-f16" "$d" f16 2e-2
        else case_run "$p-$cdt-bf16" "$d" bf16 2e-2; fi
    done
done
if [ -z "$QONLY" ]; then
# a bf16 cache through the flash prefill's bf16 form (the default) and the
# attention kernel (TB_CUDA_FLASH_BF16=0):
# head size 64 (the 134M preset, 2 layers), whose 32-token prompts are runs
# long enough for the prefill kernels; the presets above have smaller heads
d=$W/ckpt/llama134m-l2-bf16
if "$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m --layers 2 --dtype bf16 --out "$d" > /dev/null 2>> "$LOG"; then
    case_run "llama134m-l2-bf16-bf16" "$d" bf16 2e-2
    case_rerun llama134m-l2-bf16-bf16 TB_CUDA_FLASH_BF16=0
else
    say "FAIL gen llama134m bf16"; fail=$((fail + 1))
fi
# long sequences: the split-K decode path (contexts >= 128)
if [ -z "${TB_QUICK:-}" ]; then
case_run "llama3-rope-f32-f32-long" "$W/ckpt/llama3-rope-f32" f32 1e-4 300
case_run "llama3-rope-f32-f16-long" "$W/ckpt/llama3-rope-f32" f16 2e-2 300
fi
row "logits vs reference" "$pass passed, $fail failed"
# the same logits against transformers' own model of each checkpoint
"$PY" "$SRC/bench/gpu/hf_logits.py" --cases "$W/hf_cases.txt" > "$W/hf_logits.txt" 2>> "$LOG"
cat "$W/hf_logits.txt" >> "$LOG"
row "logits vs transformers" "$(tail -n 1 "$W/hf_logits.txt")"
pass=0; fail=0
[ -n "${TB_QUICK:-}" ] || for v in "TB_CUDA_SIMT=pair" "TB_CUDA_SIMT=row1s" "TB_CUDA_SIMT=row2s TB_CUDA_ATTN_SPLIT_MIN=0" \
         "TB_CUDA_FUSE_NORM=0 TB_CUDA_GEMV=mma" "TB_CUDA_PDL=1" "TB_CUDA_PREFILL_GEMM=0" "TB_CUDA_ATTN_LANES=0" "TB_CUDA_GEMV=mma" "TB_CUDA_PDL=0" \
         "TB_CUDA_TUNE=0" "TB_CUDA_SIMT=row1" "TB_CUDA_SIMT=row2"; do
    case_rerun qwen2-f32-f16 $v
    case_rerun llama-gqa-bf16-bf16 $v
    case_rerun llama3-rope-f32-f16-long $v
done
row "logits, switches off" "$pass passed, $fail failed"
fi # QONLY

# ---------------------------------------------------------------- 2b. quantized logits
# Quantized engines built for $DEV against the CPU engine of the same
# checkpoint and dtype built with --qmm-tactics exact (kernels that
# dequantise the weights and sum in f32: tests/test_quant_engines.sh holds
# that engine to the dequantised f32 model within 1e-4) and run with an f32
# KV cache (or the quantized cache of the case), fed the token path the
# engine under test took (compare_logits.py --print-ids), so a near-tie
# that flips a greedy pick does not part the two sequences; rows within 2e-2
# of their largest logit, the f16 engines' bound. The small presets have
# 64-wide rows: int4 group 128 would fall back to int8 there, so group 128
# runs on two layers of the 134M preset (rows of 768 and 2048).
# In a dry run (TB_DEVICE=cpu) the engine under test is a CPU engine: built
# with exact tactics too, as the Q8 tactic (activations rounded to int8)
# alone moves the 134M preset's logits by ~2e-2.
# CPUDEV: --device cpu for `turbine run` where the CLI has --device
DRYQ=()
[ "$DEV" = cpu ] && DRYQ=(--qmm-tactics exact)
CPUDEV=()
[ ${#RUNDEV[@]} -gt 0 ] && CPUDEV=(--device cpu)
qpass=0; qfail=0; qworst=0
# qcase NAME MODEL TOKENIZER N KV BUILD-ARGS...: KV "" is the engine's default
# cache (f32 for the CPU reference), else both run with --kv-dtype KV
qcase() {
    local name=$1 model=$2 tokf=$3 n=$4 kv=$5
    shift 5
    local eng=$W/$name.engine ceng=$W/$name.cpu.engine lg=$W/$name.logits.bin clg=$W/$name.cpu.logits.bin
    local ids path r out rc e v kva=() rkv=(--kv-dtype f32)
    if [ -n "$kv" ]; then kva=(--kv-dtype "$kv"); rkv=(--kv-dtype "$kv"); fi
    ids=$(prompt_ids "$name")
    v=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1] + '/config.json'))['vocab_size'])" "$model" 2>> "$LOG")
    if [ -z "$v" ]; then say "FAIL $name: no checkpoint $model"; qfail=$((qfail + 1)); return; fi
    if ! tb "$TB" build "$model" -o "$eng" --tokenizer "$tokf" "$@" --device $DEV "${DRYQ[@]}" >> "$LOG" 2>&1; then
        say "FAIL $name: build ($*)"; qfail=$((qfail + 1)); return
    fi
    if ! tb env ${QENV:-} "$TB" run "$eng" "${RUNDEV[@]}" "${kva[@]}" --prompt-ids "$ids" -n "$n" --temperature 0 --logits-out "$lg" \
         > /dev/null 2>> "$LOG"; then
        say "FAIL $name: run"; qfail=$((qfail + 1)); return
    fi
    if ! tb "$TB" build "$model" -o "$ceng" --tokenizer "$tokf" "$@" --device cpu --qmm-tactics exact >> "$LOG" 2>&1; then
        say "FAIL $name: CPU reference build"; qfail=$((qfail + 1)); return
    fi
    if ! path=$("$PY" "$SRC/tests/compare_logits.py" --logits "$lg" --prompt-ids "$ids" --vocab "$v" --print-ids 2>> "$LOG"); then
        say "FAIL $name: $(tail -n 1 <<<"$path")"; qfail=$((qfail + 1)); return
    fi
    r=$(( $(tr -cd , <<<"$path" | wc -c) + 1 ))
    # -n counts the prompt: the path as the prompt, one token after it
    if ! tb "$TB" run "$ceng" "${CPUDEV[@]}" "${rkv[@]}" --prompt-ids "$path" -n "$r" --temperature 0 --logits-out "$clg" \
         > /dev/null 2>> "$LOG"; then
        say "FAIL $name: CPU reference run"; qfail=$((qfail + 1)); return
    fi
    rm -f "$ceng"
    out=$("$PY" "$SRC/tests/compare_logits.py" --logits "$lg" --prompt-ids "$ids" --vocab "$v" --ref-logits "$clg" \
        --tol "${QTOL:-2e-2}" --quiet 2>&1)
    rc=$?
    e=$(sed -n 's/.*max rel err \([0-9.e+-]*\).*/\1/p' <<<"$out" | tail -n 1)
    qworst=$(awk -v a="$qworst" -v b="${e:-0}" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    if [ $rc -eq 0 ]; then qpass=$((qpass + 1)); say "PASS $name ($* kv ${kv:-default} ${QENV:-}): $(tail -n 1 <<<"$out")"
    else qfail=$((qfail + 1)); say "FAIL $name ($* kv ${kv:-default} ${QENV:-}): $(tail -n 2 <<<"$out" | tr '\n' ' ')"; fi
}
# e4m3 engines: steps of >= 9 tokens take the FP8 tensor cores with x
# rounded to e4m3 (docs/GPU.md); the f16-tolerance comparison runs with
# that path off (QENV), one case on it with a tolerance for 3-bit
# mantissas in x (measured on the H200: 4.6e-2 to 7.7e-2 on these
# random-weight checkpoints)
F8=TB_CUDA_FP8_GEMM=0
if [ -n "$QUANT" ]; then
    say "== quantized engines' logits vs the CPU engine ($(elapsed) s elapsed)"
    C=$W/ckpt
    "$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m --layers 2 --dtype f32 --out "$C/llama134m-l2-f32" \
        > /dev/null 2>> "$LOG" || say "FAIL gen llama134m (2 layers)"
    qcase q-llama-gqa-int8 "$C/llama-gqa-f32" "$TOK512" 48 "" --dtype int8
    QENV=$F8 qcase q-llama-gqa-fp8 "$C/llama-gqa-f32" "$TOK512" 48 "" --dtype fp8
    qcase q-qwen2-int8 "$C/qwen2-f32" "$TOK512" 48 "" --dtype int8
    qcase q-qwen2-int4-g32-zp "$C/qwen2-f32" "$TOK512" 48 "" --dtype int4 --group-size 32 --zero-point
    QENV=$F8 qcase q-qwen2-fp8 "$C/qwen2-f32" "$TOK512" 48 "" --dtype fp8
    qcase q-qwen2-int8-kvfp8 "$C/qwen2-f32" "$TOK512" 48 fp8 --dtype int8
    qcase q-mistral-int4-g32 "$C/mistral-f32" "$TOK512" 48 "" --dtype int4 --group-size 32
    QENV=$F8 qcase q-llama3-rope-fp8 "$C/llama3-rope-f32" "$TOK512" 48 "" --dtype fp8
    qcase q-llama134m-int8 "$C/llama134m-l2-f32" "$LTOK" 48 "" --dtype int8
    qcase q-llama134m-int4 "$C/llama134m-l2-f32" "$LTOK" 48 "" --dtype int4 --group-size 128
    QENV=$F8 qcase q-llama134m-fp8 "$C/llama134m-l2-f32" "$LTOK" 48 "" --dtype fp8
    QTOL=1.5e-1 qcase q-llama134m-fp8-tc "$C/llama134m-l2-f32" "$LTOK" 48 "" --dtype fp8
    qcase q-llama134m-int4-kvint8 "$C/llama134m-l2-f32" "$LTOK" 48 int8 --dtype int4 --group-size 128
    # 300 tokens: the split-K decode path
    [ -n "${TB_QUICK:-}" ] || qcase q-llama134m-int4-long "$C/llama134m-l2-f32" "$LTOK" 300 "" --dtype int4 --group-size 128
    row "quantized logits vs CPU engine" "$qpass passed, $qfail failed (worst $qworst; tol 2e-2, 1.5e-1 for the fp8 tensor-core case)"
fi

# ---------------------------------------------------------------- 3. stories260K
if [ -z "$QONLY" ]; then
say "== stories260K greedy text"
if tb "$TB" build "$STORIES" --tokenizer "$TOK512" -o "$W/s.engine" --device $DEV >> "$LOG" 2>&1 &&
   tb "$TB" run "$W/s.engine" "${RUNDEV[@]}" -n 200 --temperature 0 -p "Once upon a time" > "$W/s.txt" 2>> "$LOG" &&
   cmp -s "$W/s.txt" "$DATA/models/stories260K/expected_once_upon_a_time_n200.txt"; then
    row "stories260K f32 text (n=200)" "PASS byte for byte"
else
    row "stories260K f32 text (n=200)" "FAIL"
    diff "$DATA/models/stories260K/expected_once_upon_a_time_n200.txt" "$W/s.txt" 2>&1 | head -8 | tee -a "$LOG"
fi
# the engine records the GPU; a CPU run of it is refused with a clear error
tb "$BIN/gpu_bench" "$W/s.engine" --device cpu --decode 1 > /dev/null 2> "$W/cpu_err.txt"
say "cpu load of a cuda engine: $(tail -n 1 "$W/cpu_err.txt")"
tb "$TB" inspect "$W/s.engine" 2>&1 | grep -i -m3 "cuda\|gpu\|cc" | tee -a "$LOG"
fi # QONLY

# ---------------------------------------------------------------- 3b. perplexity
# The demo model on the held-out last 10% of tinyshakespeare ($DATA/data/tinyshakespeare.txt,
# a copy of ../shared/data's): its training script measured 3.8547 nats/token in PyTorch
# (models/demo/TRAINING.md); f32 and f16 engines on the GPU must agree within 5e-4.
if [ -f "$DATA/data/tinyshakespeare.txt" ]; then
    say "== perplexity of the demo model"
    "$PY" -c "import sys; t = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(t[int(len(t) * 0.9):])" \
        "$DATA/data/tinyshakespeare.txt" "$W/ts_test.txt"
    ppl_res=""
    [ -z "$QONLY" ] && for dt in f32 f16; do
        out=""
        tb "$TB" build "$SRC/models/demo/shakespeare" --dtype $dt -o "$W/demo_$dt.engine" --device $DEV >> "$LOG" 2>&1 &&
            out=$(tb "$TB" perplexity "$W/demo_$dt.engine" "${RUNDEV[@]}" --text "$W/ts_test.txt" --ctx 512 2>> "$LOG")
        say "demo $dt: ${out:-failed}"
        nll=$(awk '{print $4}' <<<"$out")
        ok=$("$PY" -c "import sys; print('yes' if abs(float('${nll:-nan}') - 3.8547) <= 5e-4 else 'no')")
        ppl_res="$ppl_res $dt=${nll:-none}($ok)"
    done
    if [ -z "$QONLY" ]; then
        case "$ppl_res" in
            *"(no)"*) row "demo perplexity (PyTorch 3.8547)" "FAIL$ppl_res" ;;
            *) row "demo perplexity (PyTorch 3.8547)" "PASS$ppl_res" ;;
        esac
    fi
    # quantized engines: on $DEV against the CPU engine of the same dtype
    # (exact tactics), both nll per token, within 1e-3 relative
    ppl_res=""
    [ -n "$QUANT" ] && for dt in int8 int4 fp8; do
        out=""; cout=""
        tb "$TB" build "$SRC/models/demo/shakespeare" --dtype $dt -o "$W/demo_$dt.engine" --device $DEV >> "$LOG" 2>&1 &&
            out=$(tb "$TB" perplexity "$W/demo_$dt.engine" "${RUNDEV[@]}" --text "$W/ts_test.txt" --ctx 512 2>> "$LOG")
        tb "$TB" build "$SRC/models/demo/shakespeare" --dtype $dt -o "$W/demo_${dt}_cpu.engine" --device cpu \
            --qmm-tactics exact >> "$LOG" 2>&1 &&
            cout=$(tb "$TB" perplexity "$W/demo_${dt}_cpu.engine" "${CPUDEV[@]}" --text "$W/ts_test.txt" --ctx 512 2>> "$LOG")
        say "demo $dt: ${out:-failed}; CPU engine: ${cout:-failed}"
        nll=$(awk '{print $4}' <<<"$out")
        cnll=$(awk '{print $4}' <<<"$cout")
        ok=$("$PY" -c "import sys; a, b = float('${nll:-nan}'), float('${cnll:-nan}'); print('yes' if abs(a - b) <= 1e-3 * abs(b) else 'no')" 2>> "$LOG")
        ppl_res="$ppl_res $dt=${nll:-none}/${cnll:-none}(${ok:-no})"
        rm -f "$W/demo_${dt}_cpu.engine"
    done
    if [ -n "$QUANT" ]; then
        case "$ppl_res" in
            *"(no)"*) row "demo perplexity quantized vs CPU" "FAIL$ppl_res" ;;
            *) row "demo perplexity quantized vs CPU" "PASS$ppl_res" ;;
        esac
    fi
else
    say "perplexity: $DATA/data/tinyshakespeare.txt missing (copy ../shared/data/tinyshakespeare.txt there)"
fi

# ---------------------------------------------------------------- 4. batch
# device_test PROGRAM NAME [VAR=VALUE...]: tests/PROGRAM.c on $DEV, its output in $W/NAME.txt
device_test() {
    local prog=$1 name=$2
    shift 2
    mkdir -p "$W/t$name"
    tb env TURBINE_TEST_DEVICE=$DEV TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$W/t$name" \
        TURBINE_PYTHON="$(command -v "$PY")" "$@" "$BIN/$prog" > "$W/$name.txt" 2>&1
    local rc=$?
    cat "$W/$name.txt" >> "$LOG"
    return $rc
}
if [ -z "$QONLY" ]; then
say "== every op against its reference kernel (tests/test_backend_ops.c on cpu and $DEV)"
if device_test test_backend_ops ops; then
    row "ops vs reference kernels" "PASS ($(grep -c ' bound .* ok$' "$W/ops.txt") comparisons; $(grep -o 'cuda: worst.*' "$W/ops.txt"))"
else
    row "ops vs reference kernels" "FAIL ($(grep -c ' FAIL$' "$W/ops.txt") failed:$(grep ' FAIL$' "$W/ops.txt" |
        awk '{printf " %s/%s/%s", $1, $2, $3}' | head -c 300); $(tail -n 1 "$W/ops.txt"))"
fi
# the same with the FP8 GEMM's producers unfused (TB_CUDA_FP8_FUSE=0: scales
# and codes in kernels of their own), and with every pipelined quantized
# GEMV outside clusters staging x per warp (TB_CUDA_QGEMV_XW=1; the default
# does so for int4 one-token steps only), and with every one-token int8 /
# int4 GEMV on the Q8 kernel (TB_CUDA_QGEMV_V=15; those cases then hold it to
# tb_ref_qmatmul_q8), and with every int8 step of 9+ tokens on the int8
# GEMM (TB_CUDA_I8_GEMM_ALL=1; those cases against x rounded per token),
# with quantized steps of 9-24 tokens as chunks on the GEMV and e4m3 off the
# FP8 GEMM (on the GEMV, the chunks and the mixed-input GEMM), and with steps
# past 8 tokens on dequantised weights (TB_CUDA_QGEMM=0 TB_CUDA_QCHUNK=0),
# and with every f16 / bf16 GEMV of 1..8 tokens on the bulk-copy ring
# (TB_CUDA_GEMV_TMA=3; 11: rows of K < 8192 on its 2-slot ring)
for sw in "opsq TB_CUDA_FP8_FUSE=0" "opsx TB_CUDA_QGEMV_XW=1" "ops15 TB_CUDA_QGEMV_V=15" "opsi8 TB_CUDA_I8_GEMM_ALL=1" \
          "opsc TB_CUDA_QCHUNK=24 TB_CUDA_FP8_GEMM=0" "opsd TB_CUDA_QGEMM=0 TB_CUDA_QCHUNK=0" \
          "opst TB_CUDA_GEMV_TMA=3" "opst2 TB_CUDA_GEMV_TMA=11"; do
    n=${sw%% *}; v=${sw#* }
    say "== the op cases with $v"
    # shellcheck disable=SC2086
    if device_test test_backend_ops "$n" $v; then
        row "ops vs reference kernels, ${v#TB_CUDA_}" "PASS ($(grep -c ' bound .* ok$' "$W/$n.txt") comparisons)"
    else
        row "ops vs reference kernels, ${v#TB_CUDA_}" "FAIL ($(grep -c ' FAIL$' "$W/$n.txt") failed:$(grep ' FAIL$' "$W/$n.txt" |
            awk '{printf " %s/%s/%s", $1, $2, $3}' | head -c 300); $(tail -n 1 "$W/$n.txt"))"
    fi
done
say "== the decode attention's variants, attention cases alone (TURBINE_TEST_ONLY=attention; ATTN_BLOCKS=0: no key splits)"
for v in "TB_CUDA_ATTN_MMA=0" "TB_CUDA_ATTN_MMA=2" "TB_CUDA_ATTN_MMA=3" "TB_CUDA_ATTN_MMA=3 TB_CUDA_ATTN_BLOCKS=0" \
         "TB_CUDA_ATTN_MMA=1 TB_CUDA_ATTN_BLOCKS=0" "TB_CUDA_ATTN_MMA=4" "TB_CUDA_ATTN_MMA=4 TB_CUDA_ATTN_BLOCKS=0" \
         "TB_CUDA_ATTN_MMA=6 TB_CUDA_ATTN_BLOCKS=0" "TB_CUDA_ATTN_MMA=7 TB_CUDA_ATTN_BLOCKS=0" \
         "TB_CUDA_ATTN_WARP_MIN=1 TB_CUDA_ATTN_BLOCKS=0"; do
    n="attn$(echo "$v" | sed 's/TB_CUDA_ATTN_//g' | tr -cd 'A-Z0-9')"
    # shellcheck disable=SC2086 # v is a list of VAR=VALUE words
    if device_test test_backend_ops "$n" TURBINE_TEST_ONLY=attention $v; then
        row "attention, $v" "PASS ($(grep -c ' bound .* ok$' "$W/$n.txt") comparisons)"
    else
        row "attention, $v" "FAIL ($(grep -c ' FAIL$' "$W/$n.txt") failed:$(grep ' FAIL$' "$W/$n.txt" |
            awk '{printf " %s/%s/%s", $1, $2, $3}' | head -c 300); $(tail -n 1 "$W/$n.txt"))"
    fi
done
say "== the flash prefill kernel against a double-precision reference, f16 / fp8 / int8 / bf16 caches (bench/gpu/flash_test.cu)"
if [ ! -x "$BIN/flash_test" ]; then
    row "flash prefill vs reference" "SKIP (no flash_test in $BIN)"
elif tb "$BIN/flash_test" --quick --no-bench > "$W/flash.txt" 2>&1; then
    row "flash prefill vs reference" "PASS ($(grep -o 'correctness: .*' "$W/flash.txt"))"
else
    row "flash prefill vs reference" "FAIL ($(grep -c 'FAIL' "$W/flash.txt") failed: $(grep 'FAIL' "$W/flash.txt" | head -3 | tr '\n' ';' | head -c 300))"
fi
cat "$W/flash.txt" >> "$LOG" 2>/dev/null
say "== general ops against their reference kernels (tests/test_nn_cuda.c on $DEV)"
if [ ! -x "$BIN/test_nn_cuda" ]; then
    row "general ops vs reference kernels" "SKIP (no test_nn_cuda in $BIN)"
elif device_test test_nn_cuda nn; then
    row "general ops vs reference kernels" "PASS ($(grep -c ' ok$' "$W/nn.txt") cases; $(tail -n 2 "$W/nn.txt" | head -n 1))"
else
    row "general ops vs reference kernels" "FAIL ($(grep -c 'FAIL' "$W/nn.txt") failed:$(grep 'FAIL' "$W/nn.txt" |
        awk '{printf " %s/%s", $1, $2}' | head -c 300); $(tail -n 1 "$W/nn.txt"))"
fi
say "== batched vs unbatched (tests/test_batch.c on $DEV)"
if device_test test_batch batch TURBINE_TEST_BATCH_ENGINES=float; then
    row "batched == unbatched" "PASS $(grep -o 'max rel err [0-9.e+-]*' "$W/batch.txt" | awk '{print $4}' | tr '\n' ' ')"
else
    row "batched == unbatched" "FAIL"
fi
fi # QONLY
if [ -n "$QUANT" ]; then
    say "== batched vs unbatched, quantized engines (tests/test_batch.c on $DEV)"
    # (the FP8 tensor-core path rounds x to e4m3 in steps of >= 9 tokens,
    # batched prompts included: batched == unbatched is checked without it)
    if device_test test_batch qbatch TURBINE_TEST_BATCH_ENGINES=quant TB_CUDA_FP8_GEMM=0; then
        row "batched == unbatched int8/int4/fp8" "PASS $(grep -o 'max rel err [0-9.e+-]*' "$W/qbatch.txt" | awk '{print $4}' | tr '\n' ' ')"
    else
        row "batched == unbatched int8/int4/fp8" "FAIL ($(grep -m 2 -i 'fail\|error' "$W/qbatch.txt" | tr '\n' ' ' | head -c 300))"
    fi
    # and with it, at the e4m3-activation bound of the fp8 logits rows: the
    # prompts' step mixes a 32-token run (prefill kernel) with short runs
    # after it (decode kernel at a token offset, q in f16 after the FP8
    # GEMM's f16 product)
    if device_test test_batch qbatchtc TURBINE_TEST_BATCH_ENGINES=quant TURBINE_TEST_FP8_TOL=1.5e-1; then
        row "batched == unbatched fp8, FP8 GEMM" "PASS $(grep 'fp8' "$W/qbatchtc.txt" | grep -o 'max rel err [0-9.e+-]*' | awk '{print $4}')"
    else
        row "batched == unbatched fp8, FP8 GEMM" "FAIL ($(grep -m 2 -i 'fail\|error' "$W/qbatchtc.txt" | tr '\n' ' ' | head -c 300))"
    fi
fi
if [ -z "$QONLY" ]; then
say "== sampling in the step (tests/test_sample_step.c on cuda)"
if device_test test_sample_step sample; then
    row "sampling on the device" "PASS ($(tail -n 1 "$W/sample.txt"))"
else
    row "sampling on the device" "FAIL ($(tail -n 1 "$W/sample.txt"))"
fi
say "== serve's warm-up and the KV dtypes of a context (tests/test_warmup.c, tests/test_context_kv.c on $DEV)"
for t in warmup context_kv; do
    if [ ! -x "$BIN/test_$t" ]; then
        row "test_$t" "SKIP (no test_$t in $BIN)"
    elif device_test "test_$t" "$t"; then
        row "test_$t" "PASS ($(tail -n 1 "$W/$t.txt"))"
    else
        row "test_$t" "FAIL ($(grep -m 3 'CHECK failed' "$W/$t.txt" | tr '\n' ' ' | head -c 300); $(tail -n 1 "$W/$t.txt"))"
    fi
done
# The tune cache (src/tune/tune_cache.h): a first run of an f16 engine's
# (llama134m's shapes, 2 layers)
# 16- and 32-sequence steps times cuBLASLt's candidates of its 9..256-token
# GEMMs and appends each pick to a fresh cache folder; a second run reads
# every one of them and times none (the file's records unchanged)
say "== the tune cache: cuBLASLt's timed picks kept on disk (src/tune/tune_cache.h)"
tc=$W/tunecache
rm -rf "$tc"
if [ "$DEV" = cpu ]; then
    row "tune cache" "SKIP (the CPU backend keeps no cuBLASLt picks)"
elif tcd=$W/ckpt/llama134m-l2-f32 && { [ -d "$tcd" ] || "$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m \
        --layers 2 --dtype f32 --out "$tcd" > /dev/null 2>> "$LOG"; } &&
     tb "$TB" build "$tcd" --tokenizer "$LTOK" --dtype f16 --max-batch 32 -o "$W/tc16.engine" --device $DEV >> "$LOG" 2>&1; then
    tc_n=()
    for r in 1 2; do
        tb env TURBINE_TUNE_CACHE="$tc" TB_BENCH_LOG=info "$BIN/gpu_bench" "$W/tc16.engine" --device $DEV --prefill 0 \
            --decode 2 --ctx 16 --batch 16,32 > "$W/tc$r.txt" 2>&1
        cat "$W/tc$r.txt" >> "$LOG"
        tc_n+=("$(cat "$tc"/tune-*.txt 2>/dev/null | grep -c '^lt ')")
    done
    tc_n1=${tc_n[0]} tc_n2=${tc_n[1]}
    tc_read=$(grep -o '[0-9]* cuBLASLt picks read' "$W/tc2.txt" | head -n 1 | awk '{print $1}')
    if [ "${tc_n1:-0}" -gt 0 ] && [ "$tc_n2" = "$tc_n1" ] && [ "${tc_read:-0}" = "$tc_n1" ]; then
        row "tune cache" "PASS ($tc_n1 picks timed and kept by the first run, all read and none timed by the second)"
    else
        row "tune cache" "FAIL (first run kept ${tc_n1:-0}, file after the second ${tc_n2:-0}, second read ${tc_read:-none})"
    fi
else
    row "tune cache" "FAIL (the f16 llama134m engine did not build)"
fi
fi # QONLY

fi # TB_TIMING_ONLY

# ---------------------------------------------------------------- 6. timing
# make_shape_ckpt SHAPE DIR EXTRA...: the timing checkpoint (f16 random
# weights): torch on the GPU (bench/gpu/torch_ckpt.py, with the transformers
# baseline and copy bandwidth as EXTRA asks), or in a dry run on the CPU
# (TB_DEVICE=cpu) tests/gen_checkpoints.py's big presets cut to
# TB_SHAPE_LAYERS layers
make_shape_ckpt() {
    local shape=$1 d=$2
    shift 2
    if [ "$DEV" = cpu ]; then
        local preset=llama2-7b
        [ "$shape" = tinyllama ] && preset=llama-1b
        "$PY" "$SRC/tests/gen_checkpoints.py" --preset $preset --dtype f16 --layers "${TB_SHAPE_LAYERS:-2}" --out "$d" \
            > "$W/$shape.torch.txt" 2>> "$LOG"
    else
        "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$shape" --out "$d" "$@" > "$W/$shape.torch.txt" 2>> "$LOG"
    fi
}
# matmul_bytes ENGINE: the bytes of the matmul weights (codes, scales, zeros;
# the LM head included), which a decode step reads once (`turbine inspect`)
matmul_bytes() {
    tb "$TB" inspect "$1" 2>/dev/null | sed -n 's/^bits per weight: .* over the matmul weights ([0-9]* weights, \([0-9]*\) bytes).*/\1/p'
}
# floor_note MS BYTES: "(N.NNx the floor F ms)" against the copy bandwidth $COPY_BW (TB/s)
floor_note() {
    [ -n "${COPY_BW:-}" ] && [ -n "$2" ] && [ -n "$1" ] || return 0
    awk -v ms="$1" -v b="$2" -v bw="$COPY_BW" 'BEGIN { f = b / (bw * 1e12) * 1e3; if (f > 0 && ms + 0 > 0) printf "(%.2fx the floor %.3f ms)", ms / f, f }'
}
# qrows LABEL BENCH_FILE BYTES: the rows of one gpu_bench run of a quantized engine
qrows() {
    local l=$1 f=$2 b=$3 d1 d8
    d1=$(awk '/^decode b1:/{print $3}' "$f")
    d8=$(awk '/^decode b8:/{print $3}' "$f")
    row "$l decode b1 ms" "${d1:-?} $(floor_note "$d1" "$b")"
    row "$l decode b8 ms" "${d8:-?} $(floor_note "$d8" "$b")"
    row "$l prefill 512 ms" "$(awk '/^prefill/{print $3}' "$f")"
    row "$l load / first token ms" "$(awk '/^load:/{a=$2} /^first token:/{b=$3; c=$(NF-3)} END{print a " / " b " (" c " in all)"}' "$f")"
    # "streams N (I in, O out): T gen tok/s; ... decode M ms/step"
    awk '/^streams/{n = $2; i = substr($3, 2); o = $5; for (k = 1; k <= NF; k++) { if ($k == "gen") t = $(k - 1); if ($k == "ms/step;" || $k == "ms/step") m = $(k - 1) }; print n, i "/" o, t, m}' "$f" |
        while read -r n io t m; do row "$l $n streams $io" "$t gen tok/s; decode $m ms/step"; done
}
# bench_quant SHAPE DIR: int8, int4 (group 128) and fp8 engines of the
# shape's checkpoint in DIR, built once each, timed as the f16 engine (no
# variants), the fp8 one again with an fp8 KV cache and TB_QBENCH_STREAMS
# streams; each engine is deleted after its runs (disk)
bench_quant() {
    local shape=$1 d=$2 lab=$1 q eng t0 b args
    case $shape in llama7b) lab=7B ;; tinyllama) lab=1.1B ;; esac
    for q in ${TB_QUANT_DTYPES:-int8 int4 fp8}; do
        args=(--dtype "$q")
        [ $q = int4 ] && args=(--dtype int4 --group-size 128)
        eng=$W/$shape-$q.engine
        say "== timing $shape $q ($(elapsed) s elapsed)"
        t0=$(date +%s)
        if ! tb "$TB" build "$d" -o "$eng" --tokenizer "$LTOK" "${args[@]}" --device $DEV --max-seq-len 1024 --max-batch 64 \
             >> "$LOG" 2>&1; then
            row "$lab $q" "build FAIL"; continue
        fi
        b=$(matmul_bytes "$eng")
        row "$lab $q build s" "$(( $(date +%s) - t0 )) ($(awk -v b="${b:-0}" 'BEGIN { printf "%.2f", b / 1e9 }') GB of matmul weights)"
        tb "$BIN/gpu_bench" "$eng" --device $DEV ${TB_BENCH_ARGS:---prefill 512 --decode 128 --ctx 16 --batch 1,8 --streams 64} \
            > "$W/$shape-$q.bench.txt" 2>> "$LOG"
        cat "$W/$shape-$q.bench.txt" | tee -a "$LOG"
        qrows "$lab $q" "$W/$shape-$q.bench.txt" "$b"
        if [ $q = fp8 ]; then
            say "== timing $shape fp8, fp8 KV cache ($(elapsed) s elapsed)"
            tb "$BIN/gpu_bench" "$eng" --device $DEV ${TB_BENCH_ARGS:---prefill 512 --decode 128 --ctx 16 --batch 1,8} \
                --streams "${TB_QBENCH_STREAMS:-64,256}" --kv-dtype fp8 > "$W/$shape-fp8kv.bench.txt" 2>> "$LOG"
            cat "$W/$shape-fp8kv.bench.txt" | tee -a "$LOG"
            grep -q '^kv dtype: fp8' "$W/$shape-fp8kv.bench.txt" || say "fp8 KV run: $(grep '^kv dtype' "$W/$shape-fp8kv.bench.txt")"
            qrows "$lab fp8+fp8 KV" "$W/$shape-fp8kv.bench.txt" "$b"
        fi
        rm -f "$eng"
    done
}
bench_shape() {
    local shape=$1 d=$W/$1 qs=""
    say "== timing $shape ($(elapsed) s elapsed)"
    case " ${TB_QUANT_SHAPES:-llama7b} " in *" $shape "*) [ -n "$QUANT" ] && qs=1 ;; esac
    local extra=()
    # the copy bandwidth: for the floors of the quantized rows, and TinyLlama's row
    [ "$shape" = tinyllama ] || [ -n "$qs" ] && extra=(--copy-bw)
    [ -n "${TB_SKIP_HF:-}${QONLY}" ] || extra+=(--hf-bench)
    make_shape_ckpt "$shape" "$d" "${extra[@]}"
    cat "$W/$shape.torch.txt" | tee -a "$LOG"
    COPY_BW=$(awk '/^copy_bw_TBps/{print $2}' "$W/$shape.torch.txt")
    [ -n "$COPY_BW" ] || COPY_BW=${TB_COPY_BW:-}   # TB_COPY_BW (TB/s): where none was measured (a dry run)
    local t0
    t0=$(date +%s)
    if ! tb "$TB" build "$d" -o "$W/$shape.engine" --tokenizer "$LTOK" --dtype f16 --device $DEV --max-seq-len 1024 --max-batch 64 \
         >> "$LOG" 2>&1; then
        row "$shape" "build FAIL"; rm -f "$d"/*.safetensors; return
    fi
    # the quantized engines are built from the checkpoint later
    [ -n "$qs" ] || rm -f "$d"/*.safetensors
    say "engine build: $(( $(date +%s) - t0 )) s"
    local vs="base" v
    for v in "${VARIANTS[@]}"; do vs="$vs;$v"; done
    tb "$BIN/gpu_bench" "$W/$shape.engine" --device $DEV ${TB_BENCH_ARGS:---prefill 512 --decode 128 --ctx 16 --batch 1,8 --streams 64} \
        --variants "$vs" > "$W/$shape.bench.txt" 2>> "$LOG"
    cat "$W/$shape.bench.txt" | tee -a "$LOG"
    if [ -n "${TB_NCU:-}" ] && [ "$shape" = "${TB_NCU_SHAPE:-llama7b}" ]; then
        # per-kernel device time of decode steps (ncu serialises kernels):
        # the context's first steps, then 3 decode steps at batch 1
        local NCU
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
        if [ -n "$NCU" ]; then
            tb "$NCU" --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
                "$BIN/gpu_bench" "$W/$shape.engine" --device $DEV --prefill 0 --decode 3 --ctx 16 --batch ${TB_NCU_BATCH:-1} \
                > "$OUT/ncu_$shape.csv" 2>> "$LOG"
            say "ncu: $(grep -c gpu__time_duration "$OUT/ncu_$shape.csv") kernels profiled into ncu_$shape.csv"
        fi
    fi
    local v
    for v in "${VARIANTS[@]}"; do
        row "$shape b1/b8 ms, streams ($v)" "$(awk -v t="[$v]" 'index($0, t " decode b1:") == 1 {a=$(NF-8)} index($0, t " decode b8:") == 1 {b=$(NF-8)} index($0, t " streams") == 1 {for (i = 1; i <= NF; i++) if ($i == "gen") c = $(i - 1)} END{print a " / " b " / " c " tok/s"}' "$W/$shape.bench.txt")"
    done
    local dec d8 hf pf hfpf bw mb
    mb=$(matmul_bytes "$W/$shape.engine")
    dec=$(awk '/^decode b1:/{print $3}' "$W/$shape.bench.txt")
    d8=$(awk '/^decode b8:/{print $3}' "$W/$shape.bench.txt")
    pf=$(awk '/^prefill/{print $3}' "$W/$shape.bench.txt")
    hf=$(awk '/^hf_decode_ms/{print $2}' "$W/$shape.torch.txt")
    hfpf=$(awk '/^hf_prefill512_ms/{print $2}' "$W/$shape.torch.txt")
    row "$shape f16 decode b1 ms/token" "${dec:-?} (transformers eager ${hf:-?}) $(floor_note "$dec" "$mb")"
    row "$shape f16 decode b8 ms/step" "${d8:-?} $(floor_note "$d8" "$mb")"
    row "$shape f16 prefill 512 ms" "${pf:-?} (transformers eager ${hfpf:-?})"
    for v in "${VARIANTS[@]}"; do
        case $v in *PREFILL*) row "$shape prefill 512 ($v)" "$(awk -v t="[$v]" 'index($0, t " prefill") == 1 {print $(NF-3)}' "$W/$shape.bench.txt")" ;; esac
    done
    row "$shape load / first token ms" "$(awk '/^load:/{a=$2} /^first token:/{b=$3; c=$(NF-3)} END{print a " / " b " (" c " in all)"}' "$W/$shape.bench.txt")"
    row "$shape 64 streams 128/128" "$(awk '/^streams/{for (i = 1; i <= NF; i++) { if ($i == "gen") t = $(i - 1); if ($i == "ms/step;" || $i == "ms/step") m = $(i - 1) }; print t, "gen tok/s; decode", m, "ms/step"}' "$W/$shape.bench.txt")"
    bw=$(awk '/^copy_bw_TBps/{print $2}' "$W/$shape.torch.txt")
    [ -n "$bw" ] && row "copy bandwidth TB/s" "$bw"
    rm -f "$W/$shape.engine"
    if [ -n "$qs" ]; then
        bench_quant "$shape" "$d"
        rm -f "$d"/*.safetensors
    fi
}
# Variants (the SIMT kernels, fusion, split sizes, PDL, TB_BENCH_LOGITS=1
# (logits to the host instead of sampling on the device) and
# TB_CUDA_PREFILL_GEMM=0, TB_CUDA_X16=0 and TB_CUDA_GRAPH_MAX_T=8 were
# measured in earlier runs: docs/GPU.md):
# TB_CUDA_TUNE=0: the decode GEMV's default tactic for every matmul;
# TB_CUDA_PREFILL=gemm: prefill attention as GEMMs, not the flash kernel
VARIANTS=("TB_CUDA_TUNE=0" "TB_CUDA_PREFILL=gemm")
# TB_VARIANTS="A=1;B=2 C=3": these variants instead; TB_VARIANTS=none: none
if [ "${TB_VARIANTS:-}" = none ]; then VARIANTS=()
elif [ -n "${TB_VARIANTS:-}" ]; then IFS=';' read -r -a VARIANTS <<< "$TB_VARIANTS"
elif [ -n "$QONLY" ]; then VARIANTS=()   # TB_QUANT_ONLY: the f16 7B baseline alone
fi
SHAPES=${TB_SHAPES:-llama7b tinyllama}
[ -n "$QONLY" ] && SHAPES=${TB_SHAPES:-${TB_QUANT_SHAPES:-llama7b}}
if [ -n "${TB_SKIP_TIMING:-}${TB_QUICK:-}" ]; then row timing skipped; else
for shape in $SHAPES; do bench_shape "$shape"; done
fi

if [ -z "${TB_TIMING_ONLY:-}" ]; then
# ---------------------------------------------------------------- 5. sanitizer
say "== compute-sanitizer"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "${TB_QUICK:-}" ]; then
    row "compute-sanitizer memcheck" "skipped (TB_QUICK)"
elif [ -n "$CS" ]; then
    ids=$(prompt_ids san)
    if [ -z "$QONLY" ]; then
    tb "$TB" build "$W/ckpt/qwen2-f32" -o "$W/san16.engine" --tokenizer "$TOK512" --dtype f16 --device $DEV >> "$LOG" 2>&1
    tb "$CS" --tool memcheck --error-exitcode 9 "$TB" run "$W/s.engine" "${RUNDEV[@]}" -n 150 --temperature 0 \
        -p "Once upon a time" > "$W/san1.txt" 2>&1; r1=$?
    tb "$CS" --tool memcheck --error-exitcode 9 "$TB" run "$W/san16.engine" "${RUNDEV[@]}" --prompt-ids "$ids" -n 48 \
        --temperature 0.8 --top-k 50 --top-p 0.9 --min-p 0.01 --repeat-penalty 1.1 > "$W/san2.txt" 2>&1; r2=$?
    tail -n 3 "$W/san1.txt" "$W/san2.txt" >> "$LOG"
    row "compute-sanitizer memcheck" "rc $r1 (stories f32 n=150), $r2 (qwen2 f16 32+16 sampled): $(grep -h 'ERROR SUMMARY' "$W/san1.txt" "$W/san2.txt" | tr '\n' ' ')"
    fi
    # quantized engines of step 2b (two layers of the 134M preset): int4
    # group 128 and fp8, 32 prompt ids (the prefill path) + 16 greedy steps
    # (the decode kernels)
    if [ -n "$QUANT" ]; then
        qs=""
        for q in q-llama134m-int4 q-llama134m-fp8; do
            if [ ! -f "$W/$q.engine" ]; then qs="$qs $q: no engine (step 2b failed);"; continue; fi
            tb "$CS" --tool memcheck --error-exitcode 9 "$TB" run "$W/$q.engine" "${RUNDEV[@]}" --prompt-ids "$ids" -n 48 \
                --temperature 0 > "$W/san_$q.txt" 2>&1
            r=$?
            tail -n 3 "$W/san_$q.txt" >> "$LOG"
            qs="$qs rc $r ($q 32+16 greedy): $(grep -h 'ERROR SUMMARY' "$W/san_$q.txt");"
        done
        row "compute-sanitizer memcheck, quantized" "${qs# }"
    fi
else
    row "compute-sanitizer memcheck" "not found"
fi


if [ -z "$QONLY" ]; then
# ---------------------------------------------------------------- 7. serve
# `turbine serve` on the GPU engine: a greedy completion gives the expected
# text, a repeated prompt comes from the prefix cache with the same text, n = 2
# greedy gives two copies of it, `turbine bench` drives 4 streams, /metrics
# carries the NVML gauges.
# Every stage is bounded; a stage that times out leaves the server's log and
# its threads' stacks (gdb, where there is one) in the log.
say "== serve on the GPU"
# the system's curl, whatever LD_LIBRARY_PATH the caller exported (the packed
# libraries hold a libcurl of the build machine that the device's curl binary
# cannot use: every request below would fail as "no answer")
curl() { env -u LD_LIBRARY_PATH curl "$@"; }
SPORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# env execs the server, so $! is its pid (a shell function in the background
# would be a subshell that keeps SIGINT from it)
env LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TB" serve "$W/s.engine" ${RUNDEV[@]+"${RUNDEV[@]}"} \
    --port $SPORT > "$W/serve.log" 2>&1 &
SPID=$!
for _ in $(seq 1 100); do curl -sf --max-time 2 "http://127.0.0.1:$SPORT/health" > /dev/null && break; sleep 0.2; done
stall=""
stext=$(curl -s --max-time 30 "http://127.0.0.1:$SPORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":20,"temperature":0}' | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null)
[ -z "$stext" ] && stall="completion"
ssamp=$(curl -s --max-time 30 "http://127.0.0.1:$SPORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0.9,"top_p":0.9,"seed":5,"logprobs":3}' | "$PY" -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(len(c["logprobs"]["tokens"]), "tokens, logprobs", max(c["logprobs"]["token_logprobs"]) <= 0)' 2>/dev/null)
[ -z "$ssamp" ] && stall="$stall sampled-completion"
# prefix caching and n > 1 on the GPU: a repeated prompt reuses more blocks the second time (the first
# already finds the greedy completion above, which begins like it) and writes the same text;
# greedy n = 2 gives two copies of the greedy text
LONGP="Once upon a time, there was a little girl named Lily. She liked to play in the park with her friends. One day"
sprefix=""
for k in 1 2; do
    sprefix="$sprefix $(curl -s --max-time 30 "http://127.0.0.1:$SPORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$LONGP\",\"max_tokens\":16,\"temperature\":0}" | "$PY" -c 'import json,sys; j=json.load(sys.stdin); import hashlib; print(j["usage"]["prompt_tokens_details"]["cached_tokens"], hashlib.md5(j["choices"][0]["text"].encode()).hexdigest()[:8])' 2>/dev/null | tr ' ' '/')"
done
read -r p1 p2 <<<"$sprefix"
sprefix_ok=$([ -n "$p2" ] && [ "${p2%%/*}" -gt "${p1%%/*}" ] && [ "${p1#*/}" = "${p2#*/}" ] && echo yes || echo no)
[ -z "$p2" ] && stall="$stall prefix-cache"
sn2=$(curl -s --max-time 30 "http://127.0.0.1:$SPORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":20,"temperature":0,"n":2}' | "$PY" -c 'import json,sys; c=json.load(sys.stdin)["choices"]; print("yes" if len(c) == 2 and c[0]["text"] == c[1]["text"] else "no", c[0]["text"])' 2>/dev/null)
[ -z "$sn2" ] && stall="$stall n2"
sn2_ok=$([ "${sn2%% *}" = yes ] && [ "${sn2#* }" = "$stext" ] && echo yes || echo no)
sbench=$(tb timeout 90 "$TB" bench "http://127.0.0.1:$SPORT" -c 4 -n 8 --input-len 16 --output-len 32 --timeout 30 --no-progress 2>&1 | tail -n 1)
[ -z "$sbench" ] && stall="$stall bench"
sgpu=$(curl -s --max-time 10 "http://127.0.0.1:$SPORT/metrics" | grep -c '^turbine_gpu_')
if [ -n "$stall" ]; then
    say "serve: no answer from: $stall"
    GDB=$(command -v gdb)
    [ -n "$GDB" ] && timeout 30 "$GDB" -p $SPID -batch -ex "thread apply all bt" >> "$LOG" 2>&1
    for t in /proc/$SPID/task/*; do echo "task $t: $(cat $t/comm) $(cat $t/wchan 2>/dev/null)" >> "$LOG"; done
fi
kill -INT $SPID 2> /dev/null
for _ in $(seq 1 100); do kill -0 $SPID 2> /dev/null || break; sleep 0.2; done
if kill -0 $SPID 2> /dev/null; then say "serve: still running 20 s after SIGINT; killed"; kill -9 $SPID; stall="$stall shutdown"; fi
wait $SPID 2> /dev/null
tail -n 20 "$W/serve.log" >> "$LOG"
say "serve: text ${stext:0:40}... | sampled: $ssamp | prefix cache (cached/text hash) $p1 $p2: $sprefix_ok | n=2 greedy: $sn2_ok | $sbench | $sgpu turbine_gpu_* gauges"
if [ -z "$stall" ] && head -c 60 "$DATA/models/stories260K/expected_once_upon_a_time_n200.txt" | grep -qF "${stext:0:30}" && [ "$sgpu" -ge 2 ] \
    && [ "$sprefix_ok" = yes ] && [ "$sn2_ok" = yes ]; then
    row "serve on the GPU" "PASS (greedy text, sampled with logprobs, prefix cache reuse, n=2, 4-stream bench, $sgpu GPU gauges)"
else
    row "serve on the GPU" "FAIL ${stall:+(no answer: $stall)}"
fi
fi # QONLY

fi # TB_TIMING_ONLY

say ""
say "== summary ($(elapsed) s)"
cat "$SUM"

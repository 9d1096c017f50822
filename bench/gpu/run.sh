#!/bin/bash
# bench/gpu/run.sh — the CUDA backend on one GPU: build, correctness, timing.
#
#   bash bench/gpu/run.sh
#
# 1. build  : cmake Release with CUDA into build-gpu/ (or, with TB_PREBUILT=DIR,
#             use DIR/turbine, DIR/test_batch, DIR/test_sample_step,
#             DIR/test_backend_ops, DIR/test_nn_cuda, the CUDA backend module
#             DIR/libturbine_cuda.so (loaded from the binaries' folder),
#             DIR/gpu_bench and DIR/lib/*.so: bench/gpu/pack.sh builds and
#             packs them on a machine without a GPU)
# 2. logits : random checkpoints (tests/gen_checkpoints.py) llama-gqa, qwen2,
#             mistral, llama3-rope in f32 and bf16; engines f32/f16/bf16 built
#             with --device $DEV; 32 prompt ids + 16 greedy steps compared with
#             tests/compare_logits.py (1e-4 f32 engines, 2e-2 f16/bf16), one
#             long run (300 tokens) that takes the split-K decode path; the
#             same logits against transformers' own model of each checkpoint
#             (bench/gpu/hf_logits.py); then re-runs of a few engines with
#             tuning switches flipped
# 3. text   : stories260K f32 on the GPU, -n 200 greedy, byte for byte; the
#            demo model's perplexity on tinyshakespeare's held-out split
#            (f32, f16) against the PyTorch figure (needs
#            $DATA/data/tinyshakespeare.txt)
# 4. batch  : tests/test_backend_ops.c, tests/test_nn_cuda.c, tests/test_batch.c
#             and tests/test_sample_step.c with TURBINE_TEST_DEVICE=$DEV (every
#             op x dtype against its reference kernel with the bounds of
#             docs/TESTING.md; every general op (ONNX engines) f32/f16 against
#             its reference, eager, captured and replayed as a CUDA graph;
#             batched == unbatched; sampling on the device)
# 5. timing : Llama-2-7B and TinyLlama-1.1B shapes, f16 random weights:
#             64 streams, prefill 512, decode b1/b8 ms/step, then the same
#             with each variant's switches (one process, one engine load:
#             gpu_bench --variants); transformers eager FP16 on the same
#             weights (unless TB_SKIP_HF); copy bandwidth
# 6. memchk : compute-sanitizer memcheck on short runs (greedy and sampled)
# 7. serve  : turbine serve on the GPU: greedy and sampled completions, a
#             4-stream turbine bench, the NVML gauges (every stage bounded)
# Steps run in this order so that a run cut short by a time limit still has
# the correctness and the 7B figures; every result is appended to $OUT as it
# comes.
# Env: OUT (results folder), TB_GPU_DATA (folder with models/stories260K and
# models/llama2_tokenizer.bin; default .devdata/gpu), TB_SKIP_HF (no
# transformers baseline), TB_SHAPES (default "llama7b tinyllama"),
# TB_SKIP_TIMING, TB_VARIANTS (";"-separated switch sets timed after the
# default), TB_BENCH_ARGS (gpu_bench's workload flags), TB_TIMING_ONLY, TB_QUICK (f32 checkpoints only, no long runs, re-runs,
# timing or sanitizer: ~40 s).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$SRC/bench/out/gpu}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
W=${TB_WORK:-/tmp/tb-gpu}
PY=${TB_PYTHON:-python3}
DEV=${TB_DEVICE:-cuda}   # cpu: a dry run of this script on a machine without a GPU
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
          make -C "$BIN" -j"$(nproc)" turbine test_batch test_sample_step test_backend_ops test_nn_cuda gpu_bench >> "$LOG" 2>&1); then
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
[ -n "${TB_QUICK:-}" ] && CDTS=f32   # TB_QUICK: f32 checkpoints only, no long runs, reruns, timing, sanitizer
for p in llama-gqa qwen2 mistral llama3-rope; do
    for cdt in $CDTS; do
        d=$W/ckpt/$p-$cdt
        "$PY" "$SRC/tests/gen_checkpoints.py" --preset $p --dtype $cdt --out "$d" > /dev/null 2>> "$LOG" || { say "FAIL gen $p $cdt"; continue; }
        case_run "$p-$cdt-f32" "$d" f32 1e-4
        if [ $cdt = f32 ]; then case_run "$p-$cdt-f16" "$d" f16 2e-2
        else case_run "$p-$cdt-bf16" "$d" bf16 2e-2; fi
    done
done
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

# ---------------------------------------------------------------- 3. stories260K
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

# ---------------------------------------------------------------- 3b. perplexity
# The demo model on the held-out last 10% of tinyshakespeare ($DATA/data/tinyshakespeare.txt,
# a copy of ../shared/data's): its training script measured 3.8547 nats/token in PyTorch
# (models/demo/TRAINING.md); f32 and f16 engines on the GPU must agree within 5e-4.
if [ -f "$DATA/data/tinyshakespeare.txt" ]; then
    say "== perplexity of the demo model"
    "$PY" -c "import sys; t = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(t[int(len(t) * 0.9):])" \
        "$DATA/data/tinyshakespeare.txt" "$W/ts_test.txt"
    ppl_res=""
    for dt in f32 f16; do
        out=""
        tb "$TB" build "$SRC/models/demo/shakespeare" --dtype $dt -o "$W/demo_$dt.engine" --device $DEV >> "$LOG" 2>&1 &&
            out=$(tb "$TB" perplexity "$W/demo_$dt.engine" "${RUNDEV[@]}" --text "$W/ts_test.txt" --ctx 512 2>> "$LOG")
        say "demo $dt: ${out:-failed}"
        nll=$(awk '{print $4}' <<<"$out")
        ok=$("$PY" -c "import sys; print('yes' if abs(float('${nll:-nan}') - 3.8547) <= 5e-4 else 'no')")
        ppl_res="$ppl_res $dt=${nll:-none}($ok)"
    done
    case "$ppl_res" in
        *"(no)"*) row "demo perplexity (PyTorch 3.8547)" "FAIL$ppl_res" ;;
        *) row "demo perplexity (PyTorch 3.8547)" "PASS$ppl_res" ;;
    esac
else
    say "perplexity: $DATA/data/tinyshakespeare.txt missing (copy ../shared/data/tinyshakespeare.txt there)"
fi

# ---------------------------------------------------------------- 4. batch
# device_test PROGRAM NAME: tests/PROGRAM.c on $DEV, its output in $W/NAME.txt
device_test() {
    mkdir -p "$W/t$2"
    tb env TURBINE_TEST_DEVICE=$DEV TURBINE_SHARED="$DATA" TURBINE_SRC="$SRC" TURBINE_TMP="$W/t$2" \
        TURBINE_PYTHON="$(command -v "$PY")" "$BIN/$1" > "$W/$2.txt" 2>&1
    local rc=$?
    cat "$W/$2.txt" >> "$LOG"
    return $rc
}
say "== every op against its reference kernel (tests/test_backend_ops.c on cpu and $DEV)"
if device_test test_backend_ops ops; then
    row "ops vs reference kernels" "PASS ($(grep -c ' bound .* ok$' "$W/ops.txt") comparisons; $(grep -o 'cuda: worst.*' "$W/ops.txt"))"
else
    row "ops vs reference kernels" "FAIL ($(grep -c ' FAIL$' "$W/ops.txt") failed:$(grep ' FAIL$' "$W/ops.txt" |
        awk '{printf " %s/%s/%s", $1, $2, $3}' | head -c 300); $(tail -n 1 "$W/ops.txt"))"
fi
say "== general ops against their reference kernels (tests/test_nn_cuda.c on $DEV)"
if [ ! -x "$BIN/test_nn_cuda" ]; then
    row "general ops vs reference kernels" "SKIP (no test_nn_cuda in $BIN)"
elif device_test test_nn_cuda nn; then
    row "general ops vs reference kernels" "PASS ($(grep -c ' ok$' "$W/nn.txt") cases; $(tail -n 2 "$W/nn.txt" | head -n 1))"
else
    row "general ops vs reference kernels" "FAIL ($(grep -c 'FAIL' "$W/nn.txt") failed:$(grep 'FAIL' "$W/nn.txt" |
        awk '{printf " %s/%s", $1, $2}' | head -c 300); $(tail -n 1 "$W/nn.txt"))"
fi
say "== batched vs unbatched (tests/test_batch.c on cuda)"
if device_test test_batch batch; then
    row "batched == unbatched" "PASS $(grep -o 'max rel err [0-9.e+-]*' "$W/batch.txt" | awk '{print $4}' | tr '\n' ' ')"
else
    row "batched == unbatched" "FAIL"
fi
say "== sampling in the step (tests/test_sample_step.c on cuda)"
if device_test test_sample_step sample; then
    row "sampling on the device" "PASS ($(tail -n 1 "$W/sample.txt"))"
else
    row "sampling on the device" "FAIL ($(tail -n 1 "$W/sample.txt"))"
fi

fi # TB_TIMING_ONLY

# ---------------------------------------------------------------- 6. timing
bench_shape() {
    local shape=$1 d=$W/$1
    say "== timing $shape ($(elapsed) s elapsed)"
    local extra=""
    [ "$shape" = tinyllama ] && extra="--copy-bw"
    local hfb=--hf-bench
    [ -n "${TB_SKIP_HF:-}" ] && hfb=""
    "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$shape" --out "$d" $hfb $extra > "$W/$shape.torch.txt" 2>> "$LOG"
    cat "$W/$shape.torch.txt" | tee -a "$LOG"
    local t0=$(date +%s)
    if ! tb "$TB" build "$d" -o "$W/$shape.engine" --tokenizer "$LTOK" --dtype f16 --device $DEV --max-seq-len 1024 --max-batch 64 \
         >> "$LOG" 2>&1; then
        row "$shape" "build FAIL"; return
    fi
    rm -f "$d/model.safetensors"
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
    local dec hf pf hfpf bw
    dec=$(awk '/^decode b1:/{print $3}' "$W/$shape.bench.txt")
    pf=$(awk '/^prefill/{print $3}' "$W/$shape.bench.txt")
    hf=$(awk '/^hf_decode_ms/{print $2}' "$W/$shape.torch.txt")
    hfpf=$(awk '/^hf_prefill512_ms/{print $2}' "$W/$shape.torch.txt")
    row "$shape f16 decode b1 ms/token" "${dec:-?} (transformers eager ${hf:-?})"
    row "$shape f16 decode b8 ms/step" "$(awk '/^decode b8:/{print $3}' "$W/$shape.bench.txt")"
    row "$shape f16 prefill 512 ms" "${pf:-?} (transformers eager ${hfpf:-?})"
    for v in "${VARIANTS[@]}"; do
        case $v in *PREFILL*) row "$shape prefill 512 ($v)" "$(awk -v t="[$v]" 'index($0, t " prefill") == 1 {print $(NF-3)}' "$W/$shape.bench.txt")" ;; esac
    done
    row "$shape load / first token ms" "$(awk '/^load:/{a=$2} /^first token:/{b=$3; c=$(NF-3)} END{print a " / " b " (" c " in all)"}' "$W/$shape.bench.txt")"
    row "$shape 64 streams 128/128" "$(awk '/^streams/{for (i = 1; i <= NF; i++) if ($i == "gen") print $(i - 1), "gen tok/s; decode", $(NF - 1), "ms/step"}' "$W/$shape.bench.txt")"
    bw=$(awk '/^copy_bw_TBps/{print $2}' "$W/$shape.torch.txt")
    [ -n "$bw" ] && row "copy bandwidth TB/s" "$bw"
    rm -f "$W/$shape.engine"
}
# Variants (the SIMT kernels, fusion, split sizes, PDL, TB_BENCH_LOGITS=1
# (logits to the host instead of sampling on the device) and
# TB_CUDA_PREFILL_GEMM=0, TB_CUDA_X16=0 and TB_CUDA_GRAPH_MAX_T=8 were
# measured in earlier runs: docs/GPU.md):
# TB_CUDA_TUNE=0: the decode GEMV's default tactic for every matmul;
# TB_CUDA_PREFILL=gemm: prefill attention as GEMMs, not the flash kernel
VARIANTS=("TB_CUDA_TUNE=0" "TB_CUDA_PREFILL=gemm")
# TB_VARIANTS="A=1;B=2 C=3": these variants instead
if [ -n "${TB_VARIANTS:-}" ]; then IFS=';' read -r -a VARIANTS <<< "$TB_VARIANTS"; fi
if [ -n "${TB_SKIP_TIMING:-}${TB_QUICK:-}" ]; then row timing skipped; else
for shape in ${TB_SHAPES:-llama7b tinyllama}; do bench_shape "$shape"; done
fi

if [ -z "${TB_TIMING_ONLY:-}" ]; then
# ---------------------------------------------------------------- 5. sanitizer
say "== compute-sanitizer"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "${TB_QUICK:-}" ]; then
    row "compute-sanitizer memcheck" "skipped (TB_QUICK)"
elif [ -n "$CS" ]; then
    ids=$(prompt_ids san)
    tb "$TB" build "$W/ckpt/qwen2-f32" -o "$W/san16.engine" --tokenizer "$TOK512" --dtype f16 --device $DEV >> "$LOG" 2>&1
    tb "$CS" --tool memcheck --error-exitcode 9 "$TB" run "$W/s.engine" "${RUNDEV[@]}" -n 150 --temperature 0 \
        -p "Once upon a time" > "$W/san1.txt" 2>&1; r1=$?
    tb "$CS" --tool memcheck --error-exitcode 9 "$TB" run "$W/san16.engine" "${RUNDEV[@]}" --prompt-ids "$ids" -n 48 \
        --temperature 0.8 --top-k 50 --top-p 0.9 --min-p 0.01 --repeat-penalty 1.1 > "$W/san2.txt" 2>&1; r2=$?
    tail -n 3 "$W/san1.txt" "$W/san2.txt" >> "$LOG"
    row "compute-sanitizer memcheck" "rc $r1 (stories f32 n=150), $r2 (qwen2 f16 32+16 sampled): $(grep -h 'ERROR SUMMARY' "$W/san1.txt" "$W/san2.txt" | tr '\n' ' ')"
else
    row "compute-sanitizer memcheck" "not found"
fi


# ---------------------------------------------------------------- 7. serve
# `turbine serve` on the GPU engine: a greedy completion gives the expected
# text, a repeated prompt comes from the prefix cache with the same text, n = 2
# greedy gives two copies of it, `turbine bench` drives 4 streams, /metrics
# carries the NVML gauges.
# Every stage is bounded; a stage that times out leaves the server's log and
# its threads' stacks (gdb, where there is one) in the log.
say "== serve on the GPU"
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

fi # TB_TIMING_ONLY

say ""
say "== summary ($(elapsed) s)"
cat "$SUM"

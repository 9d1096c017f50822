#!/bin/bash
# bench/gpu/serve_warmup.sh — `turbine serve`'s LLM warm-up on one GPU: how
# long the server takes to report ready and what the first load after start
# gets, with --model-warmup off, on, and on with cuBLASLt's picks read from
# the tune cache (a restart).
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz &&
#     TB_PREBUILT=/tmp/pb OUT=$OUT bash bench/gpu/serve_warmup.sh
#
# The shape TB_SHAPE (default llama7b; tinyllama too) in f16 random weights:
# the checkpoint of bench/gpu/run.sh's timing step when TB_WORK (default
# /tmp/tb-gpu) still holds it, else made by bench/gpu/torch_ckpt.py (by
# tests/gen_checkpoints.py's presets with TB_DEVICE=cpu). One
# engine (--max-batch 64). For each of off, on: `turbine serve
# --max-num-seqs 64`, seconds from start to /health answering and the ready
# line; then `turbine bench` closed loop at 64 clients, TB_N requests (default
# 128) of 128 prompt / 128 output tokens twice: the first load after start
# (a cold server pays each batch size's first step there) and again (warm),
# each round with prompts of its own seed (a repeated prompt would come from
# the prefix cache). The modes TB_MODES (default "off on cached"), all of
# them TB_REPEAT times (default 2): off, on (the tune cache off:
# TURBINE_TUNE_CACHE=off, every cuBLASLt pick timed), cached (warm-up on
# with a tune cache folder of its own, which the round's first cached start
# fills and later ones read: "cached" twice or more shows the restart).
# Every stage is bounded (timeout).
#
# Env: OUT, TB_PREBUILT (default build-gpu), TB_WORK, TB_SHAPE, TB_N, TB_REPEAT, TB_MODES, TB_DEVICE
# (cuda; cpu for a dry run with a small preset: TB_SHAPE=llama-gqa and
# TB_TOKENIZER=../shared/models/stories260K/tok512.bin), TB_TOKENIZER,
# TB_PYTHON (python3 with numpy), TB_GPU_DATA (llama2_tokenizer.bin under
# models/; default .devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$SRC/bench/out/serve-warmup}
W=${TB_WORK:-/tmp/tb-gpu}
BIN=${TB_PREBUILT:-$SRC/build-gpu}
PY=${TB_PYTHON:-python3}
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
SHAPE=${TB_SHAPE:-llama7b}
DEV=${TB_DEVICE:-cuda}
N=${TB_N:-128}
REPEAT=${TB_REPEAT:-2}
MODES=${TB_MODES:-off on cached}
mkdir -p "$OUT" "$W"
LOG=$OUT/serve_warmup.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
TB=$BIN/turbine
TOK=${TB_TOKENIZER:-$DATA/models/llama2_tokenizer.bin}
curl() { env -u LD_LIBRARY_PATH curl "$@"; }

d=$W/$SHAPE
if ! ls "$d"/*.safetensors > /dev/null 2>&1; then
    say "== making the $SHAPE checkpoint (f16, random weights)"
    if [ "$DEV" = cpu ]; then
        timeout 300 "$PY" "$SRC/tests/gen_checkpoints.py" --preset "$SHAPE" --dtype f16 --out "$d" > /dev/null 2>> "$LOG"
    else # on the GPU, with torch (bench/gpu/torch_ckpt.py, as run.sh's timing step)
        timeout 300 "$PY" "$SRC/bench/gpu/torch_ckpt.py" --shape "$SHAPE" --out "$d" > /dev/null 2>> "$LOG"
    fi || { say "FAIL gen $SHAPE"; exit 1; }
fi
eng=$W/$SHAPE-warmup.engine
t0=$(date +%s.%N)
timeout 300 "$TB" build "$d" -o "$eng" --tokenizer "$TOK" --dtype f16 --device "$DEV" --max-seq-len 1024 --max-batch 64 \
    >> "$LOG" 2>&1 || { say "FAIL build"; exit 1; }
say "build: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

rc=0
seed=0
tcache=$W/tune-cache
rm -rf "$tcache"
for mode in $(for _ in $(seq 1 "$REPEAT"); do echo "$MODES"; done); do
    warm=on tc=off
    [ "$mode" = off ] && warm=off
    [ "$mode" = cached ] && tc=$tcache
    port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    t0=$(date +%s.%N)
    TURBINE_TUNE_CACHE=$tc "$TB" serve "$eng" --device "$DEV" --port "$port" --max-num-seqs 64 --model-warmup $warm \
        > "$OUT/serve-$mode.log" 2>&1 &
    pid=$!
    up=""
    for _ in $(seq 1 600); do
        curl -sf --max-time 2 "http://127.0.0.1:$port/health" > /dev/null && { up=1; break; }
        kill -0 $pid 2> /dev/null || break
        sleep 0.1
    done
    ready=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    if [ -z "$up" ]; then
        say "FAIL $mode: not healthy within 60 s"; tail -n 20 "$OUT/serve-$mode.log" | tee -a "$LOG"
        kill -9 $pid 2> /dev/null; rc=1; continue
    fi
    say "$mode (--model-warmup $warm, TURBINE_TUNE_CACHE $tc; $(cat "$tcache"/tune-*.txt 2> /dev/null | grep -c '^lt ') picks kept): healthy after $ready s; $(grep -o 'ready in.*' "$OUT/serve-$mode.log")"
    for round in first second; do
        seed=$((seed + 1)) # prompts no earlier round sent (no prefix-cache hits)
        timeout 180 "$TB" bench "http://127.0.0.1:$port" -c 64 -n "$N" --input-len 128 --output-len 128 --timeout 60 \
            --seed $seed --no-progress --json "$OUT/bench-$mode-$round.json" > "$OUT/bench-$mode-$round.txt" 2>&1 || rc=1
        say "  $round load: $("$PY" - "$OUT/bench-$mode-$round.json" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report (%s)" % e); sys.exit(0)
p = j["points"][0]
print("%.0f output tok/s, TTFT p50 %.1f / p99 %.1f ms, ITL p50 %.2f / p99 %.2f ms, %d of %d ok, %.1f s" % (
    p["output_token_throughput"], p["ttft"]["p50_ms"], p["ttft"]["p99_ms"], p["itl"]["p50_ms"], p["itl"]["p99_ms"],
    p["requests_ok"], p["requests_sent"], p["duration_s"]))
EOF
)"
    done
    kill -INT $pid 2> /dev/null
    for _ in $(seq 1 100); do kill -0 $pid 2> /dev/null || break; sleep 0.2; done
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
done
rm -f "$eng"
exit $rc

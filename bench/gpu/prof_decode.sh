#!/bin/bash
# bench/gpu/prof_decode.sh — per-kernel GPU time of one decode step of a
# 7B-shape engine on the GPU machine (ncu), at each batch of PD_BATCHES,
# summed by kernel name: where a step's time goes beyond its matmuls.
#
#   tar -C /tmp -xJf .devdata/gpu/prebuilt.tar.xz && bash bench/gpu/prof_decode.sh
#
# gpu_bench runs a prompt of PD_CTX tokens per sequence, then PD_STEPS decode
# steps under ncu (every kernel of the run profiled); the last step is cut
# out of the kernel list as the rows between the last two launches of the
# run's final kernel (a step ends with the same kernel each time; the script
# checks that the two steps before it have the same length). ncu runs each
# kernel alone (no overlap with its neighbours, programmatic launch off), so
# the sum is above the step's time in a graph: use it to rank, gpu_bench's
# own step time for totals (printed beside it, from a run without ncu).
#
# Env: TB_PREBUILT (default /tmp/pb), OUT (results), PD_DTYPES ("fp8"),
# PD_BATCHES ("1 64"), PD_CTX (128), PD_STEPS (4), PD_KV (KV dtype, default
# the engine's; "fp8" for an fp8 cache), PD_MAXB (the engine's --max-batch,
# 64), PD_STREAMS (also gpu_bench --streams with this list, e.g. "64,256";
# default none), PD_VARIANTS (gpu_bench --variants for the timings without
# ncu, e.g. "base;TB_CUDA_QGEMV_V=4"), TB_GPU_DATA (.devdata/gpu).
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PB=${TB_PREBUILT:-/tmp/pb}
O=${OUT:-$PWD/pd}/pd
DATA=${TB_GPU_DATA:-$SRC/.devdata/gpu}
mkdir -p "$O"
export LD_LIBRARY_PATH=$PB/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
CK=/tmp/pd_7b
[ -f $CK/config.json ] || python3 "$SRC/bench/gpu/torch_ckpt.py" --shape llama7b --out $CK > "$O/ckpt.txt" 2>&1 ||
    { echo "checkpoint FAIL"; tail -3 "$O/ckpt.txt"; exit 1; }
echo "7B checkpoint ($(el) s)"
kv=(); [ -n "${PD_KV:-}" ] && kv=(--kv-dtype "$PD_KV")
for q in ${PD_DTYPES:-fp8}; do
    args=(--dtype "$q"); [ "$q" = int4 ] && args=(--dtype int4 --group-size 128)
    [ -f /tmp/pd_$q.engine ] || "$PB/turbine" build $CK -o /tmp/pd_$q.engine --tokenizer "$DATA/models/llama2_tokenizer.bin" \
        "${args[@]}" --device cuda --max-seq-len 1024 --max-batch "${PD_MAXB:-64}" > "$O/build_$q.txt" 2>&1 ||
        { echo "build $q FAIL"; tail -3 "$O/build_$q.txt"; continue; }
    echo "built $q ($(el) s)"
    if [ -n "${PD_STREAMS:-}" ]; then
        timeout 200 "$PB/gpu_bench" /tmp/pd_$q.engine --device cuda --prefill 512 --decode 32 --ctx 16 --batch 1,8 \
            --streams "$PD_STREAMS" "${kv[@]}" > "$O/streams_$q.txt" 2>&1
        echo "$q $(grep -E '^prefill|^decode|^streams' "$O/streams_$q.txt" | tr '\n' ' ') ($(el) s)"
    fi
    for b in ${PD_BATCHES:-1 64}; do
        timeout 120 "$PB/gpu_bench" /tmp/pd_$q.engine --device cuda --prefill 0 --decode 32 --ctx "${PD_CTX:-128}" \
            --batch "$b" "${kv[@]}" --variants "${PD_VARIANTS:-base}" > "$O/bench_${q}_b$b.txt" 2>&1
        echo "$q b$b without ncu:"; grep -E 'decode' "$O/bench_${q}_b$b.txt"
        timeout 240 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
            "$PB/gpu_bench" /tmp/pd_$q.engine --device cuda --prefill 0 --decode "${PD_STEPS:-4}" --ctx "${PD_CTX:-128}" \
            --batch "$b" "${kv[@]}" > "$O/ncu_${q}_b$b.csv" 2> "$O/ncu_${q}_b$b.err"
        echo "ncu $q b$b rc $? ($(el) s)"
        python3 - "$O/ncu_${q}_b$b.csv" <<'PY'
import csv, sys, collections, re
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get('Metric Name') != 'gpu__time_duration.sum': continue
    v = float(r['Metric Value'].replace(',', ''))
    unit = r.get('Metric Unit', 'nsecond')
    v = v * {'nsecond': 1e-3, 'usecond': 1.0, 'msecond': 1e3}.get(unit, 1e-3)
    rows.append((re.sub(r'\(.*', '', r['Kernel Name'])[:60], v))
if len(rows) < 4: print('  too few kernels profiled'); sys.exit(0)
last = rows[-1][0]
idx = [i for i, (n, _) in enumerate(rows) if n == last]
if len(idx) < 3: print('  no repeating step found'); sys.exit(0)
a, b, c = idx[-3], idx[-2], idx[-1]
step = rows[b + 1:c + 1]
print(f'  one step: {len(step)} kernels (the step before: {b - a}), {sum(v for _, v in step) / 1e3:.3f} ms summed')
agg = collections.defaultdict(lambda: [0, 0.0])
for n, v in step: agg[n][0] += 1; agg[n][1] += v
tot = sum(v for _, v in step)
for n, (k, v) in sorted(agg.items(), key=lambda x: -x[1][1])[:14]:
    print(f'  {v:9.1f} us {100 * v / tot:5.1f}%  x{k:<4d} {n}')
PY
    done
done

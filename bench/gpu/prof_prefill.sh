#!/bin/bash
# bench/gpu/prof_prefill.sh — one 512-token prefill of 7B-shape f16 and fp8
# engines on the GPU machine: correctness of a new build against an old one
# (logits of every position and greedy ids identical), prefill and decode
# times of both builds alternating, then per-kernel GPU time of one prefill
# (ncu) with the new build, summed by kernel name.
#
#   bash bench/gpu/prof_prefill.sh   # binaries: /tmp/pb (new), /tmp/pb_old (old, optional)
#
# Env: OUT (results), PP_DTYPES ("fp8 f16"), PP_NCU (1: the ncu stage),
# PP_OLD_ENV (e.g. "TB_CUDA_FP8_FUSE=0": "old" is the new build under these
# settings instead of /tmp/pb_old), PP_BENCH_EXTRA (more gpu_bench options).
set -u
PB=/tmp/pb; OLD=/tmp/pb_old
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
O=${OUT:-$PWD/pp}/pp; mkdir -p $O
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
fails=0
python3 bench/gpu/torch_ckpt.py --shape llama7b --out /tmp/pp_ck > $O/ckpt.txt 2>&1 || { tail -3 $O/ckpt.txt; exit 1; }
IDS=$(python3 -c "print(','.join(str(3 + (i * 7919) % 31000) for i in range(512)))")
for q in ${PP_DTYPES:-fp8 f16}; do
  LD_LIBRARY_PATH=$PB/lib:/usr/local/cuda/lib64 $PB/turbine build /tmp/pp_ck -o /tmp/pp_$q.engine \
     --tokenizer .devdata/gpu/models/llama2_tokenizer.bin --dtype $q --device cuda --max-seq-len 1024 --max-batch 64 \
     > $O/build_$q.txt 2>&1 || { echo "build $q FAIL"; tail -3 $O/build_$q.txt; continue; }
  echo "built $q ($(el) s)"
  for b in new old; do
    d=$PB; e=; [ $b = old ] && { if [ -n "${PP_OLD_ENV:-}" ]; then e=$PP_OLD_ENV; else d=$OLD; fi; }
    [ -x $d/turbine ] || continue
    env $e LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64 $d/turbine run /tmp/pp_$q.engine --device cuda --prompt-ids $IDS -n 8 \
       --temperature 0 --logits-out $O/logits_${q}_$b.bin > $O/run_${q}_$b.txt 2> $O/run_${q}_$b.err ||
       { echo "run $q $b FAIL: $(tail -2 $O/run_${q}_$b.err)"; fails=$((fails + 1)); }
  done
  if [ -x $OLD/turbine ] || [ -n "${PP_OLD_ENV:-}" ]; then
    if cmp -s $O/run_${q}_new.txt $O/run_${q}_old.txt && python3 -c "
import numpy as np, sys
a=np.fromfile('$O/logits_${q}_new.bin',np.float32); b=np.fromfile('$O/logits_${q}_old.bin',np.float32)
ok = a.size == b.size and a.size > 0
d = float(np.abs(a-b).max()) if ok else float('inf'); sc = max(1.0, float(np.abs(b).max())) if ok else 1.0
print(f'max|d| {d:.3g} of scale {sc:.3g} ({d/sc:.2g})')
sys.exit(0 if ok and d / sc <= 1e-3 else 1)"; then
      echo "$q: greedy ids identical and logits of 520 positions within 1e-3 of scale, new against old build: PASS"
    else
      echo "$q: new and old builds differ: FAIL"; fails=$((fails + 1))
    fi
  fi
  for r in 1 2; do
    for b in old new; do
      d=$PB; e=; [ $b = old ] && { if [ -n "${PP_OLD_ENV:-}" ]; then e=$PP_OLD_ENV; else d=$OLD; fi; }
      [ -x $d/gpu_bench ] || continue
      env $e LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64 timeout 120 $d/gpu_bench /tmp/pp_$q.engine \
         --device cuda --prefill 512 --decode 32 --ctx 16 --batch 1,8 --streams 64 ${PP_BENCH_EXTRA:-} \
         > $O/bench_${q}_${r}_$b.txt 2>&1
      echo "$q round $r $b: $(grep -E '^prefill|^decode|^streams' $O/bench_${q}_${r}_$b.txt | tr '\n' ' ')"
    done
  done
  if [ "${PP_NCU:-1}" = 1 ]; then
  LD_LIBRARY_PATH=$PB/lib:/usr/local/cuda/lib64 timeout 200 ncu --clock-control none --cache-control none \
     --metrics gpu__time_duration.sum --csv $PB/turbine run /tmp/pp_$q.engine --device cuda --prompt-ids $IDS -n 1 \
     --temperature 0 > $O/ncu_$q.csv 2> $O/ncu_$q.err
  echo "ncu $q rc $? ($(el) s)"
  python3 - $O/ncu_$q.csv <<'PY'
import csv, sys, collections
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
tot = collections.defaultdict(float); cnt = collections.Counter()
for x in csv.DictReader(lines):
    if x.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(x["Metric Value"].replace(",", "")); u = x.get("Metric Unit", "")
    us = v / 1000 if u == "nsecond" else v * 1000 if u == "msecond" else v
    n = x["Kernel Name"][:90]
    tot[n] += us; cnt[n] += 1
s = sum(tot.values())
print(f"total {s/1000:.3f} ms over {sum(cnt.values())} kernels (context create, the 512-token step, one decode step)")
for n, v in sorted(tot.items(), key=lambda t: -t[1])[:20]:
    print(f"{v/1000:8.3f} ms {cnt[n]:5d}x  {n}")
PY
  fi
  rm -f /tmp/pp_$q.engine
done
echo "prof_prefill: $fails failed ($(el) s)"
exit $((fails > 0))

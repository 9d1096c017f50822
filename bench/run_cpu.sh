#!/usr/bin/env bash
# run_cpu.sh — Turbine's CPU benchmark: decode and prefill speed of Turbine
# engines next to a plain C llama2.c-style program and PyTorch, on the same
# weights, with the machine's memory bandwidth and FMA throughput measured in
# the same run (they vary over time on this machine).
#
# Usage: bench/run_cpu.sh [--quick] [--reps N] [--no-turbine] [--no-peer]
#                         [--no-torch] [--no-peer-prefill] [--no-build]
#                         [--timeout S] [--max-minutes M] [--quiet-wait S]
#   --quick            1 repetition, shorter generations, no token-by-token
#                      prefill of the C peer
#   --reps N           repetitions of every measurement (default 3); the
#                      variants are interleaved within a repetition and the
#                      median is reported
#   --timeout S        limit for any one command (default 300 s)
#   --max-minutes M    no new repetition starts after M minutes (default 40)
#   --quiet-wait S     before each measurement, wait up to S seconds (default
#                      30) for the other processes on the machine to use less
#                      than 10% of the CPUs
# Other processes share this machine: each run records how many cores they
# kept busy while it ran, and the medians use only the runs where that stayed
# under 0.2 cores when there is at least one such run.
# Environment: TURBINE_SHARED (default ../shared from the repo root),
#   TURBINE_BIN (default build-bench/turbine).
# Output: progress on stderr; bench/out/results.json; on stdout the markdown
# tables for docs/PERFORMANCE.md.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${TURBINE_SHARED:-$ROOT/../shared}
OUT=$ROOT/bench/out
LOGS=$OUT/logs
PY=/usr/bin/python3
BUILD=$ROOT/build-bench

ARGS="$*"
REPS=3 QUICK=0 DO_TURBINE=1 DO_PEER=1 DO_TORCH=1 DO_PEER_PREFILL=1 DO_BUILD=1
TIMEOUT=300 MAX_MIN=40 QUIET_WAIT=30
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1; REPS=1; DO_PEER_PREFILL=0 ;;
    --reps) REPS=$2; shift ;;
    --no-turbine) DO_TURBINE=0 ;;
    --no-peer) DO_PEER=0 ;;
    --no-torch) DO_TORCH=0 ;;
    --no-peer-prefill) DO_PEER_PREFILL=0 ;;
    --no-build) DO_BUILD=0 ;;
    --timeout) TIMEOUT=$2; shift ;;
    --max-minutes) MAX_MIN=$2; shift ;;
    --quiet-wait) QUIET_WAIT=$2; shift ;;
    -h|--help) sed -n 2,26p "$0"; exit 0 ;;
    *) echo "run_cpu.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for v in "$REPS" "$TIMEOUT" "$MAX_MIN" "$QUIET_WAIT"; do
  case $v in ''|*[!0-9]*) echo "run_cpu.sh: option values must be whole numbers" >&2; exit 2 ;; esac
done
[ "$REPS" -ge 1 ] && [ "$REPS" -le 20 ] || { echo "run_cpu.sh: --reps must be 1..20" >&2; exit 2; }

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }

S260=$SHARED/models/stories260K
LLAMA_TOK=$SHARED/models/llama2_tokenizer.bin
[ -f "$S260/stories260K.bin" ] || { echo "run_cpu.sh: no $S260/stories260K.bin (set TURBINE_SHARED)" >&2; exit 1; }
mkdir -p "$OUT" "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.out "$LOGS"/*.err "$OUT/manifest.tsv" "$OUT/checks.tsv"
T_START=$(date +%s)

if [ $QUICK = 1 ]; then N134=32 N260=128; else N134=128 N260=256; fi
# Llama-2 ids of "Once upon a time" (BOS first), and the same for tok512.
IDS134=1,9038,2501,263,931
IDS260=1,403,407,261,378
# 512 prompt ids for prefill: BOS then a fixed pseudo-random sequence.
PREFILL_IDS=1
for i in $(seq 1 511); do PREFILL_IDS="$PREFILL_IDS,$(( 3 + (i * 7919) % 31997 ))"; done

# check NAME RESULT DETAIL
check() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/checks.tsv"; log "check $1: $2 $3"; }

# ------------------------------------------------------------ build
TURBINE=${TURBINE_BIN:-$BUILD/turbine}
BANDWIDTH=$BUILD/bandwidth
if [ $DO_BUILD = 1 ]; then
  log "building (Release) in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > "$LOGS/cmake.log" 2>&1 \
    || log "cmake configure failed (see $LOGS/cmake.log)"
  cmake --build "$BUILD" -j2 --target bandwidth > "$LOGS/build_bandwidth.log" 2>&1 \
    || log "target bandwidth failed to build"
  if [ $DO_TURBINE = 1 ]; then
    cmake --build "$BUILD" -j2 --target turbine > "$LOGS/build_turbine.log" 2>&1 \
      || log "target turbine failed to build (see $LOGS/build_turbine.log)"
  fi
fi
if [ ! -x "$BANDWIDTH" ]; then
  log "bandwidth: compiling bench/bandwidth.c on its own"
  BANDWIDTH=$OUT/bandwidth
  gcc -O2 -pthread "$ROOT/bench/bandwidth.c" -o "$BANDWIDTH" || { echo "run_cpu.sh: cannot build bandwidth" >&2; exit 1; }
fi
PEER=$OUT/llama2c_peer
if [ $DO_PEER = 1 ]; then
  gcc -O3 -march=native -fopenmp "$ROOT/bench/peers/llama2c_peer.c" -o "$PEER" -lm \
    || { log "peer failed to compile"; DO_PEER=0; }
fi
if [ $DO_TURBINE = 1 ] && [ ! -x "$TURBINE" ]; then
  log "no turbine binary at $TURBINE: Turbine figures will be pending"
  DO_TURBINE=0
fi

# ------------------------------------------------------------ checkpoints
CK=$OUT/llama134m_f32
GEN=$ROOT/tests/gen_checkpoints.py
if [ ! -f "$CK/model.safetensors" ] || [ "$GEN" -nt "$CK/config.json" ]; then
  log "generating the 134M checkpoint"
  rm -rf "$CK"
  timeout "$TIMEOUT" $PY "$GEN" --preset llama134m --dtype f32 --out "$CK" >&2 \
    || { echo "run_cpu.sh: checkpoint generation failed" >&2; exit 1; }
fi
CK_BIN=$OUT/llama134m_f32.llama2c.bin
if [ $DO_PEER = 1 ] && { [ ! -f "$CK_BIN" ] || [ "$CK/model.safetensors" -nt "$CK_BIN" ]; }; then
  log "exporting the 134M checkpoint to llama2.c format"
  timeout "$TIMEOUT" $PY "$ROOT/bench/torch_baseline.py" "$CK" --export-llama2c "$CK_BIN" 2>> "$LOGS/export.log" \
    || { log "export failed"; rm -f "$CK_BIN"; }
fi

# ------------------------------------------------------------ correctness checks
if [ $DO_PEER = 1 ]; then
  timeout "$TIMEOUT" "$PEER" "$S260/stories260K.bin" -z "$S260/tok512.bin" -p "Once upon a time" --steps 200 -t 1 \
    > "$LOGS/peer_stories260K_text.log" 2>/dev/null
  if cmp -s "$LOGS/peer_stories260K_text.log" "$S260/expected_once_upon_a_time_n200.txt"; then
    check peer_stories260K_expected_text pass "byte-identical to expected_once_upon_a_time_n200.txt"
  else
    check peer_stories260K_expected_text FAIL "differs from expected_once_upon_a_time_n200.txt"
  fi
  if [ $DO_TORCH = 1 ] && [ -f "$CK_BIN" ]; then
    P=$(timeout "$TIMEOUT" "$PEER" "$CK_BIN" --prompt-ids $IDS134 -n 16 -t 2 2>/dev/null)
    T=$(timeout "$TIMEOUT" $PY "$ROOT/bench/torch_baseline.py" "$CK" --prompt-ids $IDS134 --greedy 16 2>/dev/null \
        | sed -n 's/^GREEDY //p')
    if [ -n "$P" ] && [ "$P" = "$T" ]; then
      check peer_vs_torch_134m_greedy16 pass "same 16 greedy ids"
    else
      check peer_vs_torch_134m_greedy16 FAIL "peer [$P] torch [$T]"
    fi
  fi
fi

# ------------------------------------------------------------ engines
# build_engine NAME SRC TOKENIZER [extra args]
build_engine() {
  local name=$1 src=$2 tok=$3; shift 3
  local eng=$OUT/$name.engine t0 t1
  rm -f "$eng"
  t0=$(date +%s.%N)
  if timeout "$TIMEOUT" "$TURBINE" build "$src" -o "$eng" --tokenizer "$tok" "$@" > "$LOGS/build_$name.log" 2>&1 \
     && [ -f "$eng" ]; then
    t1=$(date +%s.%N)
    printf 'build\t%s\t%s\t%s\n' "$name" "$(awk "BEGIN{print $t1 - $t0}")" "$(stat -c %s "$eng")" >> "$OUT/manifest.tsv"
    log "engine $name built"
  else
    log "engine $name: build failed (see $LOGS/build_$name.log)"
    rm -f "$eng"
  fi
}
if [ $DO_TURBINE = 1 ]; then
  build_engine stories260K_f32 "$S260/stories260K.bin" "$S260/tok512.bin"
  # the same checkpoint as an f16 engine: half the bytes per token (0.5 MB,
  # inside the two cores' L2); measured only if it writes the expected text
  build_engine stories260K_f16 "$S260/stories260K.bin" "$S260/tok512.bin" --dtype f16
  if [ -f "$OUT/stories260K_f16.engine" ]; then
    timeout "$TIMEOUT" "$TURBINE" run "$OUT/stories260K_f16.engine" -n 200 --temperature 0 -p "Once upon a time" \
      > "$LOGS/stories260K_f16_text.log" 2>/dev/null
    if cmp -s "$LOGS/stories260K_f16_text.log" "$S260/expected_once_upon_a_time_n200.txt"; then
      check stories260K_f16_expected_text pass "byte-identical to expected_once_upon_a_time_n200.txt"
    else
      check stories260K_f16_expected_text FAIL "differs from expected_once_upon_a_time_n200.txt"
      rm -f "$OUT/stories260K_f16.engine"
    fi
  fi
  build_engine llama134m_f32 "$CK" "$LLAMA_TOK"
  build_engine llama134m_f16 "$CK" "$LLAMA_TOK" --dtype f16
fi

# ------------------------------------------------------------ measurements
HZ=$(getconf CLK_TCK)
# Busy jiffies of all CPUs together since boot (user..steal minus idle, iowait).
busy_jiffies() {
  local c
  read -r -a c < /proc/stat
  echo $(( c[1] + c[2] + c[3] + c[6] + c[7] + c[8] ))
}
# Waits (at most QUIET_WAIT seconds) until the machine is nearly idle: less
# than 10% of all CPUs busy over half a second.
wait_quiet() {
  local deadline=$(( $(date +%s) + QUIET_WAIT )) a b ncpu
  ncpu=$(nproc)
  while :; do
    a=$(busy_jiffies); sleep 0.5; b=$(busy_jiffies)
    [ $(( (b - a) * 100 * 2 )) -lt $(( 10 * HZ * ncpu )) ] && return 0
    [ "$(date +%s)" -ge $deadline ] && { log "machine still busy after ${QUIET_WAIT}s: measuring anyway"; return 0; }
    sleep 1
  done
}

# measure REP KIND MODEL DTYPE THREADS -- command...
# Runs the command under the time limit once the machine is quiet, keeps its
# stdout in F.out and its stderr in F.err, and records in the manifest the
# run, the cores the command itself used (its user+system time over its wall
# time) and the cores that other processes kept busy meanwhile (all busy CPU
# time minus the command's own, over its wall time).
measure() {
  local rep=$1 kind=$2 model=$3 dtype=$4 th=$5; shift 6
  local f="$LOGS/r${rep}_${kind}_${model}_${dtype}_t${th}" rc j0 j1 tt others own
  wait_quiet
  j0=$(busy_jiffies)
  tt=$( { TIMEFORMAT='%R %U %S'; time timeout "$TIMEOUT" "$@" > "$f.out" 2> "$f.err"; } 2>&1 )
  rc=$?
  j1=$(busy_jiffies)
  others=$(echo "$tt" | tail -1 | awk -v j=$(( j1 - j0 )) -v hz="$HZ" \
    '{ o = (j / hz - $2 - $3) / ($1 > 0 ? $1 : 1); printf "%.3f", o < 0 ? 0 : o }')
  own=$(echo "$tt" | tail -1 | awk '{ printf "%.3f", ($2 + $3) / ($1 > 0 ? $1 : 1) }')
  printf 'run\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$kind" "$model" "$dtype" "$th" "$rc" "$f" "$others" "$own" \
    >> "$OUT/manifest.tsv"
  [ $rc = 0 ] || log "rc=$rc: $kind $model $dtype t$th (see $f.err)"
  awk -v o="$others" 'BEGIN { exit !(o >= 0.2) }' && log "contended ($others cores busy elsewhere): $kind $model $dtype t$th"
  return 0
}

cat /proc/loadavg > "$OUT/loadavg_start.txt"
for rep in $(seq 1 "$REPS"); do
  if [ $(( $(date +%s) - T_START )) -gt $(( MAX_MIN * 60 )) ]; then
    log "time limit reached: stopping after $((rep - 1)) repetitions"; break
  fi
  log "repetition $rep/$REPS"
  measure "$rep" bandwidth machine - 12 -- "$BANDWIDTH" --threads 1,2 --mib 256 --reps 30 --seconds 20
  for th in 1 2; do
    if [ $DO_TURBINE = 1 ]; then
      for dt in f32 f16; do
        E=$OUT/stories260K_$dt.engine
        [ -f "$E" ] && measure "$rep" turbine_decode stories260K $dt $th -- \
          "$TURBINE" run "$E" --prompt-ids $IDS260 -n $N260 --temperature 0 --threads $th
      done
      for dt in f32 f16; do
        E=$OUT/llama134m_$dt.engine
        [ -f "$E" ] || continue
        measure "$rep" turbine_decode llama134m $dt $th -- \
          "$TURBINE" run "$E" --prompt-ids $IDS134 -n $N134 --temperature 0 --threads $th
        measure "$rep" turbine_prefill llama134m $dt $th -- \
          "$TURBINE" run "$E" --prompt-ids $PREFILL_IDS -n 1 --temperature 0 --threads $th
      done
    fi
    if [ $DO_PEER = 1 ]; then
      measure "$rep" peer_decode stories260K f32 $th -- \
        "$PEER" "$S260/stories260K.bin" --prompt-ids $IDS260 -n $N260 -t $th
      if [ -f "$CK_BIN" ]; then
        measure "$rep" peer_decode llama134m f32 $th -- "$PEER" "$CK_BIN" --prompt-ids $IDS134 -n $N134 -t $th
        [ $DO_PEER_PREFILL = 1 ] && measure "$rep" peer_prefill llama134m f32 $th -- \
          "$PEER" "$CK_BIN" --prompt-ids $PREFILL_IDS -n 1 -t $th
      fi
    fi
    if [ $DO_TORCH = 1 ]; then
      measure "$rep" torch llama134m f32 $th -- $PY "$ROOT/bench/torch_baseline.py" "$CK" --threads $th \
        --prompt-ids $IDS134 --decode-tokens $N134 --prefill-ids $PREFILL_IDS
    fi
  done
done
cat /proc/loadavg > "$OUT/loadavg_end.txt"

# ------------------------------------------------------------ summary
log "summarising"
OUT="$OUT" S260="$S260" CK="$CK" ROOT="$ROOT" REPS="$REPS" QUICK="$QUICK" \
N134="$N134" N260="$N260" TURBINE="$TURBINE" DO_TURBINE="$DO_TURBINE" \
CMDLINE="bench/run_cpu.sh $ARGS" $PY - <<'PYEOF'
import json, os, re, statistics, struct, subprocess, time, platform

E = os.environ
out = E["OUT"]

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def timing(path):
    """The key=value pairs of the last 'timing:' line in a log."""
    d = None
    try:
        for line in open(path + ".err", errors="replace"):
            if line.startswith("timing:"):
                d = {k: float(v) for k, v in re.findall(r"(\w+)=([-0-9.eE+]+)", line)}
    except OSError:
        pass
    return d

def json_line(path, prefix=""):
    try:
        for line in open(path + ".out", errors="replace"):
            if prefix and line.startswith(prefix):
                return json.loads(line[len(prefix):])
            if not prefix and line.startswith("{"):
                return json.loads(line)
    except (OSError, ValueError):
        pass
    return None

runs, builds = [], {}
for line in open(os.path.join(out, "manifest.tsv")) if os.path.exists(os.path.join(out, "manifest.tsv")) else []:
    f = line.rstrip("\n").split("\t")
    if f[0] == "build":
        builds[f[1]] = {"build_s": float(f[2]), "engine_bytes": int(f[3])}
    elif f[0] == "run":
        runs.append(dict(rep=int(f[1]), kind=f[2], model=f[3], dtype=f[4], threads=f[5], rc=int(f[6]),
                         log=f[7], others_cores=float(f[8]), own_cores=float(f[9])))

checks = []
if os.path.exists(os.path.join(out, "checks.tsv")):
    for line in open(os.path.join(out, "checks.tsv")):
        n, r, d = line.rstrip("\n").split("\t", 2)
        checks.append({"name": n, "result": r, "detail": d})

# samples[(kind, model, dtype, threads, metric)] = [(value, quiet)] over
# repetitions; quiet: other processes kept under 0.2 cores busy meanwhile.
CONTENDED = 0.2
samples = {}
for r in runs:
    if r["rc"] != 0:
        continue
    def add(key, v, quiet=r["others_cores"] < CONTENDED):
        samples.setdefault(key, []).append((v, quiet))
    if r["kind"] == "bandwidth":
        j = json_line(r["log"])
        if j:
            for x in j["results"]:
                for m in ("copy_gb_s", "read_gb_s", "fma_gflop_s"):
                    add(("machine", x["threads"], m), x[m])
            add(("machine", 0, "cpuinfo_mhz"), j["cpuinfo_mhz"])
    elif r["kind"] == "torch":
        j = json_line(r["log"], "RESULT ")
        if j:
            add(("torch", "llama134m", "f32", 0, "load_ms"), j["load_ms"])
            for x in j["runs"]:
                add(("torch_decode", "llama134m", "f32", x["threads"], "tok_s"), x["gen_tok_s"])
                if "prefill_tok_s" in x:
                    add(("torch_prefill", "llama134m", "f32", x["threads"], "tok_s"), x["prefill_tok_s"])
    else:
        t = timing(r["log"])
        if not t:
            continue
        th = int(r["threads"])
        base = r["kind"].split("_")[0]
        if r["kind"].endswith("_decode"):
            add((r["kind"], r["model"], r["dtype"], th, "tok_s"), t.get("gen_tok_s"))
        else:
            add((r["kind"], r["model"], r["dtype"], th, "tok_s"), t.get("prompt_tok_s"))
        add((base + "_load", r["model"], r["dtype"], th, "load_ms"), t.get("load_ms"))

def values(key):
    """The quiet samples of key, or all of them when none was quiet."""
    s = [(v, q) for v, q in samples.get(key, []) if v is not None]
    quiet = [v for v, q in s if q]
    return quiet if quiet else [v for v, q in s]

def get(*key):
    return med(values(key))

# Weight bytes read per decoded token: every matmul weight and the LM head.
def shape_134m():
    c = json.load(open(os.path.join(E["CK"], "config.json")))
    d, h, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    nh = c["num_attention_heads"]; kv = d // nh * c.get("num_key_value_heads", nh)
    return dict(dim=d, hidden=h, layers=L, kv_dim=kv, vocab=c["vocab_size"])

def shape_260k():
    with open(os.path.join(E["S260"], "stories260K.bin"), "rb") as f:
        d, h, L, nh, nkv, v, _ = struct.unpack("<7i", f.read(28))
    return dict(dim=d, hidden=h, layers=L, kv_dim=d // nh * nkv, vocab=abs(v))

def matmul_params(s):
    d, h, L, kv = s["dim"], s["hidden"], s["layers"], s["kv_dim"]
    return L * (2 * d * d + 2 * d * kv + 3 * d * h) + s["vocab"] * d

shapes = {"llama134m": shape_134m(), "stories260K": shape_260k()}
DT_BYTES = {"f32": 4, "f16": 2}

def pct(a, b):
    return None if a is None or not b else 100.0 * a / b

decode, prefill = [], []
for model, dtypes in (("stories260K", ["f32", "f16"]), ("llama134m", ["f32", "f16"])):
    P = matmul_params(shapes[model])
    for dt in dtypes:
        wb = P * DT_BYTES[dt]
        for th in (1, 2):
            bw = get("machine", th, "copy_gb_s")
            floor = bw * 1e9 / wb if bw else None
            tu = get("turbine_decode", model, dt, th, "tok_s")
            pe = get("peer_decode", model, dt, th, "tok_s")
            to = get("torch_decode", model, dt, th, "tok_s")
            decode.append(dict(model=model, dtype=dt, threads=th, weight_bytes_per_token=wb,
                               copy_gb_s=bw, floor_tok_s=floor, turbine_tok_s=tu, peer_tok_s=pe,
                               torch_tok_s=to, turbine_pct_of_floor=pct(tu, floor),
                               peer_pct_of_floor=pct(pe, floor), torch_pct_of_floor=pct(to, floor)))
# Prefill floor: 2 flops per matmul weight per token, plus attention over the
# causal prefix (QK^T and AV: 4 * dim flops per layer per earlier position).
s = shapes["llama134m"]
T = 512
flops_tok = 2 * matmul_params(s) + 4 * s["layers"] * s["dim"] * (T + 1) / 2
for dt in ("f32", "f16"):
    for th in (1, 2):
        fma = get("machine", th, "fma_gflop_s")
        floor = fma * 1e9 / flops_tok if fma else None
        tu = get("turbine_prefill", "llama134m", dt, th, "tok_s")
        prefill.append(dict(model="llama134m", dtype=dt, threads=th, prompt_tokens=T,
                            flops_per_token=flops_tok, fma_gflop_s=fma, floor_tok_s=floor,
                            turbine_tok_s=tu,
                            peer_tok_s=get("peer_prefill", "llama134m", dt, th, "tok_s"),
                            torch_tok_s=get("torch_prefill", "llama134m", dt, th, "tok_s"),
                            turbine_pct_of_floor=pct(tu, floor)))

engines = []
for name, model, dt in (("stories260K_f32", "stories260K", "f32"), ("stories260K_f16", "stories260K", "f16"),
                        ("llama134m_f32", "llama134m", "f32"), ("llama134m_f16", "llama134m", "f16")):
    b = builds.get(name, {})
    loads = values(("turbine_load", model, dt, 1, "load_ms")) + \
            values(("turbine_load", model, dt, 2, "load_ms"))
    engines.append(dict(engine=name, build_s=b.get("build_s"), engine_bytes=b.get("engine_bytes"),
                        load_ms=med(loads)))

mhz = get("machine", 0, "cpuinfo_mhz")
machine = {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
           "cores": os.cpu_count(), "cpuinfo_mhz": mhz,
           "fma_peak_gflop_s_per_core_from_clock": 32 * mhz / 1e3 if mhz else None,
           "loadavg_start": open(os.path.join(out, "loadavg_start.txt")).read().strip(),
           "loadavg_end": open(os.path.join(out, "loadavg_end.txt")).read().strip()}
for th in (1, 2):
    for m in ("copy_gb_s", "read_gb_s", "fma_gflop_s"):
        machine[f"{m}_t{th}"] = get("machine", th, m)
        machine[f"{m}_t{th}_samples"] = [v for v, q in samples.get(("machine", th, m), [])]

res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": E["CMDLINE"].strip(),
       "reps": int(E["REPS"]), "quick": E["QUICK"] == "1",
       "decode_gen_tokens": {"llama134m": int(E["N134"]), "stories260K": int(E["N260"])},
       "machine": machine, "checks": checks, "decode": decode, "prefill": prefill, "engines": engines,
       "peer_load_ms": get("peer_load", "llama134m", "f32", 1, "load_ms"),
       "torch_load_ms": get("torch", "llama134m", "f32", 0, "load_ms"),
       "samples": {"|".join(map(str, k)): [v for v, q in s] for k, s in samples.items()},
       "contended_runs": [dict(kind=r["kind"], model=r["model"], dtype=r["dtype"], threads=r["threads"],
                               rep=r["rep"], others_cores=r["others_cores"])
                          for r in runs if r["others_cores"] >= CONTENDED],
       "failed_runs": [r for r in runs if r["rc"] != 0]}
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)

def f(x, nd=1):
    return "pending" if x is None else f"{x:,.{nd}f}"

def g(x, nd=1):
    return "—" if x is None else f"{x:,.{nd}f}"

print(f"Measured {res['date']} with `{res['command']}` ({res['reps']} repetitions, median; "
      f"load average {machine['loadavg_start']} at start).\n")
print("| threads | copy GB/s (read+write) | read GB/s | FMA GFLOP/s measured | clock implied by FMA, GHz | FMA GFLOP/s at cpuinfo clock |")
print("|---|---|---|---|---|---|")
for th in (1, 2):
    fc = machine["fma_peak_gflop_s_per_core_from_clock"]
    fm = machine[f"fma_gflop_s_t{th}"]
    print(f"| {th} | {g(machine[f'copy_gb_s_t{th}'])} | {g(machine[f'read_gb_s_t{th}'])} | "
          f"{g(fm)} | {g(fm / 32 / th if fm else None, 2)} | {g(fc * th if fc else None)} |")
print("\nDecode, batch 1 (tok/s; floor = copy bandwidth ÷ weight bytes per token):\n")
print("| model | dtype | threads | Turbine tok/s | C peer tok/s | PyTorch tok/s | bandwidth floor tok/s | % of floor |")
print("|---|---|---|---|---|---|---|---|")
for r in decode:
    na = r["dtype"] != "f32"
    print(f"| {r['model']} | {r['dtype']} | {r['threads']} | {f(r['turbine_tok_s'])} | "
          f"{'—' if na else g(r['peer_tok_s'])} | {'—' if na or r['model'] != 'llama134m' else g(r['torch_tok_s'])} | "
          f"{g(r['floor_tok_s'])} | {f(r['turbine_pct_of_floor'], 0)} |")
print("\nPrefill, 512-token prompt (tok/s; floor = measured FMA throughput ÷ flops per token):\n")
print("| model | dtype | threads | Turbine tok/s | C peer tok/s | PyTorch tok/s | FMA floor tok/s | % of floor |")
print("|---|---|---|---|---|---|---|---|")
for r in prefill:
    na = r["dtype"] != "f32"
    print(f"| {r['model']} | {r['dtype']} | {r['threads']} | {f(r['turbine_tok_s'])} | "
          f"{'—' if na else g(r['peer_tok_s'])} | {'—' if na else g(r['torch_tok_s'])} | "
          f"{g(r['floor_tok_s'])} | {f(r['turbine_pct_of_floor'], 0)} |")
print("\nEngines:\n")
print("| engine | build s | size MB | load ms |")
print("|---|---|---|---|")
for e in engines:
    print(f"| {e['engine']} | {f(e['build_s'], 2)} | {f(e['engine_bytes'] / 1e6 if e['engine_bytes'] else None)} | {f(e['load_ms'], 1)} |")
over = [r for r in runs if r["kind"] != "bandwidth" and r["threads"].isdigit()
        and r["own_cores"] > int(r["threads"]) + 0.3]
res["runs_using_more_cores_than_threads"] = [
    dict(kind=r["kind"], model=r["model"], dtype=r["dtype"], threads=r["threads"], rep=r["rep"],
         own_cores=r["own_cores"]) for r in over]
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)
nc = len(res["contended_runs"])
print(f"\n{len(runs)} runs, {nc} of them with other processes keeping ≥ {CONTENDED} cores busy "
      "(medians use the quiet runs where there are any).")
if over:
    print("\nRuns that used more cores than their thread count (CPU time ÷ wall time): " +
          "; ".join(f"{r['kind']} {r['model']} {r['dtype']} t{r['threads']} rep {r['rep']}: "
                    f"{r['own_cores']:.2f}" for r in over))
if checks:
    print("\nChecks: " + "; ".join(f"{c['name']}: {c['result']}" for c in checks))
PYEOF

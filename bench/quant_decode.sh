#!/usr/bin/env bash
# quant_decode.sh — decode of a random 134M Llama's f32 / int8 / int4 engines
# against their bandwidth floor, in interleaved rounds, for one build of
# turbine or an A/B of two (docs/PERFORMANCE.md, "Quantized engines end to
# end").
#
#   OUT=/tmp/qd bench/quant_decode.sh NEW_TURBINE [BASE_TURBINE]
#
# NEW_TURBINE, BASE_TURBINE: `turbine` binaries (e.g. build/turbine and
# /work/main/build/turbine). Each build makes its own engines in OUT with its
# own defaults and tactic timing (an A/B compares what each build gives a
# user), from one random llama134m checkpoint (OUT/ck, made once with
# tests/gen_checkpoints.py). Then ROUNDS rounds, each: the read figure of
# `bandwidth --threads 2` (BANDWIDTH, default: the one beside NEW_TURBINE),
# then every engine, NEW and BASE engine by engine (which goes first
# alternates between rounds), with
#   turbine bench --engine E --batch 1 --input-len 512 --output-len 128 --threads 2
# One line per round and engine: decode p50 ms, the bytes a decode step reads
# (from `turbine inspect` and the bench's KV dtype, below), the floor (bytes
# / the round's read bandwidth), the share of it reached, and NEW's p50 over
# BASE's in that round. A summary of medians follows. The memory bandwidth of
# a shared host swings between rounds seconds apart: compare within a round.
#
# Bytes per step: every weight but the embedding table (a step reads one row
# of it; a head tied to it, no lm_head tensor, reads all of it), plus the KV
# cache up to the position, averaged over the steps: layers x 2 x kv heads x
# (head_dim x element bytes, + a 4-byte scale for int8 / fp8) x (input-len +
# output-len / 2).
#
# SHARE=1: BASE runs NEW's engine files (only NEW builds): the A/B then
# measures the runtime and kernels alone, not the engines' build-time
# tactic timing (which a loaded machine sways: two f32 builds of one
# checkpoint picked OpenBLAS for 24 and 48 decode matmuls) nor their
# defaults. Without it each build runs its own engines: what each gives a
# user.
#
# Environment: OUT (required), ROUNDS (3), ENGINES (default "f32 int8 int4";
# names: f32, int8, int4, int4h16 = int4 --override lm_head=f16, int4h8 =
# int4 --override lm_head=int8), KV (a --kv-dtype for every bench run, e.g.
# f16; default the engine's), IN (512), NOUT (128), THREADS (2), REBUILD=1
# (build the engines again), TOKENIZER (the llama2 tokenizer in
# $TURBINE_SHARED/models, default /work/shared).
set -uo pipefail
NEW=${1:?usage: OUT=DIR quant_decode.sh NEW_TURBINE [BASE_TURBINE]}
BASE=${2:-}
: "${OUT:?OUT=DIR}"
ROUNDS=${ROUNDS:-3}; ENGINES=${ENGINES:-f32 int8 int4}; IN=${IN:-512}; NOUT=${NOUT:-128}; THREADS=${THREADS:-2}
SRC=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${TURBINE_SHARED:-/work/shared}
TOKENIZER=${TOKENIZER:-$SHARED/models/llama2_tokenizer.bin}
BANDWIDTH=${BANDWIDTH:-$(dirname "$NEW")/bandwidth}
PY=/usr/bin/python3
mkdir -p "$OUT"
[ -x "$BANDWIDTH" ] || { echo "no bandwidth binary at $BANDWIDTH (set BANDWIDTH)" >&2; exit 1; }
if [ ! -f "$OUT/ck/model.safetensors" ]; then
  "$PY" "$SRC/tests/gen_checkpoints.py" --preset llama134m --dtype f32 --out "$OUT/ck" >/dev/null || exit 1
fi
args_of() {
  case $1 in
    f32) echo "--dtype f32" ;; int8) echo "--dtype int8" ;; int4) echo "--dtype int4" ;;
    int4h16) echo "--dtype int4 --override lm_head=f16" ;; int4h8) echo "--dtype int4 --override lm_head=int8" ;;
    *) echo "unknown engine name '$1'" >&2; return 1 ;;
  esac
}
BUILDS=(new); [ -n "$BASE" ] && BUILDS+=(base)
bin_of() { [ "$1" = new ] && echo "$NEW" || echo "$BASE"; }
eng_of() { [ "${SHARE:-0}" = 1 ] && echo "$OUT/new_$2.engine" || echo "$OUT/${1}_$2.engine"; }
# engines, and each one's bytes per step without the KV cache
declare -A WBYTES
for b in "${BUILDS[@]}"; do
  for e in $ENGINES; do
    f=$(eng_of $b $e)
    if [ "$b" = new ] || [ "${SHARE:-0}" != 1 ] && { [ ! -f "$f" ] || [ "${REBUILD:-0}" = 1 ]; }; then
      # shellcheck disable=SC2046
      "$(bin_of $b)" build "$OUT/ck" --tokenizer "$TOKENIZER" $(args_of "$e") -o "$f" >"$OUT/build_${b}_$e.log" 2>&1 \
        || { echo "build $b $e failed: $(tail -1 "$OUT/build_${b}_$e.log")" >&2; exit 1; }
    fi
    WBYTES[$b.$e]=$("$(bin_of $b)" inspect "$f" | awk '
      / bytes +at / { n = $1; for (i = 1; i <= NF; i++) if ($(i + 1) == "bytes") by = $i
                      if (n == "embed") emb = by; else w += by; if (n == "lm_head") head = 1 }
      END { printf "%d\n", w + (head ? 0 : emb) }')
  done
done
echo "# quant_decode.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "# new: $NEW${BASE:+, base: $BASE}; engines: $ENGINES$([ "${SHARE:-0}" = 1 ] && echo " (NEW's files for both)"); bench --batch 1 --input-len $IN --output-len $NOUT --threads $THREADS${KV:+ --kv-dtype $KV}"
R="$OUT/rounds.tsv"
: >"$R"
for r in $(seq 1 "$ROUNDS"); do
  bw=$("$BANDWIDTH" --threads "$THREADS" --reps 3 --seconds 3 2>&1 | sed -n 's/^threads=.* read_gb_s=\([0-9.]*\).*/\1/p')
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) read ${bw:-?} GB/s"
  # odd rounds NEW first, even rounds BASE first: the first run after the
  # bandwidth pass was slower in round after round
  order=("${BUILDS[@]}"); [ $((r % 2)) = 0 ] && [ ${#BUILDS[@]} = 2 ] && order=(base new)
  for e in $ENGINES; do
    for b in "${order[@]}"; do
      j="$OUT/bench.json"
      # shellcheck disable=SC2086
      "$(bin_of $b)" bench --engine "$(eng_of $b $e)" --batch 1 --input-len "$IN" --output-len "$NOUT" \
        --threads "$THREADS" ${KV:+--kv-dtype $KV} --json "$j" >/dev/null 2>"$OUT/bench.err" \
        || { echo "bench $b $e failed: $(tail -1 "$OUT/bench.err")" >&2; continue; }
      "$PY" - "$j" "$OUT/ck/config.json" "${WBYTES[$b.$e]}" "$IN" "$NOUT" "${bw:-0}" "$r" "$b" "$e" >>"$R" <<'EOF'
import json, sys
j, cfg = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
w, n_in, n_out, bw = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
kvd = j.get("kv_dtype", "f32")
esz = {"f32": 4, "f16": 2, "bf16": 2, "int8": 1, "i8": 1, "fp8": 1, "fp8_e4m3": 1}.get(kvd, 4)
hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
kvh = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
row = hd * esz + (4 if esz == 1 else 0)
kv = cfg["num_hidden_layers"] * 2 * kvh * row * (n_in + n_out / 2)
p = j["points"][0]
print("\t".join([sys.argv[7], sys.argv[8], sys.argv[9], kvd, "%.3f" % p["decode_step_p50_ms"], "%.1f" % ((w + kv) / 1e6),
                 "%.2f" % bw]))
EOF
    done
  done
  # this round's lines
  "$PY" - "$R" "$r" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.split("\t")[0] == sys.argv[2]]
p50 = {(b, e): float(ms) for _, b, e, _, ms, _, _ in rows}
for _, b, e, kvd, ms, mb, bw in rows:
    floor = float(mb) / 1e3 / float(bw) * 1e3 if float(bw) > 0 else 0
    ratio = ("  new/base %.3f" % (float(ms) / p50[("base", e)])) if b == "new" and ("base", e) in p50 else ""
    print("  %-4s %-8s kv %-5s p50 %8.3f ms  %7.1f MB/step  floor %6.2f ms  %3.0f%% of floor%s"
          % (b, e, kvd, float(ms), float(mb), floor, 100 * floor / float(ms) if floor else 0, ratio))
EOF
done
echo "== medians over $ROUNDS rounds (end $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
"$PY" - "$R" <<'EOF'
import statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
keys = []
for r in rows:
    if (r[1], r[2]) not in keys: keys.append((r[1], r[2]))
f32 = {}
for b, e in keys:
    rs = [r for r in rows if (r[1], r[2]) == (b, e)]
    ms = st.median(float(r[4]) for r in rs)
    share = st.median(float(r[5]) / float(r[6]) / float(r[4]) * 100 for r in rs if float(r[6]) > 0)
    if e == "f32": f32[b] = ms
    vs = " %.2fx f32" % (f32[b] / ms) if b in f32 else ""
    print("  %-4s %-8s p50 %8.3f ms (median)  %7.1f MB/step  %3.0f%% of floor (median of the rounds)%s"
          % (b, e, ms, float(rs[0][5]), share, vs))
ratios = {}
for r in rows:
    if r[1] == "new":
        base = [x for x in rows if x[0] == r[0] and x[1] == "base" and x[2] == r[2]]
        if base: ratios.setdefault(r[2], []).append(float(r[4]) / float(base[0][4]))
for e, v in ratios.items():
    print("  new/base %-8s per round: %s (median %.3f)" % (e, " ".join("%.3f" % x for x in v), st.median(v)))
EOF

#!/usr/bin/env bash
# startup.sh — what a command costs as a whole process: `turbine --help`, a CPU
# `turbine run` of stories260K for 256 tokens (prompt included, greedy) next to
# the llama2.c-style C peer doing the same run, and the resident memory of the
# run against the engine's size. Every command is started REPS times
# (interleaved, so a burst of load on this shared machine hits all of them);
# the median wall time and the median peak RSS are reported.
#
# Usage: bench/startup.sh [--reps N] [--threads T] [--quiet-wait S]
#   --reps N        starts of each command (default 20)
#   --threads T     threads of both runs (default 2)
#   --quiet-wait S  before each round, wait up to S seconds in all (default
#                   120) for the other processes on this shared machine to use
#                   less than 10% of the CPUs; the medians use the quiet
#                   rounds when there are at least 3 (the count is printed)
# Environment: TURBINE_BIN (default build/turbine), TURBINE_SHARED (default
#   ../shared from the repository root), TURBINE_BASELINE_BIN (another turbine
#   binary, e.g. an older build, timed on the same commands for comparison).
# Output: the table for docs/PERFORMANCE.md on stdout, bench/out/startup.json;
# exit 1 when a target is missed (--help <= 5 ms; run <= 30 ms and faster than
# the peer; run RSS <= 20 MB + the engine's bytes) or the two runs' texts
# differ.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${TURBINE_SHARED:-$ROOT/../shared}
BIN=${TURBINE_BIN:-$ROOT/build/turbine}
OUT=$ROOT/bench/out/startup
REPS=20 THREADS=2 QUIET_WAIT=120
while [ $# -gt 0 ]; do
  case $1 in
    --reps) REPS=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --quiet-wait) QUIET_WAIT=$2; shift ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "startup.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for v in "$REPS" "$THREADS" "$QUIET_WAIT"; do
  case $v in ''|*[!0-9]*) echo "startup.sh: option values must be whole numbers" >&2; exit 2 ;; esac
done
[ "$REPS" -ge 3 ] && [ "$REPS" -le 1000 ] || { echo "startup.sh: --reps must be 3..1000" >&2; exit 2; }
[ -x "$BIN" ] || { echo "startup.sh: no $BIN (build first, or set TURBINE_BIN)" >&2; exit 1; }
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "startup.sh: no $M/stories260K.bin (set TURBINE_SHARED)" >&2; exit 1; }
mkdir -p "$OUT"

# the engine and the peer, as tests/test_stories260k.sh and bench/run_cpu.sh build them
"$BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$OUT/s.engine" > "$OUT/build.log" 2>&1 \
  || { cat "$OUT/build.log" >&2; exit 1; }
PEER=$OUT/llama2c_peer
gcc -O3 -march=native -fopenmp "$ROOT/bench/peers/llama2c_peer.c" -o "$PEER" -lm
# The launcher: fork + exec + wait4 from a process of about 1 MB. The peak RSS
# a parent learns from wait4 includes what the child had before its exec, so
# a large parent (Python) would report its own size for every command.
LAUNCH=$OUT/launch
cat > "$OUT/launch.c" <<'C'
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
/* launch OUT_FILE PROGRAM ARGS...: prints "wall_ms peak_rss_kb exit_code" */
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t p = fork();
    if (p == 0) {
        int o = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644), n = open("/dev/null", O_WRONLY);
        if (o < 0 || n < 0) _exit(126);
        dup2(o, 1);
        dup2(n, 2);
        execv(argv[2], argv + 2);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    if (p < 0 || wait4(p, &st, 0, &ru) < 0) return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f %ld %d\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6, ru.ru_maxrss,
           WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return 0;
}
C
gcc -O2 "$OUT/launch.c" -o "$LAUNCH"

PROMPT="Once upon a time"
exec /usr/bin/python3 - "$BIN" "$PEER" "$OUT" "$M" "$REPS" "$THREADS" "$PROMPT" "$LAUNCH" "$QUIET_WAIT" <<'PY'
import json, os, platform, statistics, subprocess, sys, time

BIN, PEER, OUT, M, REPS, THREADS, PROMPT, LAUNCH, QUIET_WAIT = sys.argv[1:10]
REPS, THREADS, QUIET_WAIT = int(REPS), int(THREADS), float(QUIET_WAIT)
engine = os.path.join(OUT, "s.engine")
def run_cmd(threads):
    return [BIN, "run", engine, "-n", "256", "--temperature", "0", "-p", PROMPT, "--threads", str(threads)]
def peer_cmd(threads):
    return [PEER, os.path.join(M, "stories260K.bin"), "-z", os.path.join(M, "tok512.bin"), "-p", PROMPT,
            "--steps", "256", "-t", str(threads)]
HELP, RUN, PEERK = "turbine --help", "turbine run (%d threads)" % THREADS, "llama2.c peer (%d threads)" % THREADS
cmds = {"/bin/true (process start floor)": ["/bin/true"], HELP: [BIN, "--help"], RUN: run_cmd(THREADS),
        PEERK: peer_cmd(THREADS)}
BASE = os.environ.get("TURBINE_BASELINE_BIN")
if BASE:
    cmds["baseline --help"] = [BASE, "--help"]
    cmds["baseline run (%d threads)" % THREADS] = [BASE] + run_cmd(THREADS)[1:]
if THREADS != 1:
    cmds["turbine run (1 thread)"] = run_cmd(1)
    cmds["llama2.c peer (1 thread)"] = peer_cmd(1)
os.environ["OMP_NUM_THREADS"] = str(THREADS)

def once(argv, out_path=None):
    """Wall time (ms) and peak RSS (KB) of one whole process (the launcher)."""
    r = subprocess.run([LAUNCH, out_path or os.devnull] + argv, capture_output=True, text=True, check=True)
    ms, kb, code = r.stdout.split()
    if int(code) != 0:
        sys.exit("startup.sh: %s exited with %s" % (" ".join(argv), code))
    return float(ms), int(kb)

# the two runs must produce the same text (the same work)
once(cmds[RUN], os.path.join(OUT, "turbine.txt"))
once(cmds[PEERK], os.path.join(OUT, "peer.txt"))
same = open(os.path.join(OUT, "turbine.txt"), "rb").read() == open(os.path.join(OUT, "peer.txt"), "rb").read()

def busy(dt=0.3):
    """Fraction of all CPUs busy over dt seconds (this script sleeps meanwhile)."""
    def snap():
        f = open("/proc/stat").readline().split()[1:]
        v = [int(x) for x in f]
        return sum(v), v[3] + v[4]
    t0, i0 = snap(); time.sleep(dt); t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)

load0 = os.getloadavg()[0]
res = {k: ([], []) for k in cmds}
quiet_rounds, waited = [], 0.0
for _ in range(REPS):
    b = busy()
    while b > 0.10 and waited < QUIET_WAIT:
        time.sleep(0.5); waited += 0.8
        b = busy()
    quiet_rounds.append(b <= 0.10)
    for k, argv in cmds.items():
        ms, kb = once(argv)
        res[k][0].append(ms)
        res[k][1].append(kb)
load1 = os.getloadavg()[0]

n_quiet = sum(quiet_rounds)
use = [i for i in range(REPS) if quiet_rounds[i]] if n_quiet >= 3 else list(range(REPS))
med = {k: (statistics.median([v[0][i] for i in use]), min(v[0][i] for i in use), statistics.median(v[1]))
       for k, v in res.items()}
eng_mb = os.path.getsize(engine) / 2**20
help_ms, run_ms = med[HELP][0], med[RUN][0]
peer_ms = min(v[0] for k, v in med.items() if k.startswith("llama2.c"))  # the peer's faster setting
run_rss_mb = med[RUN][2] / 1024
targets = [
    ("turbine --help <= 5 ms", help_ms <= 5.0, "%.2f ms" % help_ms),
    ("turbine run <= 30 ms", run_ms <= 30.0, "%.1f ms" % run_ms),
    ("turbine run faster than the peer (its faster thread count)", run_ms < peer_ms,
     "%.1f ms vs %.1f ms" % (run_ms, peer_ms)),
    ("run RSS <= 20 MB + engine (%.2f MB)" % eng_mb, run_rss_mb <= 20 + eng_mb, "%.1f MB" % run_rss_mb),
    ("same text from both runs", same, "yes" if same else "no"),
]
libs = subprocess.run(["ldd", BIN], capture_output=True, text=True).stdout.count("=>")
info = dict(baseline=BASE, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), host=platform.node(),
            cpu=next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
            cores=os.cpu_count(), reps=REPS, quiet_rounds=n_quiet, medians_over=len(use), threads=THREADS, loadavg_before=load0, loadavg_after=load1,
            binary=BIN, linked_libraries=libs, engine_bytes=os.path.getsize(engine),
            median_ms={k: v[0] for k, v in med.items()}, min_ms={k: v[1] for k, v in med.items()},
            median_rss_kb={k: v[2] for k, v in med.items()},
            targets={name: dict(ok=okk, value=val) for name, okk, val in targets})
json.dump(info, open(os.path.join(OUT, "..", "startup.json"), "w"), indent=1)

print("%s, %s (%d cores), %d starts each (%d of %d rounds quiet, medians over %d), load average %.1f -> %.1f; "
      "turbine links %d libraries%s\n"
      % (info["date"], info["cpu"], info["cores"], REPS, n_quiet, REPS, len(use), load0, load1, libs,
         "; baseline " + BASE if BASE else ""))
print("| command | median ms | min ms | median peak RSS MB |")
print("|---|---|---|---|")
for k, (m, mn, kb) in med.items():
    print("| %s | %.2f | %.2f | %.1f |" % (k, m, mn, kb / 1024))
print()
for name, okk, val in targets:
    print("- %s: %s (%s)" % (name, "ok" if okk else "MISSED", val))
sys.exit(0 if all(t[1] for t in targets) else 1)
PY

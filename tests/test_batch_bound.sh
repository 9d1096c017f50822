#!/usr/bin/env bash
# bench/batch_bound.py: the queue simulation against the M/D/1 waiting-time
# distribution (Erlang's formula, computed here independently), the batching
# limit from given call times, and the command line's JSON.
set -euo pipefail
: "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
D=$(mktemp -d "$TURBINE_TMP/batch_bound.XXXXXX")
trap 'rm -rf "$D"' EXIT
/usr/bin/python3 - "$TURBINE_SRC/bench/batch_bound.py" "$D" <<'PY'
import importlib.util, json, math, subprocess, sys
spec = importlib.util.spec_from_file_location("batch_bound", sys.argv[1])
bb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bb)

def md1_wait_cdf(t, rho):
    # P(W <= t) for M/D/1 with service time 1 and arrival rate rho (Erlang)
    s = 0.0
    for k in range(int(math.floor(t)) + 1):
        x = rho * (k - t)
        s += x ** k / math.factorial(k) * math.exp(-x)
    return (1 - rho) * s

def md1_p99_sojourn(rho):
    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if md1_wait_cdf(mid, rho) >= 0.99: hi = mid
        else: lo = mid
    return hi + 1.0

fails = 0
for rho in (0.3, 0.5, 0.7):
    want = md1_p99_sojourn(rho)
    p50, p99 = bb.simulate(rho, [1.0], 1, 0.0, 400000, 7)
    ok = abs(p99 - want) / want < 0.04
    print(f"M/D/1 rho {rho}: simulated P99 sojourn {p99:.3f}, Erlang {want:.3f}: {'ok' if ok else 'FAIL'}")
    fails += not ok

# a batcher whose calls cost the same at any size: at a load that fills no
# batch, every request waits at most one call ahead of its own
p50, p99 = bb.simulate(0.2, [1.0] * 8, 8, 0.0, 100000, 3)
ok = 1.0 <= p50 and p99 <= 2.0 + 1e-9
print(f"free batches: p50 {p50:.3f} p99 {p99:.3f} within [1, 2]: {'ok' if ok else 'FAIL'}")
fails += not ok
# the delay: a lone request at a very light load waits the whole delay
p50, p99 = bb.simulate(1e-4, [1.0] * 4, 4, 0.5, 2000, 5)
ok = abs(p50 - 1.5) < 1e-9
print(f"light load with a 0.5 delay: p50 {p50:.3f} (1.5 expected): {'ok' if ok else 'FAIL'}")
fails += not ok

out = sys.argv[2] + "/b.json"
r = subprocess.run([sys.executable, sys.argv[1], "--times", "10,12,14,16", "--delay-us", "0", "--json", out],
                   capture_output=True, text=True)
j = json.load(open(out)) if r.returncode == 0 else {}
ok = r.returncode == 0 and abs(j["batching_limit"] - 2.5) < 1e-9 and j["best_batch"] == 4 \
    and abs(j["saturation_rps"] - 250.0) < 1e-6 and j["fifo_p99_over_unloaded"] is None \
    and j["batcher_p99_over_unloaded"] > 1.0
print(f"--times 10,12,14,16: limit {j.get('batching_limit')}, best batch {j.get('best_batch')}, "
      f"saturation {j.get('saturation_rps')}: {'ok' if ok else 'FAIL'}\n{r.stdout}{r.stderr}")
fails += not ok
sys.exit(1 if fails else 0)
PY

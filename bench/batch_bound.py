#!/usr/bin/env python3
"""batch_bound.py — what batching and a half-load P99 can reach on a machine,
from the engine's own compute times, for reading bench/serve_batching.sh.

A dynamic batcher gains only what the engine gains per request from larger
batches, and at a given load the queueing of a single server sets a floor
under the tail latency whatever the server's overhead. This script measures
the engine's compute time per call c(k) for batch sizes k = 1..B (`turbine
bench --engine E --shapes NAME:kx...` on the engine's first input, or times
given with --times), then

  * the batching limit: the most requests/s any server can get out of the
    engine with batches of at most B, over what batch-1 calls give:
    max_k k / c(k) against 1 / c(1);
  * the half-load P99 floor: a simulation of Poisson arrivals at half the
    batched saturation rate (the load serve_batching.sh applies) into one
    engine instance, for two policies: FIFO one request at a time (M/D/1,
    the best tail for equal jobs on one server without batching) and the
    batcher as turbine runs it (whatever is queued, up to B, goes in one call;
    with --delay-us, a lone request waits that long for company); each P99
    is given as a multiple of an unloaded request (c(1), plus the delay for
    the batcher, as serve_batching.sh's "unloaded" reads it).

Deterministic service times make this a lower bound for a real server, whose
calls vary. Needs only the Python standard library (and turbine for the
timing).

  python3 bench/batch_bound.py --engine r18.engine --threads 2 [--max-batch 8]
      [--delay-us 2000] [--iterations 20] [--device cpu] [--turbine build/turbine]
  python3 bench/batch_bound.py --times 13.8,20.1,...  # ms for k = 1, 2, ...
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile


def engine_input(turbine, engine):
    """(name, dims after the batch dim) of the engine's first input, from
    the first profile `turbine inspect` lists ("inputs": "NAME:MIN/OPT/MAX")."""
    out = subprocess.run([turbine, "inspect", engine], capture_output=True, text=True)
    m = re.search(r'"inputs": "([^":,]+):([0-9x]+)/', out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"batch_bound.py: no input profile in `turbine inspect {engine}`:\n{out.stdout}{out.stderr}")
    return m.group(1), m.group(2).split("x")[1:]


def time_batches(turbine, engine, threads, max_batch, iters, device):
    name, dims = engine_input(turbine, engine)
    times = []
    for k in range(1, max_batch + 1):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        shape = "x".join([str(k)] + dims)
        cmd = [turbine, "bench", "--engine", engine, "--shapes", f"{name}:{shape}", "--threads", str(threads),
               "--device", device, "--warmup", "3", "--iterations", str(iters), "--json", path]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"batch_bound.py: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
        with open(path) as f:
            j = json.load(f)
        os.unlink(path)
        med = j.get("latency_median_ms")
        if med is None:
            sys.exit(f"batch_bound.py: no median latency in {cmd}'s JSON: {sorted(j)}")
        times.append(float(med))
        print(f"  batch {k}: {med:.3f} ms a call, {med / k:.3f} ms a request", file=sys.stderr)
    return times


def simulate(lam, times, max_batch, delay, n, seed):
    """Sojourn times of n Poisson(lam) arrivals into one server that runs
    up to max_batch queued requests a call (max_batch 1: FIFO), a call of k
    taking times[k-1]; a call that would start with fewer than max_batch
    waits until `delay` after its first request arrived (or until full)."""
    rnd = random.Random(seed)
    arr, t = [], 0.0
    for _ in range(n):
        t += rnd.expovariate(lam)
        arr.append(t)
    soj, i, free = [], 0, 0.0
    while i < n:
        start = max(free, arr[i])
        j = i
        while j < n and j - i < max_batch and arr[j] <= start:
            j += 1
        if j - i < max_batch and delay > 0:
            until = arr[i] + delay
            if until > start:
                while j < n and j - i < max_batch and arr[j] <= until:
                    j += 1
                start = arr[j - 1] if j - i == max_batch and arr[j - 1] > start else max(start, until)
        end = start + times[j - i - 1]
        soj.extend(end - arr[q] for q in range(i, j))
        free, i = end, j
    soj.sort()
    return soj[len(soj) // 2], soj[int(0.99 * len(soj))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine")
    ap.add_argument("--turbine", default="build/turbine")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--delay-us", type=float, default=2000.0)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--times", help="ms per call for batch 1, 2, ... (instead of timing --engine)")
    ap.add_argument("--load", type=float, default=0.5, help="share of the batched saturation rate (0.5)")
    ap.add_argument("--requests", type=int, default=200000, help="simulated arrivals (200000)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.times:
        times = [float(x) for x in a.times.split(",")]
    elif a.engine:
        times = time_batches(a.turbine, a.engine, a.threads, a.max_batch, a.iterations, a.device)
    else:
        ap.error("give --engine or --times")
    B = len(times)
    per = [times[k] / (k + 1) for k in range(B)]
    best_k = min(range(B), key=lambda k: per[k])
    gain = per[0] / per[best_k]
    sat = (best_k + 1) / times[best_k] * 1000.0  # requests/s
    lam = a.load * sat / 1000.0  # per ms
    delay = a.delay_us / 1000.0
    fifo_p50, fifo_p99 = simulate(lam, times, 1, 0.0, a.requests, 1)
    bat_p50, bat_p99 = simulate(lam, times, B, delay, a.requests, 1)
    unloaded_fifo = times[0]
    unloaded_bat = times[0] + delay
    res = {
        "times_ms": times, "batching_limit": gain, "best_batch": best_k + 1,
        "saturation_rps": sat, "load_rps": lam * 1000.0,
        "fifo_p99_ms": fifo_p99, "fifo_p99_over_unloaded": fifo_p99 / unloaded_fifo,
        "batcher_p99_ms": bat_p99, "batcher_p99_over_unloaded": bat_p99 / unloaded_bat,
        "batcher_p50_ms": bat_p50, "delay_ms": delay,
    }
    print(f"engine calls (ms): " + ", ".join(f"{t:.2f}" for t in times))
    print(f"batching limit: {gain:.2f}x the requests/s of batch-1 calls (best per request at batch {best_k + 1}); "
          f"saturation {sat:.1f} req/s")
    print(f"at {a.load:.0%} of it ({lam * 1000:.1f} req/s, Poisson), the P99 a server cannot beat:")
    if lam * times[0] >= 1.0:
        res["fifo_p99_ms"] = res["fifo_p99_over_unloaded"] = None
        print(f"  FIFO, one request a call: none (the load is {lam * times[0]:.2f}x what batch-1 calls serve)")
    else:
        print(f"  FIFO, one request a call: {fifo_p99:.2f} ms = {fifo_p99 / unloaded_fifo:.2f}x an unloaded request "
              f"({unloaded_fifo:.2f} ms)")
    print(f"  the batcher ({B} rows, {a.delay_us:.0f} us): {bat_p99:.2f} ms = {bat_p99 / unloaded_bat:.2f}x an "
          f"unloaded request ({unloaded_bat:.2f} ms)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

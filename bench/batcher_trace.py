#!/usr/bin/python3
"""batcher_trace.py — reads the dynamic batcher's trace (a `turbine serve`
run with TURBINE_BATCHER_TRACE=PREFIX in its environment writes one file per
model instance group, PREFIX.<pid>.<n>) and says where a
request's time went:

    /usr/bin/python3 bench/batcher_trace.py FILE [--from S] [--to S] [--last S]

Each line of FILE is one engine call: start, end, instance, requests, rows,
worker|caller, then the enqueue time of each request (seconds since the
batcher was made). Printed: calls and mean rows; each request's queue time
(enqueue to the start of its call) mean / p50 / p99 / max; call time mean /
p50 / p99 / max; the instances' busy share; the arrivals (enqueue times) as a
rate, the largest count in any 1 ms and 10 ms window against what a Poisson
stream of the same rate gives at its 99.99th percentile, and the longest
gap between arrivals — bursts there come from the client, not the batcher;
and the longest stretch in which requests waited while an instance was
idle (the batcher's own dispatch delay beyond its max_queue_delay).
--from / --to keep the calls that start in that window (seconds); --last S
the calls of the trace's last S seconds.
"""
import argparse
import math
import sys


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def poisson_q(lam, q):
    """The smallest k with P(X <= k) >= q for X ~ Poisson(lam)."""
    k, p, c = 0, math.exp(-lam), 0.0
    if p == 0.0:  # large lam: normal approximation
        return int(lam + 3.72 * math.sqrt(lam) + 1)
    while True:
        c += p
        if c >= q:
            return k
        k += 1
        p *= lam / k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--from", dest="t_from", type=float, default=None)
    ap.add_argument("--to", dest="t_to", type=float, default=None)
    ap.add_argument("--last", type=float, default=None)
    a = ap.parse_args()
    calls = []
    with open(a.trace) as f:
        for ln, line in enumerate(f, 1):
            p = line.split()
            if len(p) < 6:
                sys.exit(f"{a.trace}:{ln}: not a trace line")
            t0, t1, inst, n, rows = float(p[0]), float(p[1]), int(p[2]), int(p[3]), int(p[4])
            enq = [float(x) for x in p[6:6 + n]]
            if a.t_from is not None and t0 < a.t_from:
                continue
            if a.t_to is not None and t0 > a.t_to:
                continue
            calls.append((t0, t1, inst, n, rows, p[5], enq))
    calls.sort()
    if a.last is not None and calls:
        end = max(c[1] for c in calls)
        calls = [c for c in calls if c[0] >= end - a.last]
    if not calls:
        sys.exit("no calls in the trace (or the window)")
    waits = [c[0] - e for c in calls for e in c[6]]
    comp = [c[1] - c[0] for c in calls]
    arr = sorted(e for c in calls for e in c[6])
    span = max(c[1] for c in calls) - calls[0][0]
    insts = sorted({c[2] for c in calls})
    busy = sum(comp) / (span * len(insts)) if span > 0 else float("nan")
    ms = 1e3
    print(f"calls {len(calls)} ({sum(1 for c in calls if c[5] == 'caller')} on callers), requests {len(arr)}, "
          f"mean rows {sum(c[4] for c in calls) / len(calls):.2f}, span {span:.3f} s, instances {len(insts)}, "
          f"busy {100 * busy:.1f}%")
    print(f"queue ms  mean {ms * sum(waits) / len(waits):.3f}  p50 {ms * pct(waits, .5):.3f}  "
          f"p99 {ms * pct(waits, .99):.3f}  max {ms * max(waits):.3f}")
    print(f"call ms   mean {ms * sum(comp) / len(comp):.3f}  p50 {ms * pct(comp, .5):.3f}  "
          f"p99 {ms * pct(comp, .99):.3f}  max {ms * max(comp):.3f}")
    rate = (len(arr) - 1) / (arr[-1] - arr[0]) if len(arr) > 1 and arr[-1] > arr[0] else float("nan")
    gaps = [b - a_ for a_, b in zip(arr, arr[1:])]
    out = [f"arrivals {rate:.1f}/s, longest gap {ms * max(gaps) if gaps else 0:.3f} ms"]
    for w in (1e-3, 1e-2):
        j, most = 0, 0
        for i in range(len(arr)):
            while arr[i] - arr[j] > w:
                j += 1
            most = max(most, i - j + 1)
        out.append(f"most in {w * ms:g} ms: {most} (Poisson 99.99%: {poisson_q(rate * w, 0.9999) if rate == rate else '-'})")
    print(", ".join(out))
    # idle with work waiting: between an instance's end and its next start,
    # a request was already queued
    by = {}
    for c in calls:
        by.setdefault(c[2], []).append(c)
    worst = 0.0
    for cs in by.values():
        for prev, nxt in zip(cs, cs[1:]):
            first = min(nxt[6]) if nxt[6] else nxt[0]
            idle_from = max(prev[1], first)
            worst = max(worst, nxt[0] - idle_from)
    print(f"longest wait of a queued request for an idle instance: {ms * worst:.3f} ms "
          f"(includes max_queue_delay for a batch still filling)")


if __name__ == "__main__":
    main()

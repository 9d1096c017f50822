#!/usr/bin/env python3
"""nginx_ttft.py — what nginx adds to a streamed request's time to first token, measured
from one keep-alive connection per side (Python's http.client, so the client's own
connection handling is the same both ways): per round, the median over N streamed
completions of the time to the response head and to the first `data:` event, and of a
plain request's whole time, straight at a replica and through nginx, alternating.

    bench/nginx_ttft.py NGINX_PORT REPLICA_PORT [--rounds R] [-n N] [--session ID]

Start the pair with scripts/cluster.sh (one replica, so that nginx can only send there);
the X-Session-ID header goes on every request either way.
"""
import argparse
import http.client
import json
import statistics
import time


def run(port, n, session, stream):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"prompt": "to be or not", "max_tokens": 4, "stream": stream, "temperature": 0})
    head, first = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "X-Session-ID": session})
        r = c.getresponse()
        t1 = time.perf_counter()
        if r.status != 200:
            raise SystemExit("status %d from port %d" % (r.status, port))
        t2 = None
        if stream:
            line = r.readline()
            while line and not line.startswith(b"data:"):
                line = r.readline()
            t2 = time.perf_counter()
        r.read()
        head.append(t1 - t0)
        first.append((t2 if stream else time.perf_counter()) - t0)
    c.close()
    return statistics.median(head) * 1e3, statistics.median(first) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nginx_port", type=int)
    ap.add_argument("replica_port", type=int)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--session", default="ttft")
    a = ap.parse_args()
    added = []
    for rnd in range(1, a.rounds + 1):
        res = {}
        for name, port in (("direct", a.replica_port), ("nginx", a.nginx_port)):
            _, ttft = run(port, a.n, a.session, True)
            _, e2e = run(port, a.n, a.session, False)
            res[name] = (ttft, e2e)
        d = res["nginx"][0] - res["direct"][0]
        added.append(d)
        print("round %d: TTFT p50 direct %.3f ms, nginx %.3f ms (added %+.3f); plain E2E p50 direct %.3f, nginx %.3f ms"
              % (rnd, res["direct"][0], res["nginx"][0], d, res["direct"][1], res["nginx"][1]))
    print("median added TTFT: %+.3f ms over %d rounds" % (statistics.median(added), a.rounds))


if __name__ == "__main__":
    main()

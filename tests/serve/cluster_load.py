"""cluster_load.py — closed-loop load through nginx (scripts/cluster.sh) for the cluster
test and bench/cluster.sh: THREADS clients, each request on a new connection; even
clients stream, odd ones alternate (every third request a stream, else 24 tokens plain).
Stops at DURATION seconds, after MAX requests, or when STOP_FILE appears, whichever is
first. Prints one JSON line per request: stream, status, upstream, start, end, ok, why
(and events, the token events of a stream).

    cluster_load.py PORT --threads N --duration S [--max-requests N] [--stop-file F]
                    [--stream-tokens T] [--timeout S]
"""
import argparse
import http.client
import json
import os
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("--threads", type=int, default=4)
ap.add_argument("--duration", type=float, required=True)
ap.add_argument("--max-requests", type=int, default=1 << 30)
ap.add_argument("--stop-file", default="")
ap.add_argument("--stream-tokens", type=int, default=300)
ap.add_argument("--timeout", type=float, default=120)
a = ap.parse_args()
t_end = time.time() + a.duration
lock = threading.Lock()
count = [0]
out = []


def one(stream, i):
    body = {"prompt": "ROMEO: %d" % i, "max_tokens": a.stream_tokens if stream else 24, "ignore_eos": True,
            "stream": stream}
    rec = {"stream": stream, "status": None, "upstream": "", "start": time.time(), "ok": False, "why": ""}
    try:
        c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=a.timeout)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        rec["status"] = r.status
        rec["upstream"] = r.getheader("X-Turbine-Upstream", "")
        data = r.read().decode(errors="replace")
        c.close()
        if r.status != 200:
            rec["why"] = "status %d: %s" % (r.status, data[:200])
        elif stream:
            ev = [ln[6:] for ln in data.split("\n") if ln.startswith("data: ")]
            rec["events"] = sum(1 for e in ev[:-1] if json.loads(e).get("choices"))
            rec["ok"] = bool(ev) and ev[-1] == "[DONE]"
            rec["why"] = "" if rec["ok"] else "stream cut after %d events: %r" % (len(ev), data[-120:])
        else:
            rec["ok"] = len(json.loads(data)["choices"]) == 1
    except Exception as e:  # noqa: BLE001 - recorded per request
        rec["why"] = type(e).__name__ + ": " + str(e)[:120]
    rec["end"] = time.time()
    return rec


def worker(k):
    while time.time() < t_end and not (a.stop_file and os.path.exists(a.stop_file)):
        with lock:
            if count[0] >= a.max_requests:
                return
            count[0] += 1
            i = count[0]
        rec = one(k % 2 == 0 or i % 3 == 0, i)
        with lock:
            out.append(rec)


ts = [threading.Thread(target=worker, args=(k,)) for k in range(a.threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
for r in out:
    print(json.dumps(r))

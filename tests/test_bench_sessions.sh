#!/usr/bin/env bash
# `turbine bench --sessions` (multi-turn chat) and `--replica-metrics`, on loopback:
# 1. against a small recording server: every request of a conversation carries
#    its id in the session header (the default X-Session-ID and one given with
#    --session-header), one id per conversation, the shared system prompt, and
#    the conversation so far: turn t resends exactly the replies the server
#    gave to turns 1..t-1; a conversation's turns never overlap;
# 2. against two `turbine serve` replicas of the demo model: the requests each
#    replica served, as the report gives them, equal the deltas of the
#    replicas' own /metrics; the shares add up; prompts grow turn by turn
#    (the server's prompt token counts); without a system prompt one-turn
#    conversations reuse nothing of the prefix cache while three-turn ones do
#    (the hits come from turns >= 2), and the report's rate is the servers';
# 3. bad option values: a clear message and exit status 2.
# Every run is bounded in requests and time; the servers die with this script.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
exec /usr/bin/python3 - "$@" <<'PY'
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.environ["TURBINE_SRC"], "tests", "serve"))
import serve_util as su  # noqa: E402

DEMO = os.path.join(su.SRC, "models", "demo", "shakespeare")
SEEN = []
LOCK = threading.Lock()


class Recorder(BaseHTTPRequestHandler):
    """An OpenAI-style chat server that keeps each request's headers and
    messages and answers with a streamed reply naming the request."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "rec", "max_model_len": 100000}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":  # /tokenize: not offered
            self._send(404, b"{}")
            return
        t0 = time.monotonic()
        with LOCK:
            k = len(SEEN)
            rec = {"headers": {h.lower(): v for h, v in self.headers.items()}, "messages": body["messages"],
                   "reply": "answer %d of the recorder" % k, "start": t0}
            SEEN.append(rec)
        time.sleep(0.02)
        words = rec["reply"].split(" ")
        chunks = []
        for i, w in enumerate(words):
            txt = w if i == 0 else " " + w
            chunks.append({"choices": [{"index": 0, "delta": {"content": txt}}]})
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": len(words)}})
        out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        rec["end"] = time.monotonic()
        self._send(200, out, "text/event-stream")


def bench(url, *args, timeout=120):
    cmd = [su.BIN, "bench", url, "--no-progress", "--no-gpu"] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check_recorded(header, n_conv, turns):
    su.check(len(SEEN) == n_conv * turns, "the recorder got %d requests, not %d" % (len(SEEN), n_conv * turns))
    by_id = {}
    system = None
    for rec in SEEN:
        sid = rec["headers"].get(header.lower())
        su.check(sid, "a request without the %s header: %r" % (header, rec["headers"]))
        by_id.setdefault(sid, []).append(rec)
        msgs = rec["messages"]
        su.check(msgs[0]["role"] == "system", "no system message first: %r" % msgs[:1])
        if system is None:
            system = msgs[0]["content"]
        su.check(msgs[0]["content"] == system, "conversations do not share one system prompt")
        su.check(len(system.split()) == 12, "system prompt of %d words, not 12" % len(system.split()))
    su.check(len(by_id) == n_conv, "%d conversation ids for %d conversations" % (len(by_id), n_conv))
    for sid, recs in by_id.items():
        su.check(len(recs) == turns, "conversation %s sent %d turns, not %d" % (sid, len(recs), turns))
        for t, rec in enumerate(recs):
            msgs = rec["messages"][1:]
            su.check(len(msgs) == 2 * t + 1, "turn %d of %s has %d messages" % (t + 1, sid, len(msgs)))
            for k in range(t):
                su.check(msgs[2 * k]["content"] == recs[k]["messages"][1 + 2 * k]["content"],
                         "turn %d of %s changed an earlier user message" % (t + 1, sid))
                su.check(msgs[2 * k + 1] == {"role": "assistant", "content": recs[k]["reply"]},
                         "turn %d of %s does not resend reply %d: %r" % (t + 1, sid, k + 1, msgs[2 * k + 1]))
            su.check(msgs[-1]["role"] == "user", "turn %d does not end with a user message" % (t + 1))
            if t:
                su.check(rec["start"] >= recs[t - 1]["end"], "turns of %s overlapped" % sid)


def metrics(srv):
    st, _, data = srv.get("/metrics")
    su.check(st == 200, "/metrics answered %d" % st)
    m = {"requests": 0.0, "hits": 0.0, "queries": 0.0}
    for line in data.decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        key = {"turbine_http_requests_total": "requests", "turbine_prefix_cache_hits_total": "hits",
               "turbine_prefix_cache_queries_total": "queries"}.get(name)
        if key:
            m[key] += float(line.rsplit(" ", 1)[1])
    return m


def main():
    d = su.workdir("bench_sessions")
    # 1. what goes on the wire
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    rurl = "http://127.0.0.1:%d" % httpd.server_address[1]
    for header, extra in (("X-Session-ID", []), ("X-Conv", ["--session-header", "X-Conv", "--http-client", "curl"])):
        del SEEN[:]
        rc, so, se = bench(rurl, "--endpoint", "chat", "--sessions", 3, "--turns", 3, "-c", 2,
                           "--system-prompt-len", 12, "--input-len", 5, "--output-len", 4, *extra)
        su.check(rc == 0, "bench against the recorder exit %d:\n%s\n%s" % (rc, so, se))
        check_recorded(header, 3, 3)
        su.ok("3 conversations x 3 turns (%s): one %s id each, shared system prompt, every turn resends the "
              "earlier replies, turns in order" % (extra[-1] if extra else "builtin", header))
    httpd.shutdown()

    # 2. two replicas
    engine = os.path.join(d, "demo.engine")
    b = subprocess.run([su.BIN, "build", DEMO, "-o", engine], capture_output=True, text=True, timeout=300)
    su.check(b.returncode == 0, "build of the demo model failed: " + b.stderr[-2000:])
    a = su.Server(engine, "--threads", "1", log=os.path.join(d, "a.log")).start()
    bsrv = su.Server(engine, "--threads", "1", log=os.path.join(d, "b.log")).start()
    urls = ["http://127.0.0.1:%d" % s.port for s in (a, bsrv)]
    rm = "%s/metrics,%s" % (urls[0], urls[1])  # the second bare: /metrics is implied

    def run(target, name, *args):
        before = [metrics(a), metrics(bsrv)]
        out = os.path.join(d, name + ".json")
        rc, so, se = bench(urls[target], "--endpoint", "chat", "-c", 2, "--replica-metrics", rm, "--json", out,
                           "--input-len", 16, "--output-len", 8, *args)
        su.check(rc == 0, "%s: exit %d:\n%s\n%s" % (name, rc, so, se))
        after = [metrics(a), metrics(bsrv)]
        p = json.load(open(out))["points"][0]
        reps = p["replicas"]
        su.check(len(reps) == 2 and all(r["scraped"] for r in reps), "%s: replicas %r" % (name, reps))
        for i in range(2):
            got = reps[i]["requests"]
            want = after[i]["requests"] - before[i]["requests"]
            su.check(got == want, "%s: replica %d served %s by the report, %s by its /metrics" % (name, i, got, want))
            dq = after[i]["queries"] - before[i]["queries"]
            dh = after[i]["hits"] - before[i]["hits"]
            if dq > 0:
                su.check(abs(reps[i]["prefix_cache_hit_rate"] - dh / dq) < 1e-9,
                         "%s: replica %d hit rate %r, /metrics %r" % (name, i, reps[i]["prefix_cache_hit_rate"], dh / dq))
        su.check(reps[target]["requests"] == p["requests_ok"] and reps[1 - target]["requests"] == 0,
                 "%s: %r for %d requests to replica %d" % (name, reps, p["requests_ok"], target))
        su.check(reps[target]["share"] == 1.0 and reps[1 - target]["share"] == 0.0, "%s: shares %r" % (name, reps))
        su.check(p["replicas_total"]["requests"] == p["requests_ok"], "%s: total %r" % (name, p["replicas_total"]))
        su.check("replicas (their /metrics" in so and urls[0] + "/metrics" in so, "%s: no replica table:\n%s" % (name, so))
        return p, reps

    p, reps = run(0, "a", "--sessions", 4, "--turns", 3)
    bt = p["sessions"]["by_turn"]
    su.check([t["requests_ok"] for t in bt] == [4, 4, 4], "by turn: %r" % bt)
    grow = [t["prompt_tokens_mean"] for t in bt]
    su.check(grow[0] + 8 < grow[1] and grow[1] + 8 < grow[2], "prompts do not grow by the replies: %r" % grow)
    su.check(all(t["ttft_p50_ms"] is not None for t in bt), "no TTFT by turn: %r" % bt)
    su.check(reps[0]["prefix_cache_hit_rate"] > 0, "no prefix-cache reuse on replica 0: %r" % reps)
    su.ok("replica 0: %d requests as its /metrics says, prompt tokens by turn %s, hit rate %.1f%%"
          % (reps[0]["requests"], ["%.0f" % g for g in grow], 100 * reps[0]["prefix_cache_hit_rate"]))

    p1, r1 = run(1, "b1", "--sessions", 4, "--turns", 1, "--system-prompt-len", 0)
    p3, r3 = run(1, "b3", "--sessions", 4, "--turns", 3, "--system-prompt-len", 0)
    su.check(r1[1]["prefix_cache_hit_rate"] == 0, "one-turn conversations reused the cache: %r" % r1)
    su.check(r3[1]["prefix_cache_hit_rate"] > 0, "turns >= 2 did not reuse the cache: %r" % r3)
    su.check(abs(p3["server_prefix_cache_hit_rate"] - r3[1]["prefix_cache_hit_rate"]) < 1e-9,
             "target and replica rates differ: %r %r" % (p3["server_prefix_cache_hit_rate"], r3))
    su.ok("replica 1: no reuse with one turn, %.1f%% with three (from turns >= 2)"
          % (100 * r3[1]["prefix_cache_hit_rate"]))

    # 3. bad values
    for args, want in ((["--sessions", "0"], "bad --sessions"),
                       (["--sessions", "2"], "--endpoint chat"),
                       (["--endpoint", "chat", "--sessions", "2", "--rate", "5"], "--rate does not apply"),
                       (["--endpoint", "chat", "--sessions", "2", "-n", "4"], "-n does not apply"),
                       (["--endpoint", "chat", "--turns", "3"], "need --sessions"),
                       (["--endpoint", "chat", "--sessions", "2", "--turns", "x"], "bad --turns"),
                       (["--endpoint", "chat", "--sessions", "2", "--session-header", "a: b"], "bad --session-header"),
                       (["--replica-metrics", "ftp://h/metrics"], "bad --replica-metrics"),
                       (["--replica-metrics", ","], "at least one URL")):
        rc, so, se = bench(urls[0], *args)
        su.check(rc == 2 and want in se, "%r: exit %d, stderr %r" % (args, rc, se))
    su.check(a.alive() and bsrv.alive(), "a replica died")
    su.ok("bad --sessions/--turns/--session-header/--replica-metrics values: exit 2 with a message")


try:
    main()
except su.TestFailure as e:
    print("FAIL: %s" % e, flush=True)
    sys.exit(1)
PY

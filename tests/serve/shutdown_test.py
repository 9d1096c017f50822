"""Graceful shutdown: on SIGTERM the server stops taking connections (refused
or 503), finishes every accepted request (streams end with finish_reason
"length" and [DONE]) and exits 0 within --grace. Run by tests/test_serve_shutdown.sh."""
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_slow, build_stories, check, metric, ok, run_tests, wait_until, workdir  # noqa: E402

GRACE = 60
N_TOKENS = 200


def probe(port):
    """What a new client sees: 'refused', 503, or a failure description."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return "connect error %r" % e
    try:
        s.settimeout(3)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 36\r\n\r\n{\"prompt\": \"Once\", \"max_tokens\": 5}")
        got = b""
        while b"\r\n\r\n" not in got:
            b = s.recv(4096)
            if not b:
                return "connection accepted, then closed without a reply"
            got += b
        status = int(got.split(b" ", 2)[1])
        return status if status == 503 else "status %d" % status
    except socket.timeout:
        return "connection accepted but no reply within 3 s"
    except ConnectionResetError:
        return "connection accepted, then reset"
    finally:
        s.close()


def t_sigterm_drain():
    d = workdir("shutdown")
    srv = Server(build_slow(d), "--max-num-seqs", "1", "--threads", "1", "--grace", GRACE).start()
    streams = 3  # one runs, two wait: all three were accepted and must complete
    results, errors = {}, []
    started = [threading.Event() for _ in range(streams)]

    def go(i):
        import http.client
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=GRACE + 30)
            c.request("POST", "/v1/completions", body=json.dumps({
                "prompt": "Once upon a time", "max_tokens": N_TOKENS, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            started[i].set()
            results[i] = (r.status, r.read().decode())
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append("stream %d: %r" % (i, e))
            started[i].set()

    ts = []
    for i in range(streams):
        ts.append(threading.Thread(target=go, args=(i,)))
        ts[-1].start()
    check(started[0].wait(30), "stream 0 got no response")
    # (a waiting stream's headers come with its first token, so the scheduler's gauges tell when all are in)
    accepted = wait_until(lambda: (lambda m: metric(m, "turbine_requests_running") == 1 and
                                   metric(m, "turbine_requests_waiting") == streams - 1)(srv.metrics()), 10, step=0.01)
    check(not errors, "; ".join(errors))
    ms = srv.metrics()
    check(accepted, "before SIGTERM: running %s waiting %s (want 1 and %d)" % (
        metric(ms, "turbine_requests_running"), metric(ms, "turbine_requests_waiting"), streams - 1))
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    alive_at_probe = srv.alive()
    seen = probe(srv.port)
    check(seen in ("refused", 503), "a new connection after SIGTERM: %s (want refused or 503)" % seen)
    check(alive_at_probe, "the server exited within 0.2 s of SIGTERM with 3 x %d tokens to drain" % N_TOKENS)
    ok("a new connection during the drain: %s" % seen)
    rc = None
    try:
        rc = srv.proc.wait(timeout=GRACE + 5)
    except Exception:  # noqa: BLE001
        pass
    took = time.time() - t0
    check(rc is not None, "the server did not exit within grace %d s + 5" % GRACE)
    check(rc == 0, "the server exited with %s after SIGTERM; log:\n%s" % (rc, srv.log()))
    check(took <= GRACE + 1, "the drain took %.1f s, over the grace of %d s" % (took, GRACE))
    for t in ts:
        t.join(timeout=30)
    check(not errors, "; ".join(errors))
    for i in range(streams):
        check(i in results, "stream %d has no result" % i)
        st, raw = results[i]
        check(st == 200, "stream %d status %s" % (i, st))
        events = [l[6:] for l in raw.split("\n") if l.startswith("data: ")]
        check(events and events[-1] == "[DONE]", "stream %d does not end with [DONE]: %r" % (i, raw[-200:]))
        chunks = [json.loads(e) for e in events[:-1]]
        fins = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        check(fins and fins[-1] == "length", "stream %d: finish %r, want 'length'" % (i, fins[-1:]))
        usage = chunks[-1].get("usage") or {}
        check(usage.get("completion_tokens") == N_TOKENS, "stream %d: usage %r, want %d tokens" % (i, usage, N_TOKENS))
    ok("SIGTERM with 1 running + 2 waiting streams: all %d completed (%d tokens, 'length', [DONE]); exit 0 in %.1f s"
       % (streams, N_TOKENS, took))


def t_sigterm_idle():
    d = workdir("shutdown")
    srv = Server(build_stories(d), "--grace", GRACE, log=os.path.join(d, "idle.log")).start()
    check(srv.completion({"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True})["usage"]["completion_tokens"] == 5, "not serving")
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    rc = None
    try:
        rc = srv.proc.wait(timeout=10)
    except Exception:  # noqa: BLE001
        pass
    check(rc == 0, "an idle server did not exit 0 within 10 s of SIGTERM (rc %s)" % rc)
    ok("an idle server exits 0 %.2f s after SIGTERM" % (time.time() - t0))


def t_sigint_keepalive_idle():
    # an idle keep-alive connection must not hold the exit up to --grace
    d = workdir("shutdown")
    srv = Server(build_stories(d), "--grace", GRACE, log=os.path.join(d, "ka.log")).start()
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    check(r.status == 200, "/health -> %s" % r.status)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGINT)
    rc = None
    try:
        rc = srv.proc.wait(timeout=GRACE + 5)
    except Exception:  # noqa: BLE001
        pass
    c.close()
    check(rc == 0, "SIGINT with an idle keep-alive connection: rc %s" % rc)
    took = time.time() - t0
    check(took < 10, "SIGINT with an idle keep-alive connection took %.1f s to exit" % took)
    ok("SIGINT with an idle keep-alive connection open: exit 0 in %.2f s" % took)


if __name__ == "__main__":
    run_tests([("SIGTERM drains streams", t_sigterm_drain), ("SIGTERM idle", t_sigterm_idle),
               ("SIGINT with keep-alive", t_sigint_keepalive_idle)])

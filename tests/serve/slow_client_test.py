"""Slow and stalled clients: a connection that sends half a request and stalls
holds no engine slot, does not delay other requests, and is dropped after
--timeout. A streaming client that stops reading has its tokens buffered up
to --stream-buffer, then its request is cancelled (logged, counted) while
the rest of the batch goes on. Run by tests/test_serve_slow_client.sh."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_slow, build_stories, check, metric, ok, run_tests, wait_until, workdir  # noqa: E402

TIMEOUT = 2  # --timeout seconds
S = None
R = None  # the slow model, --stream-buffer STREAM_BUFFER
STREAM_BUFFER = 64


def stall(kind):
    s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 50}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    if kind == "body":
        s.sendall(head + body[:len(body) // 2])
    else:  # half the headers
        s.sendall(head[:30])
    return s


def closed_by_server(s, limit_s):
    """Seconds until the server closes s (EOF or reset), or None after limit_s. Any bytes it sends are returned too."""
    t0 = time.time()
    got = b""
    while time.time() - t0 < limit_s:
        s.settimeout(max(0.05, limit_s - (time.time() - t0)))
        try:
            b = s.recv(65536)
        except socket.timeout:
            return None, got
        except (ConnectionResetError, BrokenPipeError):
            return time.time() - t0, got
        if not b:
            return time.time() - t0, got
        got += b
    return None, got


def t_stalled_clients():
    stalled = [stall("body") for _ in range(6)] + [stall("headers") for _ in range(6)]
    t_stall = time.time()
    # while they stall: normal requests are served at once, nothing occupies the engine
    served = 0
    while time.time() - t_stall < TIMEOUT * 0.6 and served < 20:
        t = time.time()
        j = S.completion({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}, timeout=30)
        check(j["choices"][0]["text"].startswith(", there was"), "a request during the stall: %r" % j)
        check(time.time() - t < 1.5, "a request took %.2f s while clients stalled" % (time.time() - t))
        served += 1
        ms = S.metrics()
        for g in ("turbine_requests_running", "turbine_requests_waiting", "turbine_kv_cache_usage_ratio"):
            check(metric(ms, g) == 0, "%s = %s while only stalled clients are connected" % (g, metric(ms, g)))
    check(served >= 2, "only %d requests served while the clients stalled" % served)
    ok("%d normal requests served while 12 clients stall; running/waiting/KV stay 0" % served)
    # each stalled connection is dropped after the timeout, not before
    for i, s in enumerate(stalled):
        left = TIMEOUT + 8 - (time.time() - t_stall)
        dt, got = closed_by_server(s, max(left, 0.1))
        when = time.time() - t_stall
        check(dt is not None, "stalled connection %d still open %.1f s after it stalled (--timeout %d)" % (i, when, TIMEOUT))
        check(when >= TIMEOUT * 0.5, "stalled connection %d dropped after %.2f s, before --timeout %d" % (i, when, TIMEOUT))
        if got:
            check(not got.startswith(b"HTTP/1.1 200"), "a half-sent request was answered 200: %r" % got[:100])
        s.close()
    ok("all 12 stalled connections dropped within %d..%d s" % (TIMEOUT // 2, TIMEOUT + 8))
    ms = S.metrics()
    check(metric(ms, "turbine_requests_finished_total", finished_reason="cancelled") == 0,
          "stalled clients created requests (cancelled > 0)")


def t_slow_sender():
    # a client that sends its body slowly but within the timeout between bytes is served
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
    step = max(1, len(body) // 4)
    for i in range(0, len(body), step):
        time.sleep(TIMEOUT * 0.3)
        s.sendall(body[i:i + step])
    got = b""
    deadline = time.time() + 30
    while time.time() < deadline:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    check(got.startswith(b"HTTP/1.1 200"), "a slow but live sender got %r" % got[:200])
    check(b", there was" in got, "a slow sender's reply lacks the text: %r" % got[-200:])
    ok("a client sending its body over %.1f s (gaps below --timeout) is served" % (TIMEOUT * 0.3 * 4))


def t_non_reading_stream():
    # a client that asks for a long stream (4 choices, 20 log-probabilities a token: some MB) and reads
    # nothing; its receive window is small so that what it does not read stays on the server
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(30)
    stalled.connect(("127.0.0.1", R.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True, "stream": True, "n": 4,
                       "logprobs": 20}).encode()
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body)
    # meanwhile others are served in full: a stream that reads, and a plain request
    st, _, ev = R.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 120, "ignore_eos": True,
                                             "stream": True, "stream_options": {"include_usage": True}})
    check(st == 200 and ev[-1] == "[DONE]", "a reading stream beside the stalled one: %s %r" % (st, ev[-2:]))
    chunks = [json.loads(e) for e in ev[:-1]]
    n_tok = sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None)
    check(n_tok == 120 and chunks[-1]["usage"]["completion_tokens"] == 120,
          "the reading stream got %d token events (want 120)" % n_tok)
    j = R.completion({"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True}, timeout=60)
    check(j["usage"]["completion_tokens"] == 100, "a plain request beside the stalled stream: %r" % j["usage"])
    # the stalled stream's 4 requests are cancelled once each has --stream-buffer tokens unread
    ms = wait_until(lambda: (lambda m: m if metric(m, "turbine_stream_overflows_total") >= 4 else None)(R.metrics()), 90)
    check(ms is not None, "the non-reading stream was not cancelled: overflows %s, log:\n%s"
          % (metric(R.metrics(), "turbine_stream_overflows_total"), R.log()))
    check(metric(ms, "turbine_requests_finished_total", finished_reason="cancelled") >= 4, "not counted as cancelled")
    check(wait_until(lambda: metric(R.metrics(), "turbine_requests_running") == 0, 10),
          "the stalled stream's requests still hold their slots")
    check("left %d generated tokens unread" % STREAM_BUFFER in R.log(), "no logged reason:\n" + R.log())
    # what was sent before the cancellation can still be read; the stream then ends without [DONE]
    got = b""
    try:
        while len(got) < 64 << 20:
            b = stalled.recv(65536)
            if not b:
                break
            got += b
    except (ConnectionResetError, socket.timeout):
        pass
    stalled.close()
    check(got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in got,
          "the cancelled stream: %d bytes ending %r" % (len(got), got[-120:]))
    n_sent = got.count(b"data: {")
    check(0 < n_sent < 4 * 480, "the cancelled stream delivered %d events" % n_sent)
    ok("a stream nobody reads: cancelled after %d unread tokens (logged, counted; %d events had been sent) while "
       "a reading stream and a plain request beside it completed" % (STREAM_BUFFER, n_sent))


def t_still_serving():
    j = S.completion({"prompt": "Once upon a time", "max_tokens": 10, "ignore_eos": True})
    check(j["usage"]["completion_tokens"] == 10, "after the stalls: %r" % j)
    check(S.alive(), "the server died")
    ok("still serving")


def main():
    global S, R
    d = workdir("slow_client")
    S = Server(build_stories(d), "--timeout", TIMEOUT, "--max-num-seqs", "2", "--threads", "1").start()
    R = Server(build_slow(d), "--stream-buffer", STREAM_BUFFER, "--threads", "1", "--timeout", "60",
               log=os.path.join(d, "r.log")).start()
    run_tests([("stalled clients", t_stalled_clients), ("slow sender", t_slow_sender),
               ("non-reading stream", t_non_reading_stream), ("still serving", t_still_serving)])


if __name__ == "__main__":
    main()

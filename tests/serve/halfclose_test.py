"""Half-closed clients: a client that sends its request and then shuts down
its write side (shutdown(SHUT_WR), as `nc -N` and some proxies do) has not
gone away: it still gets its whole reply, streamed or not. A client that
closes its socket is still cancelled (tests/serve/cancel_test.py).
Run by tests/test_serve_halfclose.sh."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_slow, check, http_body, metric, ok, run_tests, sse_events, wait_until, workdir  # noqa: E402

S = None
TOKENS = 60  # about 0.2 s on the slow model: long enough that a cancellation would show
PROMPT = "Once upon a time"


def half_closed_request(path, body, timeout=60):
    """Sends one request, shuts down the write side, reads until the server closes or
    the reply is complete. Returns (status, head bytes, body bytes). Interim 1xx
    responses, which an HTTP/1.1 client must accept before the final one, are skipped."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", S.port), timeout=timeout)
    try:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            got += b
            if body.get("stream") and b"data: [DONE]" in got and got.endswith(b"0\r\n\r\n"):
                break
    finally:
        s.close()
    while got.startswith(b"HTTP/1.1 1"):  # interim responses
        _, _, got = got.partition(b"\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 "), "no final response (got %r)" % got[:200])
    status = int(got[9:12])
    head = got.partition(b"\r\n\r\n")[0]
    body = http_body(got)
    if b"content-length" in head.lower():
        n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        check(len(body) == n, "the reply was cut short: %d of %d bytes" % (len(body), n))
    return status, head, body


def cancelled():
    return metric(S.metrics(), "turbine_requests_finished_total", finished_reason="cancelled")


def idle():
    """Waits (bounded) until nothing runs or waits: what earlier tests started is counted."""
    check(wait_until(lambda: metric(S.metrics(), "turbine_requests_running") == 0 and
                     metric(S.metrics(), "turbine_requests_waiting") == 0, 30), "the server never went idle")


def t_nonstream():
    idle()
    c0 = cancelled()
    for path, body in (("/v1/completions", {"prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": TOKENS, "ignore_eos": True, "n": 2})):
        st, head, data = half_closed_request(path, body)
        check(st == 200, "%s, half-closed: status %s, body %r" % (path, st, data[:300]))
        j = json.loads(data)
        for ch in j["choices"]:
            check(ch["finish_reason"] == "length", "%s, half-closed: finish_reason %r" % (path, ch["finish_reason"]))
        n = len(j["choices"])
        check(j["usage"]["completion_tokens"] == TOKENS * n,
              "%s, half-closed: %s completion tokens, want %d" % (path, j["usage"]["completion_tokens"], TOKENS * n))
    check(cancelled() == c0, "half-closed clients were cancelled (%s -> %s)" % (c0, cancelled()))
    ok("non-streaming completion and chat (n=2) from half-closed clients: whole replies, %d tokens each" % TOKENS)


def t_stream():
    idle()
    c0 = cancelled()
    for path, body in (("/v1/completions", {"prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True,
                                            "stream": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2,
                                                 "max_tokens": TOKENS, "ignore_eos": True, "stream": True,
                                                 "stream_options": {"include_usage": True}})):
        st, head, data = half_closed_request(path, body)
        check(st == 200, "%s stream, half-closed: status %s, body %r" % (path, st, data[:300]))
        events = sse_events(data.decode())
        check(events and events[-1] == "[DONE]", "%s stream, half-closed: no [DONE] (last %r)" % (
            path, events[-1:] if events else None))
        chunks = [json.loads(e) for e in events[:-1]]
        finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        n = body.get("n", 1)
        check(finals == ["length"] * n, "%s stream, half-closed: finish reasons %r" % (path, finals))
        if "stream_options" in body:
            check(chunks[-1]["usage"]["completion_tokens"] == TOKENS * n, "usage %r" % chunks[-1]["usage"])
    check(cancelled() == c0, "half-closed streaming clients were cancelled (%s -> %s)" % (c0, cancelled()))
    ok("streamed completion and chat (n=2) to half-closed clients: every event and [DONE]")


def t_closed_still_cancelled():
    # a client that closes (not half-closes) while its non-streaming request runs is still noticed
    idle()
    c0 = cancelled()
    data = json.dumps({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    time.sleep(0.2)
    s.close()
    t0 = time.time()
    while cancelled() == c0 and time.time() - t0 < 10:
        time.sleep(0.05)
    check(cancelled() == c0 + 1, "a closed client's request was not cancelled within 10 s")
    ok("a client that closes is still cancelled (%.2f s)" % (time.time() - t0))


def main():
    global S
    d = workdir("halfclose")
    S = Server(build_slow(d), "--threads", "1").start()
    run_tests([("non-streaming, half-closed", t_nonstream), ("streaming, half-closed", t_stream),
               ("closed client cancelled", t_closed_still_cancelled)])


if __name__ == "__main__":
    main()

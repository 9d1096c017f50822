"""Cancellation on disconnect: a client that goes away mid-request frees its
sequence slot and KV blocks at once, and the request counts as cancelled.
Run by tests/test_serve_cancel.sh."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_slow, check, http_body, metric, ok, run_tests, wait_until, workdir  # noqa: E402

S = None
LONG = 400
PROMPT = "Once upon a time"


def raw_request(path, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return s


def read_chunks(s, n, timeout=30):
    got = b""
    deadline = time.time() + timeout
    while got.count(b"data: ") < n and time.time() < deadline:
        b = s.recv(65536)
        check(b, "the server closed the stream early")
        got += b
    check(got.count(b"data: ") >= n, "fewer than %d chunks in %d s" % (n, timeout))
    check(b"[DONE]" not in got, "the %d-token request finished before the client left: the test engine is too fast" % LONG)
    return got


def idle_after(cancelled0, what, timeout_s=5.0):
    """Waits (bounded) until nothing runs, the KV cache is empty and one more request was cancelled."""
    t0 = time.time()
    state = {}

    def done():
        ms = S.metrics()
        state["ms"] = ms
        return (metric(ms, "turbine_requests_running") == 0 and metric(ms, "turbine_kv_cache_usage_ratio") == 0 and
                metric(ms, "turbine_requests_waiting") == 0 and
                metric(ms, "turbine_requests_finished_total", finished_reason="cancelled") == cancelled0 + 1)

    good = wait_until(done, timeout_s)
    ms = state["ms"]
    check(good, "%s: %.1f s after the disconnect: running %s, waiting %s, kv usage %s, cancelled %s (was %s)" % (
        what, time.time() - t0, metric(ms, "turbine_requests_running"), metric(ms, "turbine_requests_waiting"),
        metric(ms, "turbine_kv_cache_usage_ratio"),
        metric(ms, "turbine_requests_finished_total", finished_reason="cancelled"), cancelled0))
    return ms, time.time() - t0


def cancelled_count():
    return metric(S.metrics(), "turbine_requests_finished_total", finished_reason="cancelled")


def t_stream_disconnect():
    c0, g0 = cancelled_count(), metric(S.metrics(), "turbine_generation_tokens_total")
    s = raw_request("/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "stream": True, "ignore_eos": True,
                                        "temperature": 0})
    read_chunks(s, 3)
    running = metric(S.metrics(), "turbine_requests_running")
    check(running == 1, "while streaming: turbine_requests_running %s, want 1" % running)
    s.close()
    ms, dt = idle_after(c0, "streaming completion")
    gen = metric(ms, "turbine_generation_tokens_total") - g0
    check(gen < LONG, "the cancelled request still generated all %d tokens" % gen)
    ok("streaming completion closed after 3 chunks: cancelled, slot and KV freed in %.2f s (%d of %d tokens made)"
       % (dt, gen, LONG))


def t_chat_stream_disconnect():
    c0 = cancelled_count()
    s = raw_request("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": LONG,
                                             "stream": True, "ignore_eos": True})
    read_chunks(s, 4)
    s.close()
    _, dt = idle_after(c0, "streaming chat")
    ok("streaming chat closed after 4 chunks: cancelled in %.2f s" % dt)


def t_nonstream_disconnect():
    c0 = cancelled_count()
    s = raw_request("/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True})
    check(wait_until(lambda: metric(S.metrics(), "turbine_requests_running") == 1, 10),
          "the non-streaming request never ran")
    s.close()
    _, dt = idle_after(c0, "non-streaming completion")
    ok("non-streaming completion whose client left: cancelled in %.2f s" % dt)


def t_reset_disconnect():
    c0 = cancelled_count()
    s = raw_request("/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "stream": True, "ignore_eos": True})
    read_chunks(s, 2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close with RST
    s.close()
    _, dt = idle_after(c0, "stream reset by the client")
    ok("stream reset (RST) by the client: cancelled in %.2f s" % dt)


def t_queued_disconnect():
    # with one sequence slot: A runs, B waits; B's client leaves; B never runs, A completes
    c0 = cancelled_count()
    a = raw_request("/v1/completions", {"prompt": PROMPT, "max_tokens": 120, "stream": True, "ignore_eos": True})
    first = read_chunks(a, 1)
    b = raw_request("/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "stream": True, "ignore_eos": True})
    check(wait_until(lambda: metric(S.metrics(), "turbine_requests_waiting") == 1, 10), "B never waited")
    b.close()
    got = first
    deadline = time.time() + 60
    a.settimeout(30)
    while b"[DONE]" not in got and time.time() < deadline:
        x = a.recv(65536)
        if not x:
            break
        got += x
    a.close()
    body = http_body(got)
    check(b"data: [DONE]" in body and b'"finish_reason":"length"' in body, "A did not complete after B left: %r" % body[-300:])
    _, dt = idle_after(c0, "queued request")
    ok("a queued request whose client left is cancelled; the running one completes")


def t_still_serving():
    j = S.completion({"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True})  # sampled: EOS could come early
    check(j["usage"]["completion_tokens"] == 10, "after the cancellations: %r" % j)
    ok("still serving")


def main():
    global S
    d = workdir("cancel")
    S = Server(build_slow(d), "--max-num-seqs", "1", "--threads", "1").start()
    run_tests([("stream disconnect", t_stream_disconnect), ("chat stream disconnect", t_chat_stream_disconnect),
               ("non-stream disconnect", t_nonstream_disconnect), ("reset disconnect", t_reset_disconnect),
               ("queued disconnect", t_queued_disconnect), ("still serving", t_still_serving)])


if __name__ == "__main__":
    main()

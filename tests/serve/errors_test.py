"""Bad input gets the right status and an OpenAI-style error body
{"error": {"message", "type", "param", "code"}}, and the server keeps serving.
Run by tests/test_serve_errors.sh."""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, metric, ok, request, run_tests, workdir  # noqa: E402

KEY = "sk-test-0123456789"
A = None  # --api-key KEY --max-num-seqs 1 --max-queue 1
B = None  # --max-body 1KiB
ENGINE = None
MODEL = "s"  # the engine file's base name
COMP, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Hi"}]


def check_error(st, hd, data, want_status, want_param, what):
    check(st == want_status, "%s: status %s, want %s; body %r" % (what, st, want_status, data[:300]))
    check(hd.get("content-type", "").startswith("application/json"), "%s: content-type %r" % (what, hd.get("content-type")))
    try:
        j = json.loads(data)
    except ValueError:
        check(False, "%s: the error body is not JSON: %r" % (what, data[:300]))
    e = j.get("error") if isinstance(j, dict) else None
    check(isinstance(e, dict), "%s: no 'error' object in %r" % (what, j))
    for k in ("message", "type", "param", "code"):
        check(k in e, "%s: error.%s missing in %r" % (what, k, e))
    check(isinstance(e["message"], str) and e["message"], "%s: empty error.message" % what)
    check(isinstance(e["type"], str) and e["type"], "%s: empty error.type" % what)
    if want_param is not None:
        check(e["param"] == want_param, "%s: error.param %r, want %r" % (what, e["param"], want_param))
    return e


def post_a(path, body, headers=None):
    h = {"Authorization": "Bearer " + KEY}
    h.update(headers or {})
    return request(A.port, "POST", path, body, headers=h, timeout=60)


def t_malformed():
    cases = [
        ("malformed JSON", COMP, b'{"prompt": "Once upon", "max_tokens": 5', None),
        ("JSON with trailing junk", COMP, b'{"prompt": "x"} xyz', None),
        ("not an object", COMP, b'[1, 2, 3]', None),
        ("empty body", COMP, b'', None),
        ("malformed chat JSON", CHAT, b'{"messages": [{"role": "user", "content": "Hi"}', None),
        ("invalid UTF-8", COMP, b'{"prompt": "\xff\xfe"}', None),
    ]
    for what, path, body, param in cases:
        st, hd, d = post_a(path, body)
        e = check_error(st, hd, d, 400, param, what)
        check(e["type"] == "invalid_request_error", "%s: type %r" % (what, e["type"]))
    ok("%d malformed bodies -> 400 invalid_request_error" % len(cases))


def t_bad_params():
    p = {"prompt": "Once upon a time", "max_tokens": 5}
    c = {"messages": MSGS, "max_tokens": 5}
    cases = [
        ("temperature 'hot'", COMP, dict(p, temperature="hot"), "temperature"),
        ("max_tokens '10'", COMP, dict(p, max_tokens="10"), "max_tokens"),
        ("max_tokens 2.5", COMP, dict(p, max_tokens=2.5), "max_tokens"),
        ("stream 'yes'", COMP, dict(p, stream="yes"), "stream"),
        ("top_p 'x'", COMP, dict(p, top_p="x"), "top_p"),
        ("stop 5", COMP, dict(p, stop=5), "stop"),
        ("stop list of numbers", COMP, dict(p, stop=[1, 2]), "stop"),
        ("stop with 5 strings", COMP, dict(p, stop=["a", "b", "c", "d", "e"]), "stop"),
        ("empty stop string", COMP, dict(p, stop=""), "stop"),
        ("model 42", COMP, dict(p, model=42), "model"),
        ("temperature 5", COMP, dict(p, temperature=5), "temperature"),
        ("temperature -1", COMP, dict(p, temperature=-1), "temperature"),
        ("top_p 0", COMP, dict(p, top_p=0), "top_p"),
        ("top_p 1.5", COMP, dict(p, top_p=1.5), "top_p"),
        ("n 65", COMP, dict(p, n=65), "n"),
        ("n 2 > --max-queue 1", COMP, dict(p, n=2), "n"),
        ("n 0", COMP, dict(p, n=0), "n"),
        ("max_tokens 0", COMP, dict(p, max_tokens=0), "max_tokens"),
        ("max_tokens -5", COMP, dict(p, max_tokens=-5), "max_tokens"),
        ("logprobs 50", COMP, dict(p, logprobs=50), "logprobs"),
        ("logprobs -1", COMP, dict(p, logprobs=-1), "logprobs"),
        ("presence_penalty 3", COMP, dict(p, presence_penalty=3), "presence_penalty"),
        ("chat top_logprobs 50", CHAT, dict(c, logprobs=True, top_logprobs=50), "top_logprobs"),
        ("chat logprobs 'yes'", CHAT, dict(c, logprobs="yes"), "logprobs"),
        ("chat top_logprobs without logprobs", CHAT, dict(c, top_logprobs=2), "top_logprobs"),
        ("chat temperature 'hot'", CHAT, dict(c, temperature="hot"), "temperature"),
        ("chat n 65", CHAT, dict(c, n=65), "n"),
        ("chat max_tokens 0", CHAT, dict(c, max_tokens=0), "max_tokens"),
        ("stream_options 'x'", COMP, dict(p, stream=True, stream_options="x"), "stream_options"),
    ]
    for what, path, body, param in cases:
        st, hd, d = post_a(path, body)
        check_error(st, hd, d, 400, param, what)
    ok("%d wrong types / out-of-range parameters -> 400 with error.param naming the field" % len(cases))


def t_unknown_model():
    # OpenAI's answer (the official clients raise NotFoundError): 404, code model_not_found
    for what, path, body in (("completions", COMP, {"prompt": "Once upon a time", "max_tokens": 5, "model": "gpt-17-ultra"}),
                             ("chat", CHAT, {"messages": MSGS, "max_tokens": 5, "model": "gpt-17-ultra"}),
                             ("a NUL after the served name", COMP, {"prompt": "x", "max_tokens": 5, "model": MODEL + "\u0000x"})):
        st, hd, d = post_a(path, body)
        e = check_error(st, hd, d, 404, "model", "unknown model (%s)" % what)
        check(e["type"] == "NotFoundError" and e["code"] == "model_not_found", "unknown model (%s): %r" % (what, e))
    ok("an unknown model -> 404 NotFoundError / model_not_found")


def t_unsupported_fields():
    p = {"prompt": "Once upon a time", "max_tokens": 5}
    c = {"messages": MSGS, "max_tokens": 5}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    cases = [
        ("tools", CHAT, dict(c, tools=[tool]), "tools"),
        ("tool_choice", CHAT, dict(c, tool_choice="auto"), "tool_choice"),
        ("functions", CHAT, dict(c, functions=[tool["function"]]), "functions"),
        ("function_call", CHAT, dict(c, function_call="auto"), "function_call"),
        ("response_format json_object", CHAT, dict(c, response_format={"type": "json_object"}), "response_format"),
        ("response_format json_schema", CHAT, dict(c, response_format={"type": "json_schema", "json_schema": {}}),
         "response_format"),
        ("logit_bias", COMP, dict(p, logit_bias={"403": 5}), "logit_bias"),
        ("best_of 2", COMP, dict(p, best_of=2), "best_of"),
        ("suffix", COMP, dict(p, suffix="The end."), "suffix"),
        ("an unknown field", COMP, dict(p, frobnicate=1), None),
        ("an unknown field (chat)", CHAT, dict(c, temprature=0.5), None),
        ("messages in completions", COMP, dict(p, messages=MSGS), "messages"),
        ("prompt in chat", CHAT, dict(c, prompt="x"), "prompt"),
        ("echo in chat", CHAT, dict(c, echo=True), "echo"),
        ("echo 'yes'", COMP, dict(p, echo="yes"), "echo"),
        ("max_tokens 0 without echo", COMP, dict(p, max_tokens=0, echo=False), "max_tokens"),
    ]
    for what, path, body, param in cases:
        st, hd, d = post_a(path, body)
        e = check_error(st, hd, d, 400, param, what)
        name = param or next(k for k in body if k not in p and k not in c)
        check(name in e["message"], "%s: the message does not name %r: %r" % (what, name, e["message"]))
    # what clients send that asks for nothing this server lacks is accepted
    fine = [
        (COMP, dict(p, user="u-1", seed=3, stream_options=None, logit_bias={}, best_of=1, suffix=None)),
        (CHAT, dict(c, user="u-1", seed=3, response_format={"type": "text"}, tools=None, tool_choice=None,
                    parallel_tool_calls=True, store=False, metadata={"k": "v"}, max_completion_tokens=5)),
        (CHAT, dict(c, stream=True, stream_options={"include_usage": True})),
    ]
    for path, body in fine:
        st, hd, d = post_a(path, body)
        check(st == 200, "%s %r -> %s %r" % (path, body, st, d[:300]))
    ok("%d unsupported or unknown fields -> 400 naming them; %d requests with harmless ones -> 200"
       % (len(cases), len(fine)))


def t_bad_prompts():
    long_text = " ".join(["Lily and Tom played with the big red ball in the park."] * 80)  # > 512 tokens
    cases = [
        ("empty prompt", COMP, {"prompt": ""}, "prompt"),
        ("empty token list", COMP, {"prompt": []}, "prompt"),
        ("no prompt", COMP, {"max_tokens": 5}, "prompt"),
        ("prompt 123", COMP, {"prompt": 123}, "prompt"),
        ("token id outside the vocabulary", COMP, {"prompt": [1, 99999]}, "prompt"),
        ("negative token id", COMP, {"prompt": [1, -3]}, "prompt"),
        ("mixed token list", COMP, {"prompt": [1, "x"]}, "prompt"),
        ("prompt + max_tokens > context", COMP, {"prompt": "Once upon a time", "max_tokens": 510}, None),
        ("600 token ids", COMP, {"prompt": [1] + [403] * 599, "max_tokens": 1}, None),
        ("prompt text over the context", COMP, {"prompt": long_text, "max_tokens": 1}, None),
        ("512-token prompt, default max_tokens", COMP, {"prompt": [1] + [403] * 511}, None),
        ("chat over the context", CHAT, {"messages": [{"role": "user", "content": long_text}]}, None),
        ("no messages", CHAT, {"max_tokens": 5}, "messages"),
        ("empty messages", CHAT, {"messages": []}, "messages"),
        ("messages not a list", CHAT, {"messages": "Hi"}, "messages"),
        ("message without role", CHAT, {"messages": [{"content": "Hi"}]}, "messages"),
        ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages"),
        ("content 5", CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ]
    for what, path, body, param in cases:
        st, hd, d = post_a(path, body)
        check_error(st, hd, d, 400, param, what)
    ok("%d bad prompts (empty, out of vocabulary, longer than the context) -> 400" % len(cases))


def t_auth():
    body = {"prompt": "Once upon a time", "max_tokens": 5}
    cases = [
        ("no Authorization", {}),
        ("wrong key", {"Authorization": "Bearer sk-wrong"}),
        ("key prefix", {"Authorization": "Bearer " + KEY[:-1]}),
        ("key + suffix", {"Authorization": "Bearer " + KEY + "0"}),
        ("no Bearer", {"Authorization": KEY}),
        ("Basic auth", {"Authorization": "Basic c2stdGVzdDo="}),
        ("empty Bearer", {"Authorization": "Bearer "}),
    ]
    for what, h in cases:
        st, hd, d = request(A.port, "POST", COMP, body, headers=h)
        e = check_error(st, hd, d, 401, None, what)
        check(e["type"] == "authentication_error", "%s: type %r" % (what, e["type"]))
    for path in ("/v1/models",):
        st, hd, d = request(A.port, "GET", path)
        check_error(st, hd, d, 401, None, "GET %s without a key" % path)
    st, hd, d = request(A.port, "POST", CHAT, {"messages": MSGS, "max_tokens": 3})
    check_error(st, hd, d, 401, None, "chat without a key")
    st, _, _ = request(A.port, "GET", "/health")
    check(st == 200, "/health without a key -> %s (want 200)" % st)
    st, _, d = post_a(COMP, body)
    check(st == 200, "the right key -> %s %r" % (st, d[:200]))
    st, _, d = request(A.port, "POST", COMP, body, headers={"Authorization": "bearer " + KEY})
    check(st == 200, "'bearer' in lower case -> %s" % st)
    ok("missing/wrong API keys -> 401 authentication_error; /health needs none; the key works")


def t_routes():
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/completions"), ("GET", "/"), ("POST", "/v1/completion")):
        st, hd, d = request(A.port, method, path, {"prompt": "x"} if method == "POST" else None,
                            headers={"Authorization": "Bearer " + KEY})
        check_error(st, hd, d, 404, None, "%s %s" % (method, path))
    st, hd, d = request(A.port, "GET", COMP, headers={"Authorization": "Bearer " + KEY})
    check_error(st, hd, d, 405, None, "GET /v1/completions")
    ok("unknown routes -> 404, a wrong method -> 405, with error bodies")


def t_body_limit():
    big = {"prompt": "Once upon a time " * 240, "max_tokens": 5}  # about 4 KiB
    data = json.dumps(big).encode()
    check(len(data) >= 4000, "test setup: body of %d bytes" % len(data))
    st, hd, d = request(B.port, "POST", COMP, data)
    check_error(st, hd, d, 413, None, "a %d-byte body with --max-body 1KiB" % len(data))
    st, hd, d = request(B.port, "POST", CHAT, json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}))
    check_error(st, hd, d, 413, None, "a 5 KB chat body with --max-body 1KiB")
    j = B.completion({"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True})
    check(j["usage"]["completion_tokens"] == 5, "a small body after the 413: %r" % j)
    ok("bodies over --max-body -> 413; small ones still served")


def t_body_limit_early():
    # a Content-Length over --max-body is answered at once, before the body is
    # sent (as nginx's client_max_body_size): the client need not upload it
    declared = 10 * 1024 * 1024
    for path, auth in ((COMP, None), (CHAT, None), (COMP, "wrong key")):
        srv = B if auth is None else A
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            head = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n" % (path.encode(), declared))
            if auth:
                head += b"Authorization: Bearer %s\r\n" % auth.encode()
            t0 = time.time()
            s.sendall(head + b"\r\n" + b'{"prompt": "')  # a few bytes of the body, then nothing
            got = b""
            s.settimeout(5)
            while b"\r\n\r\n" not in got or len(got) < got.find(b"\r\n\r\n") + 4 + 20:
                try:
                    b = s.recv(65536)
                except (socket.timeout, ConnectionResetError):
                    break
                if not b:
                    break
                got += b
            dt = time.time() - t0
        finally:
            s.close()
        want = 413 if auth is None else 401
        check(got.startswith(b"HTTP/1.1 %d" % want),
              "%s with Content-Length %d and a 12-byte body%s: %r after %.1f s (want %d at once)" % (
                  path, declared, " and a wrong key" if auth else "", got[:100], dt, want))
        check(dt < 3, "%s: the %d came after %.1f s" % (path, want, dt))
    j = B.completion({"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True})
    check(j["usage"]["completion_tokens"] == 5, "a small body after the early 413: %r" % j)
    ok("Content-Length over --max-body -> 413 before the body is sent (401 first without the key); still serving")


def t_queue_full():
    n = 10
    res, errs = [None] * n, []
    barrier = threading.Barrier(n)

    def go(i):
        try:
            barrier.wait(timeout=30)
            res[i] = post_a(COMP, {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True})
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    ts = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=180)
    check(not errs and all(r is not None for r in res), "requests failed: %s" % errs)
    codes = sorted(r[0] for r in res)
    n429 = codes.count(429)
    check(n429 >= 1, "%d simultaneous long requests with --max-num-seqs 1 --max-queue 1: statuses %s, no 429" % (n, codes))
    check(set(codes) <= {200, 429}, "statuses %s (want only 200 and 429)" % codes)
    check(codes.count(200) >= 1, "no request was served")
    for st, hd, d in res:
        if st == 429:
            e = check_error(st, hd, d, 429, None, "queue full")
            check(e["type"] == "rate_limit_error", "429 type %r" % e["type"])
            ra = hd.get("retry-after")
            check(ra is not None and ra.strip().isdigit() and int(ra) >= 1, "429 without a valid Retry-After: %r" % ra)
        else:
            check(json.loads(d)["usage"]["completion_tokens"] == 400, "an accepted request was cut short")
    ms = A.metrics()
    check(metric(ms, "turbine_http_errors_total", status="429") == n429, "turbine_http_errors_total{status=429} wrong")
    ok("queue full: %d x 429 with Retry-After, %d x 200 complete" % (n429, codes.count(200)))


def t_still_serving():
    for srv, h in ((A, {"Authorization": "Bearer " + KEY}), (B, {})):
        st, _, d = request(srv.port, "POST", COMP, {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0},
                           headers=h)
        check(st == 200, "a normal request after the errors -> %s %r" % (st, d[:200]))
        check(json.loads(d)["choices"][0]["text"].startswith(", there was a little girl"), "wrong text after the errors")
        st, _, d = request(srv.port, "GET", "/health")
        check(st == 200, "/health after the errors -> %s" % st)
        check(srv.alive(), "the server died")
    ms = A.metrics()
    check(metric(ms, "turbine_requests_running") == 0 and metric(ms, "turbine_kv_cache_usage_ratio") == 0,
          "after the errors: requests running or KV blocks used")
    check(metric(ms, "turbine_http_errors_total", status="400") > 0, "400s were not counted")
    ok("after all the bad requests both servers answer normally")


def main():
    global A, B, ENGINE
    d = workdir("errors")
    ENGINE = build_stories(d)
    A = Server(ENGINE, "--max-num-seqs", "1", "--max-queue", "1", "--threads", "1", api_key=KEY, log=os.path.join(d, "a.log")).start()
    B = Server(ENGINE, "--max-body", "1KiB", log=os.path.join(d, "b.log")).start()
    run_tests([("malformed bodies", t_malformed), ("bad parameters", t_bad_params), ("unknown model", t_unknown_model),
               ("unsupported fields", t_unsupported_fields), ("bad prompts", t_bad_prompts),
               ("API key", t_auth), ("routes", t_routes), ("body limit", t_body_limit),
               ("body limit before the body", t_body_limit_early),
               ("queue full", t_queue_full), ("still serving", t_still_serving)])


if __name__ == "__main__":
    main()

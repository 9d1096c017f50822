"""Random requests against `turbine serve`: 400 request bodies mutated from
valid ones (fields dropped, retyped, given extreme or odd values, bytes
flipped, bodies cut short) and 100 raw HTTP requests with broken framing,
from a fixed seed. Every reply must be a well-formed response (200 with a
JSON body or an SSE stream, or 4xx with an OpenAI-style error), the server
must stay up and healthy (also through /tokenize and /detokenize of random
strings), and afterwards it must still generate the same
greedy text as before. Run by tests/test_serve_fuzz.sh."""
import json
import os
import random
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, ok, request, run_tests, workdir  # noqa: E402

S = None
SEED = 20261130
BASE_COMP = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
             "stop": ["\n"], "logprobs": 2, "seed": 3, "n": 1, "stream": False}
BASE_CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             "max_tokens": 6, "temperature": 0.7, "logprobs": True, "top_logprobs": 2, "stream": False,
             "stream_options": {"include_usage": True}, "presence_penalty": 0.5}
ODD = [None, True, False, 0, -1, 1, 2 ** 31, -2 ** 63, 2 ** 64, 1e308, -1e308, 0.5, float("nan"), "", "x" * 5000,
       "\u0000", "\ud7ff\ue000", "😀", [], [1, "a"], {}, {"a": {"b": []}}, [[[]]], [0] * 600, [-5], [99999999]]
KEYS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "logprobs", "seed", "n", "stream",
        "stream_options", "messages", "model", "max_completion_tokens", "repetition_penalty", "frequency_penalty",
        "presence_penalty", "ignore_eos", "top_logprobs", "echo", "suffix", "user"]


def mutate(rng, body):
    b = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        k = rng.choice(KEYS)
        if r < 0.3 and b:
            b.pop(rng.choice(list(b)), None)
        elif r < 0.75:
            b[k] = rng.choice(ODD)
        elif r < 0.9 and "messages" in b and isinstance(b["messages"], list) and b["messages"]:
            m = rng.choice(b["messages"])
            if isinstance(m, dict):
                m[rng.choice(["role", "content", "name"])] = rng.choice(ODD + ["tool", "assistant", [{"type": "text", "text": "hi"}]])
        else:
            b[k] = rng.choice(ODD)
            b = rng.choice([b, [b], "text", 42])
            if not isinstance(b, dict):
                return b
    return b


def encode(rng, b):
    try:
        raw = json.dumps(b, allow_nan=True).encode()
    except (TypeError, ValueError):
        raw = b"{}"
    r = rng.random()
    if r < 0.1 and raw:
        raw = raw[:rng.randrange(len(raw))]  # cut short
    elif r < 0.2 and raw:
        i = rng.randrange(len(raw))
        raw = raw[:i] + bytes([rng.randrange(256)]) + raw[i + 1:]  # one byte flipped
    return raw


def check_reply(what, st, hd, data):
    # 404: a mutated "model" names a model this server does not serve
    check(st in (200, 400, 404, 413, 429), "%s: status %s; body %r" % (what, st, data[:300]))
    ct = hd.get("content-type", "")
    if st == 200 and ct.startswith("text/event-stream"):
        text = data.decode(errors="replace")
        check(text.rstrip().endswith("data: [DONE]"), "%s: a stream that does not end with [DONE]: %r" % (what, text[-200:]))
        return
    try:
        j = json.loads(data)
    except ValueError:
        check(False, "%s: status %s with a body that is not JSON: %r" % (what, st, data[:300]))
    if st == 200:
        check(isinstance(j.get("choices"), list) and j["choices"], "%s: 200 without choices: %r" % (what, j))
    else:
        e = j.get("error") if isinstance(j, dict) else None
        check(isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"],
              "%s: %s without an error message: %r" % (what, st, j))


def t_json_fuzz():
    rng = random.Random(SEED)
    counts = {}
    for i in range(400):
        chat = i % 2 == 1
        path = "/v1/chat/completions" if chat else "/v1/completions"
        b = mutate(rng, BASE_CHAT if chat else BASE_COMP)
        raw = encode(rng, b)
        st, hd, data = request(S.port, "POST", path, raw, headers={"Content-Type": "application/json"}, timeout=60)
        check_reply("request %d %s %r" % (i, path, raw[:160]), st, hd, data)
        counts[st] = counts.get(st, 0) + 1
        check(S.alive(), "the server died on request %d: %r\nlog:\n%s" % (i, raw[:300], S.log()))
    check(counts.get(200, 0) >= 20 and counts.get(400, 0) >= 100, "too few valid or invalid bodies: %r" % counts)
    ok("400 mutated bodies answered: %s" % ", ".join("%d x %d" % (n, s) for s, n in sorted(counts.items())))


def raw_exchange(data):
    s = socket.create_connection(("127.0.0.1", S.port), timeout=10)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def t_http_fuzz():
    rng = random.Random(SEED + 1)
    body = json.dumps(BASE_COMP).encode()
    good = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % len(body)) + body
    # a path that is not UTF-8 (it once ended the server): a JSON 404 that quotes it with U+FFFD
    out = raw_exchange(b"POST /\xfc1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    check(out.startswith(b"HTTP/1.1 404") and (b"\\ufffd" in out.lower() or b"\xef\xbf\xbd" in out),
          "a non-UTF-8 path: %r" % out[:300])
    check(S.alive(), "a non-UTF-8 path ended the server")
    answered = 0
    for i in range(100):
        r = rng.random()
        d = bytearray(good)
        if r < 0.3:
            d = d[:rng.randrange(len(d))]
        elif r < 0.6:
            for _ in range(rng.randint(1, 8)):
                d[rng.randrange(len(d))] = rng.randrange(256)
        elif r < 0.8:
            d = bytearray(good.replace(b"Content-Length: %d" % len(body),
                                       b"Content-Length: %d" % rng.choice([0, 1, len(body) + 50, 10 ** 12, -1])))
        else:
            d = bytearray(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        out = raw_exchange(bytes(d))
        if out:
            answered += 1
            check(out.startswith(b"HTTP/1."), "raw request %d: the reply is not HTTP: %r" % (i, out[:100]))
        check(S.alive(), "the server died on raw request %d: %r\nlog:\n%s" % (i, bytes(d[:200]), S.log()))
    check(answered >= 20, "only %d of 100 raw requests got an answer" % answered)
    ok("100 raw requests with broken framing: %d answered, none killed the server" % answered)


def t_tokenize_fuzz():
    rng = random.Random(SEED + 2)
    nuls = 0
    pools = ["abc xyz", " \t\n\r", "0123456789", "éüßñ", "中文字", "😀🚀👍🏽", "\u0000\u0001\u007f\u0085\u2028",
             "<s></s><unk>[INST]<<SYS>>", "\ufffd\ufeff"]
    for i in range(100):
        text = "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 200)))
        st, hd, d = request(S.port, "POST", "/tokenize", {"prompt": text, "add_special_tokens": rng.random() < 0.5})
        if text == "":
            check(st in (200, 400), "/tokenize of %r -> %s" % (text[:40], st))
            continue
        # NUL characters included: "\u0000" is valid JSON and text like any other
        check(st == 200, "/tokenize %r -> %s %r" % (text[:80], st, d[:200]))
        ids = json.loads(d)["tokens"]
        st, _, back = request(S.port, "POST", "/detokenize", {"tokens": ids})
        check(st == 200, "/detokenize of /tokenize %r -> %s" % (text[:80], st))
        if "\u0000" in text:
            nuls += 1
            check(json.loads(back)["prompt"].count("\u0000") == text.count("\u0000"),
                  "the NULs of %r did not survive /tokenize + /detokenize: %r" % (text[:80], back[:200]))
        ids = ids + [rng.randrange(-5, 600) for _ in range(rng.randint(0, 3))]  # some ids out of range
        st, hd, d = request(S.port, "POST", "/detokenize", {"tokens": ids})
        check(st in (200, 400), "/detokenize %r -> %s" % (ids[:20], st))
        json.loads(d)
        check(S.alive(), "the server died on /tokenize or /detokenize of %r" % text[:200])
    check(nuls >= 5, "only %d strings with NUL characters were tried" % nuls)
    ok("100 random strings through /tokenize and /detokenize (%d with NULs, kept)" % nuls)


def t_still_serving():
    st, _, _ = S.get("/health")
    check(st == 200, "/health after the fuzzing -> %s" % st)
    j = S.completion({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})
    check(j["choices"][0]["text"] == GREEDY[0], "greedy text after fuzzing %r, before %r" % (j["choices"][0]["text"], GREEDY[0]))
    ok("healthy afterwards, same greedy text")


GREEDY = []


def main():
    global S
    S = Server(build_stories(workdir("fuzz")), "--max-body", "64KiB").start()
    GREEDY.append(S.completion({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})["choices"][0]["text"])
    run_tests([("mutated JSON bodies", t_json_fuzz), ("broken HTTP framing", t_http_fuzz),
               ("tokenize / detokenize", t_tokenize_fuzz), ("still serving", t_still_serving)])


if __name__ == "__main__":
    main()

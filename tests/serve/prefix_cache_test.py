"""Prefix caching in `turbine serve`: a request whose prompt begins like an
earlier one reuses its KV blocks (usage.prompt_tokens_details.cached_tokens,
whole 16-token blocks, the last prompt token always computed) and gives the
same greedy text as a server with --no-prefix-caching; chat turns reuse the
conversation so far; /metrics counts the looked-up and reused tokens. Run by
tests/test_serve_prefix_cache.sh."""
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BIN, Server, build_stories, check, metric, ok, run_tests, workdir  # noqa: E402

S = None      # prefix caching on (the default)
OFF = None    # --no-prefix-caching
BLOCK = 16
LONG = ("Once upon a time, there was a little girl named Lily. She liked to play in the park with her "
        "friends. One day, she saw a big dog")
SEEN = {"hits": 0, "queried": 0}


def complete(srv, prompt, n=24, **kw):
    j = srv.completion(dict({"prompt": prompt, "max_tokens": n, "temperature": 0}, **kw))
    u = j["usage"]
    d = u.get("prompt_tokens_details")
    check(isinstance(d, dict) and isinstance(d.get("cached_tokens"), int),
          "usage lacks prompt_tokens_details.cached_tokens: %r" % u)
    if srv is S:
        SEEN["hits"] += d["cached_tokens"]
        SEEN["queried"] += u["prompt_tokens"]
    return j["choices"][0]["text"], u["prompt_tokens"], d["cached_tokens"]


def t_repeat():
    t1, n, c1 = complete(S, LONG)
    check(n > 2 * BLOCK, "test setup: the prompt has only %d tokens" % n)
    check(c1 == 0, "the first request found %d cached tokens on a fresh server" % c1)
    t2, _, c2 = complete(S, LONG)
    want = (n - 1) // BLOCK * BLOCK
    check(c2 == want, "the repeated prompt of %d tokens reused %d, want %d (whole blocks, last token computed)" %
          (n, c2, want))
    check(t2 == t1, "the text changed when the prompt came from the cache:\n%r\n%r" % (t1, t2))
    t3, _, c3 = complete(OFF, LONG)
    t4, _, c4 = complete(OFF, LONG)
    check(c3 == 0 and c4 == 0, "--no-prefix-caching reused %d and %d tokens" % (c3, c4))
    check(t3 == t1 and t4 == t1, "the text with --no-prefix-caching differs:\n%r\n%r" % (t1, t3))
    ok("a repeated %d-token prompt reuses %d tokens and writes the same %d characters" % (n, c2, len(t1)))


def t_shared_prefix():
    texts = {}
    for tail in (" and a cat.", " and a red ball.", " that could talk."):
        t, n, c = complete(S, LONG + tail)
        check(c >= BLOCK and c % BLOCK == 0 and c < n, "prompt + %r: %d cached tokens of %d" % (tail, c, n))
        t_off, _, _ = complete(OFF, LONG + tail)
        check(t == t_off, "prompt + %r: text differs from --no-prefix-caching:\n%r\n%r" % (tail, t, t_off))
        texts[tail] = t
    check(len(set(texts.values())) > 1, "different prompts gave one text: %r" % texts)
    ok("prompts that share their beginning reuse it and keep their own text")


def t_stream_usage():
    st, _, ev = S.stream("/v1/completions", {"prompt": LONG, "max_tokens": 8, "temperature": 0, "stream": True,
                                             "stream_options": {"include_usage": True}})
    check(st == 200 and ev and ev[-1] == "[DONE]", "stream -> %s %r" % (st, ev[-2:]))
    u = json.loads(ev[-2])["usage"]
    c = u["prompt_tokens_details"]["cached_tokens"]
    check(c == (u["prompt_tokens"] - 1) // BLOCK * BLOCK, "streamed usage: %r" % u)
    SEEN["hits"] += c
    SEEN["queried"] += u["prompt_tokens"]
    ok("the streamed usage chunk reports %d cached tokens" % c)


def t_chat_turns():
    msgs = [{"role": "user", "content": "Tell me a story about a dog and a ball in the park."}]
    j = S.chat({"messages": msgs, "max_tokens": 40, "temperature": 0})
    reply = j["choices"][0]["message"]["content"]
    SEEN["hits"] += j["usage"]["prompt_tokens_details"]["cached_tokens"]
    SEEN["queried"] += j["usage"]["prompt_tokens"]
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "What happened next?"}]
    j2 = S.chat({"messages": msgs, "max_tokens": 20, "temperature": 0})
    u = j2["usage"]
    SEEN["hits"] += u["prompt_tokens_details"]["cached_tokens"]
    SEEN["queried"] += u["prompt_tokens"]
    j3 = OFF.chat({"messages": msgs, "max_tokens": 20, "temperature": 0})
    check(j2["choices"][0]["message"]["content"] == j3["choices"][0]["message"]["content"],
          "second turn differs from --no-prefix-caching")
    check(u["prompt_tokens_details"]["cached_tokens"] >= BLOCK,
          "the second turn (%d prompt tokens) reused %d" % (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
    ok("a chat's second turn reuses %d of its %d prompt tokens" % (u["prompt_tokens_details"]["cached_tokens"],
                                                                  u["prompt_tokens"]))


def t_bench_prefix():
    """turbine bench --prefix-len: prompts that share their first words hit the cache."""
    m0 = S.metrics()
    h0, q0 = metric(m0, "turbine_prefix_cache_hits_total"), metric(m0, "turbine_prefix_cache_queries_total")
    out = os.path.join(workdir("prefix_cache"), "bench.json")
    r = subprocess.run([BIN, "bench", "http://127.0.0.1:%d" % S.port, "-c", "1", "-n", "6", "--prefix-len", "40",
                        "--input-len", "8", "--output-len", "4", "--no-progress", "--json", out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    check(r.returncode == 0, "turbine bench failed:\n" + r.stdout.decode(errors="replace"))
    with open(out) as f:
        rep = json.load(f)
    cfg = rep["config"]
    check(cfg.get("prefix_len") == 40, "bench JSON config: %r" % cfg)
    ms = S.metrics()
    h = metric(ms, "turbine_prefix_cache_hits_total") - h0
    q = metric(ms, "turbine_prefix_cache_queries_total") - q0
    rate = rep["points"][0].get("server_prefix_cache_hit_rate")
    check(rate is not None and abs(rate - h / q) < 1e-9,
          "bench's server_prefix_cache_hit_rate %r, the server's counters say %d / %d" % (rate, h, q))
    check(b"server prefix cache:" in r.stdout, "the bench summary lacks the prefix-cache line:\n" + r.stdout.decode())
    # the first request writes the prefix (40 words, more than 2 blocks of tokens); the other 5 reuse it
    check(h >= 5 * 2 * BLOCK, "6 bench requests with a 40-word common prefix reused %d tokens" % h)
    SEEN["hits"] = metric(ms, "turbine_prefix_cache_hits_total")
    SEEN["queried"] = metric(ms, "turbine_prefix_cache_queries_total")
    ok("turbine bench --prefix-len 40: the server reused %d tokens over 6 requests" % h)


def t_shared_prefill():
    """Requests that arrive together with one long new prompt: the first computes it, the others wait
    for its blocks (n = 4 choices, and 4 concurrent clients)."""
    prompt = "Tom had a red ball and a blue kite. He went to the hill with his dog Max to fly the kite in the wind"
    j = S.completion({"prompt": prompt, "max_tokens": 8, "temperature": 0, "n": 4})
    u = j["usage"]
    n = u["prompt_tokens"]
    SEEN["hits"] += 3 * ((n - 1) // BLOCK * BLOCK)  # choices 1..3 (the metrics count each choice's lookup)
    SEEN["queried"] += 4 * n
    check(u["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK,
          "n=4 of a new %d-token prompt: cached %r, want the later choices to reuse %d" %
          (n, u["prompt_tokens_details"], (n - 1) // BLOCK * BLOCK))
    texts = [c["text"] for c in j["choices"]]
    check(len(set(texts)) == 1, "greedy n=4 gave different texts: %r" % texts)
    prompt2 = prompt.replace("Tom", "Sam").replace("red", "green")
    out = [None] * 4

    def one(i):
        out[i] = S.completion({"prompt": prompt2, "max_tokens": 8, "temperature": 0})

    ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    cached = sorted(o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in out)
    for o in out:
        SEEN["hits"] += o["usage"]["prompt_tokens_details"]["cached_tokens"]
        SEEN["queried"] += o["usage"]["prompt_tokens"]
    want = (out[0]["usage"]["prompt_tokens"] - 1) // BLOCK * BLOCK
    check(cached == [0, want, want, want], "4 concurrent clients, one new prompt: cached tokens %r, want [0, %d x 3]" %
          (cached, want))
    check(len({o["choices"][0]["text"] for o in out}) == 1, "concurrent greedy texts differ")
    ok("a new prompt sent 4 times at once (n=4, and 4 clients) is computed once: the others reuse %d tokens" % want)


def t_mixed_burst():
    """Short prompts (under one block, tiny token buffers) arriving with long ones: the scheduler compares
    waiting requests with running prefills only over tokens both have (the sanitized suite runs this too)."""
    bodies = [{"prompt": "Hi", "max_tokens": 2, "temperature": 0}, {"prompt": "Once", "max_tokens": 1, "temperature": 0},
              {"prompt": LONG + " and a frog.", "max_tokens": 4, "temperature": 0},
              {"prompt": LONG + " and a hat.", "max_tokens": 4, "temperature": 0}] * 2
    want = [OFF.completion(b)["choices"][0]["text"] for b in bodies]
    out = [None] * len(bodies)

    def one(i):
        out[i] = S.completion(bodies[i])

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for i, o in enumerate(out):
        check(o is not None and o["choices"][0]["text"] == want[i], "burst request %d: %r, want %r" % (
            i, o and o["choices"][0]["text"], want[i]))
        SEEN["hits"] += o["usage"]["prompt_tokens_details"]["cached_tokens"]
        SEEN["queried"] += o["usage"]["prompt_tokens"]
    ok("8 short and long prompts at once: each text as without the cache")


def t_metrics():
    ms = S.metrics()
    h, q = metric(ms, "turbine_prefix_cache_hits_total"), metric(ms, "turbine_prefix_cache_queries_total")
    check(h == SEEN["hits"], "turbine_prefix_cache_hits_total %s, the replies' cached_tokens sum to %d" % (h, SEEN["hits"]))
    check(q == SEEN["queried"], "turbine_prefix_cache_queries_total %s, prompts sum to %d" % (q, SEEN["queried"]))
    check(metric(ms, "turbine_kv_cache_usage_ratio") == 0, "cached blocks count as used KV cache")
    mo = OFF.metrics()
    check(metric(mo, "turbine_prefix_cache_hits_total") == 0, "--no-prefix-caching counts hits")
    ok("metrics: %d of %d looked-up tokens reused" % (h, q))


def main():
    global S, OFF
    eng = build_stories(workdir("prefix_cache"))
    # argv[1]: a --kv-dtype for both servers (test_serve_prefix_cache.sh runs int8 too)
    kv = ["--kv-dtype", sys.argv[1]] if len(sys.argv) > 1 else []
    S = Server(eng, "--threads", "1", *kv, log=eng + ".%s.log" % (sys.argv[1] if kv else "on")).start()
    OFF = Server(eng, "--threads", "1", "--no-prefix-caching", *kv,
                 log=eng + ".off%s.log" % ("." + sys.argv[1] if kv else "")).start()
    run_tests([("repeated prompt", t_repeat), ("shared prefix", t_shared_prefix), ("streamed usage", t_stream_usage),
               ("chat turns", t_chat_turns), ("shared prefill", t_shared_prefill), ("mixed burst", t_mixed_burst),
               ("metrics", t_metrics), ("bench --prefix-len", t_bench_prefix)])


if __name__ == "__main__":
    main()

"""Batching invariance (greedy text of concurrent requests = each alone, also
with chunked prefill) and preemption under a tiny KV pool (every request
completes with its solo text; preemptions happened).
Run by tests/test_serve_batching.sh and tests/test_serve_preemption.sh."""
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, metric, ok, run_tests, wait_until, workdir  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "Lily and Tom went to the park",
    "The little dog was sad because",
    "One day, a big red bird",
    "Sam had a toy car. He",
    "The sun was hot and the children",
    "Mom said, \"Let's go to the store",
    "There was a girl who loved to sing",
    "In a small house lived an old cat",
    "Ben found a shiny stone near the river. He picked it up and showed it to his friend Mia, "
    "who said it was the most beautiful stone she had ever seen",
    "The bunny",
    "It was a rainy day",
    "Anna wanted to bake a cake for her mom. She took flour, eggs and sugar, and then",
    "A tree",
    "The boy and the girl played with a ball in the garden until",
    "Tim was scared of the dark",
]


def body_for(i, max_tokens, stream):
    if i % 4 == 3:  # some chat requests too
        b = {"messages": [{"role": "user", "content": PROMPTS[i]}]}
    else:
        b = {"prompt": PROMPTS[i]}
    b.update(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    if stream:
        b["stream"] = True
    return b


def run_one(srv, i, max_tokens, stream):
    b = body_for(i, max_tokens, stream)
    chat = "messages" in b
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not stream:
        st, _, d = srv.post(path, b, timeout=120)
        check(st == 200, "request %d -> %s %r" % (i, st, d[:200]))
        j = json.loads(d)
        c = j["choices"][0]
        return (c["message"]["content"] if chat else c["text"]), j["usage"]["completion_tokens"], c["finish_reason"]
    st, _, ev = srv.stream(path, b, timeout=120)
    check(st == 200 and ev[-1] == "[DONE]", "stream %d -> %s" % (i, st))
    text, finish = "", None
    for e in ev[:-1]:
        ch = json.loads(e)["choices"][0]
        text += ((ch.get("delta") or {}).get("content") or "") if chat else ch["text"]
        finish = ch.get("finish_reason") or finish
    return text, None, finish


def run_concurrent(srv, idx, max_tokens, stream_odd=True):
    out, errs = {}, []
    barrier = threading.Barrier(len(idx))

    def go(i):
        try:
            barrier.wait(timeout=30)
            out[i] = run_one(srv, i, max_tokens, stream_odd and i % 2 == 1)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errs.append("request %d: %s" % (i, e))

    ts = [threading.Thread(target=go, args=(i,)) for i in idx]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    check(not any(t.is_alive() for t in ts), "concurrent requests did not finish within 300 s")
    check(not errs, "; ".join(errs))
    return out


def compare(solo, conc, what):
    bad = [i for i in solo if solo[i][0] != conc[i][0]]
    if bad:
        i = bad[0]
        a, b = solo[i][0], conc[i][0]
        k = next((n for n in range(min(len(a), len(b))) if a[n] != b[n]), min(len(a), len(b)))
        check(False, "%s: %d of %d requests differ from their solo text; request %d (%r) first differs at char %d: "
              "solo %r, concurrent %r" % (what, len(bad), len(solo), i, PROMPTS[i][:30], k, a[max(0, k - 20):k + 30],
                                          b[max(0, k - 20):k + 30]))
    for i, (t, _, fin) in conc.items():
        check(fin == "length", "%s: request %d finished with %r" % (what, i, fin))


# ---------------------------------------------------------------- batching

def t_batching():
    d = workdir("batching")
    eng = build_stories(d)
    a = Server(eng, "--max-num-seqs", "16", log=os.path.join(d, "a.log")).start()
    idx = list(range(len(PROMPTS)))
    solo = {i: run_one(a, i, 64, False) for i in idx}
    for i, (t, n, _) in solo.items():
        check(n == 64 and t, "solo request %d: %d tokens" % (i, n))
    ms0 = a.metrics()
    conc = run_concurrent(a, idx, 64)
    compare(solo, conc, "16 concurrent requests")
    ms = a.metrics()
    b1 = metric(ms, "turbine_batch_size_bucket", le="1") - metric(ms0, "turbine_batch_size_bucket", le="1")
    n = metric(ms, "turbine_batch_size_count") - metric(ms0, "turbine_batch_size_count")
    big = n - (metric(ms, "turbine_batch_size_bucket", le="8") - metric(ms0, "turbine_batch_size_bucket", le="8"))
    check(n > b1, "the concurrent requests were never batched (all %d steps had one sequence)" % n)
    check(big > 0, "no step had more than 8 sequences: the 16 requests did not run together")
    ok("16 concurrent greedy requests (completions + chat, streamed + not) = each alone; "
       "%d of %d steps batched more than 8 sequences" % (big, n))
    a.kill()

    check("warm-up" not in a.log(), "a CPU server warmed up without --model-warmup on (auto is GPUs only)")

    # chunked prefill: a step budget of 16 tokens splits the longer prompts;
    # this server warms up first (decode batches of 1..16), which changes no text
    c = Server(eng, "--max-num-seqs", "16", "--max-batched-tokens", "16", "--model-warmup", "on",
               log=os.path.join(d, "c.log")).start()
    check(re.search(r"warm-up: decode batches of 1\.\.16 sequences, 16 steps", c.log()),
          "no warm-up line for --model-warmup on:\n" + c.log()[-2000:])
    conc = run_concurrent(c, idx, 64)
    compare(solo, conc, "16 concurrent requests with --max-batched-tokens 16 after a warm-up")
    ms = c.metrics()
    check(metric(ms, "turbine_preemptions_total") == 0, "preemptions with a full KV pool")
    ok("the same with chunked prefill (--max-batched-tokens 16), after --model-warmup on's 16 steps")
    c.kill()


# ---------------------------------------------------------------- preemption

BLOCK_BYTES = 16 * 4 * 8 * 4 * 2 * 5  # 16 tokens x 4 KV heads x head_dim 8 x f32 x (k, v) x 5 layers
# int8 KV: per layer side 16 x 4 x 8 one-byte codes (512 bytes) and 16 x 4 f32 scales (256), each padded to 64
BLOCK_BYTES_INT8 = (512 + 256) * 2 * 5


def t_preemption(kv_dtype=None):
    d = workdir("preemption" + ("_" + kv_dtype if kv_dtype else ""))
    eng = build_stories(d)
    kv = 20 * (BLOCK_BYTES_INT8 if kv_dtype == "int8" else BLOCK_BYTES)  # 20 blocks: 320 tokens for 8 requests of 200
    extra = ["--kv-dtype", kv_dtype] if kv_dtype else []
    srv = Server(eng, "--kv-cache-mem", str(kv), "--max-num-seqs", "8", *extra, log=os.path.join(d, "p.log")).start()
    m = re.search(r"(\d+) KV blocks of (\d+) tokens", srv.log())
    check(m and int(m.group(1)) <= 24 and int(m.group(2)) == 16,
          "--kv-cache-mem %d: the server reports %r (want about 20 blocks of 16 tokens)" % (kv, m and m.group(0)))
    # /metrics and the startup line give the pool in tokens and the KV dtype's bytes per token
    kvn = kv_dtype or "f32"
    cap = metric(srv.metrics(), "turbine_kv_cache_capacity_tokens", kv_dtype=kvn)
    bpt = metric(srv.metrics(), "turbine_kv_cache_bytes_per_token", kv_dtype=kvn)
    check(cap == int(m.group(1)) * 16, "turbine_kv_cache_capacity_tokens %s for %s blocks" % (cap, m.group(1)))
    check(bpt == (BLOCK_BYTES_INT8 if kv_dtype == "int8" else BLOCK_BYTES) / 16, "%s KV: %s bytes per token" % (kvn, bpt))
    check("%d tokens of %s KV" % (cap, kvn) in srv.log(), "the startup line does not say '%d tokens of %s KV'" % (cap, kvn))
    idx = list(range(8))
    solo = {i: run_one(srv, i, 190, False) for i in idx}
    for i, (t, n, _) in solo.items():
        check(n == 190, "solo request %d: %d tokens" % (i, n))
    check(metric(srv.metrics(), "turbine_preemptions_total") == 0, "preemptions with one request at a time")
    conc = run_concurrent(srv, idx, 190)
    compare(solo, conc, "8 concurrent requests in a %s-block KV pool" % m.group(1))
    ms = srv.metrics()
    pre = metric(ms, "turbine_preemptions_total")
    check(pre > 0, "turbine_preemptions_total is 0: 8 x 200 tokens fit in %s blocks?" % m.group(1))
    idle = wait_until(lambda: (lambda x: x if metric(x, "turbine_requests_running") == 0 and
                               metric(x, "turbine_kv_cache_usage_ratio") == 0 else None)(srv.metrics()), 5)
    check(idle, "after the preemption run: requests still running or KV blocks still used")
    check(metric(ms, "turbine_requests_finished_total", finished_reason="error") == 0, "requests finished with an error")
    ok("8 concurrent requests of 200 tokens in %s KV blocks: %d preemptions, every text = its solo text"
       % (m.group(1), pre))
    # a request that can never fit the pool is refused, not hung
    t0 = time.time()
    st, _, body = srv.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 500, "ignore_eos": True}, timeout=60)
    check(time.time() - t0 < 30, "a request larger than the KV pool hung")
    check(st in (400, 500, 200), "a request larger than the pool -> %s" % st)
    j = json.loads(body)
    if st == 200:
        check(j["usage"]["completion_tokens"] < 500, "a 505-token request completed in a 320-token pool")
    check(srv.completion({"prompt": PROMPTS[1], "max_tokens": 10, "ignore_eos": True})["usage"]["completion_tokens"] == 10,
          "not serving after the oversized request")
    ok("an oversized request ends (%s) without hanging the server" % st)
    srv.kill()


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "batching"
    run_tests([("batching invariance", t_batching)] if which == "batching" else
              [("preemption", t_preemption), ("preemption, int8 KV cache", lambda: t_preemption("int8"))])

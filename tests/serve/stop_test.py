"""Stop strings across token boundaries, streaming and not: the text ends
right before the first stop string, which is never sent, and finish_reason is
"stop". min_tokens keeps EOS from ending a choice before that many tokens
(checked on a random-weight model, which draws EOS early and often). Run by
tests/test_serve_stop.sh."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_slow, build_stories, check, ok, run_tests, workdir  # noqa: E402

PROMPT = "Once upon a time"
S = None
FULL = None


def gen(body, chat=False):
    """(text, finish_reason) non-streaming, and the same streamed: (text, finish, chunk texts)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    j = S.chat(body) if chat else S.completion(body)
    c = j["choices"][0]
    text = c["message"]["content"] if chat else c["text"]
    st, _, ev = S.stream(path, dict(body, stream=True))
    check(st == 200, "stream -> %s %r" % (st, ev))
    check(ev and ev[-1] == "[DONE]", "stream does not end with [DONE]: %r" % ev[-2:])
    pieces, finish = [], None
    for e in ev[:-1]:
        ch = json.loads(e)["choices"][0]
        p = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
        if p:
            pieces.append(p)
        if ch.get("finish_reason") is not None:
            check(finish is None, "two chunks with a finish_reason")
            finish = ch["finish_reason"]
    return (text, c["finish_reason"]), ("".join(pieces), finish, pieces)


def expect_cut(stops, chat=False, full=None, base=None):
    full = FULL if full is None else full
    base = base or {"prompt": PROMPT}
    hits = [full.find(s) for s in stops if full.find(s) >= 0]
    check(hits, "test setup: none of %r occurs in %r" % (stops, full))
    want = full[:min(hits)]
    (t, f), (st, sf, pieces) = gen(dict(base, max_tokens=60, temperature=0, stop=stops), chat)
    check(t == want, "stop %r: text %r, want %r" % (stops, t, want))
    check(f == "stop", "stop %r: finish_reason %r, want 'stop'" % (stops, f))
    check(st == want, "stop %r streamed: text %r, want %r" % (stops, st, want))
    check(sf == "stop", "stop %r streamed: finish_reason %r, want 'stop'" % (stops, sf))
    for s in stops:
        check(s not in t and s not in st, "stop string %r appears in the output" % s)
        check(not any(s in p for p in pieces), "stop string %r appears in a streamed chunk" % s)
    return want


def t_greedy():
    global FULL
    j = S.completion({"prompt": PROMPT, "max_tokens": 60, "temperature": 0})
    FULL = j["choices"][0]["text"]
    check("little girl named Lily" in FULL, "greedy text %r lacks 'little girl named Lily'" % FULL)
    check(j["choices"][0]["finish_reason"] == "length", "60 greedy tokens did not end with 'length'")
    ok("greedy text: %r" % FULL[:60])


def t_stop_words():
    want = expect_cut(["girl named"])
    check(want.endswith("little "), "cut text %r" % want)
    ok("stop 'girl named' (two tokens): text ends right before it: %r" % want[-20:])


def t_stop_mid_token():
    want = expect_cut(["rl nam"])
    check(want.endswith("little gi"), "cut text %r" % want)
    ok("stop 'rl nam' (starts and ends inside tokens): text ends with %r" % want[-12:])


def t_stop_first_of_many():
    # "named Lily" starts before "Lily": the earliest occurrence wins whatever the list order
    expect_cut(["Lily", "named Lily"])
    expect_cut(["zzz", "qqq", "little girl"])
    ok("several stop strings: the output ends before the earliest one")


def t_stop_prefix_released():
    # "Lily!" never occurs but "Lily" does: the held-back prefix must be sent in the end
    body = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "stop": ["Lily!", "girl named Tom"]}
    (t, f), (st, sf, _) = gen(body)
    check(t == FULL and st == FULL, "a stop string that never matches changed the text: %r / %r" % (t, st))
    check(f == "length" and sf == "length", "no match: finish %r / %r, want 'length'" % (f, sf))
    ok("partial matches of stop strings are held back and then released unchanged")


def t_stop_chat():
    base = {"messages": [{"role": "user", "content": "Tell me a story."}]}
    full = S.chat(dict(base, max_tokens=60, temperature=0))["choices"][0]["message"]["content"]
    check(len(full) > 40, "chat reply too short for the test: %r" % full)
    # a stop string from the middle of the reply, chosen to span a token boundary
    stop = full[len(full) // 2: len(full) // 2 + 6]
    want = expect_cut([stop], chat=True, full=full, base=base)
    check(len(want) <= len(full) // 2, "chat cut %r" % want)
    ok("chat: stop %r cuts the reply at %d chars, streaming and not" % (stop, len(want)))


def t_min_tokens():
    d = workdir("stop")
    R = Server(build_slow(d), "--threads", "1", log=os.path.join(d, "r.log")).start()
    body = {"prompt": PROMPT, "max_tokens": 120, "temperature": 1.0, "seed": 1, "n": 16, "logprobs": 0}
    j = R.completion(body, timeout=120)
    early = [len(c["logprobs"]["tokens"]) for c in j["choices"] if c["finish_reason"] == "stop"]
    check(len(early) >= 2 and min(early) < 100, "the random model drew EOS in no choice before 100 tokens: %r" % early)
    k = min(early)
    j = R.completion(dict(body, min_tokens=k + 10), timeout=120)
    got = [len(c["logprobs"]["tokens"]) for c in j["choices"]]
    check(min(got) >= k + 10, "min_tokens %d: choices of %r tokens" % (k + 10, got))
    st, _, d = R.post("/v1/completions", dict(body, min_tokens=121))
    check(st == 400 and b"min_tokens" in d, "min_tokens above max_tokens: %s %r" % (st, d[:200]))
    R.kill()
    ok("min_tokens %d: no choice ends before it (without it EOS ended one after %d tokens)" % (k + 10, k))


def main():
    global S
    S = Server(build_stories(workdir("stop"))).start()
    run_tests([("greedy text", t_greedy), ("stop across tokens", t_stop_words), ("stop inside tokens", t_stop_mid_token),
               ("earliest of several stops", t_stop_first_of_many), ("held-back prefix released", t_stop_prefix_released),
               ("chat stop", t_stop_chat), ("min_tokens", t_min_tokens)])


if __name__ == "__main__":
    main()

"""Streams carry one Server-Sent Event per generated token, in order, each with
that token's log-probabilities (completions and chat, n > 1, stop strings,
echo), as OpenAI's API, vLLM and llama.cpp send them: clients count tokens,
read per-token log-probabilities and time tokens from the events. A server
started with --stream-interval 4 merges exactly 4 tokens per event. Checked
with a raw HTTP client (the official openai client: openai_client.mjs).
Run by tests/test_serve_stream_events.sh."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, ok, run_tests, workdir  # noqa: E402

S = None  # default: one token per event
M = None  # --stream-interval 4
PROMPT = "Once upon a time"
MSGS = [{"role": "user", "content": "Tell me a story about a cat."}]


def stream(srv, path, body):
    """The stream's chunks (JSON), [DONE] checked and dropped."""
    st, hd, ev = srv.stream(path, body)
    check(st == 200, "stream %s %r -> %s %r" % (path, body, st, ev))
    check(ev and ev[-1] == "[DONE]" and ev.count("[DONE]") == 1, "stream does not end with one [DONE]: %r" % ev[-3:])
    return [json.loads(e) for e in ev[:-1]]


def split(chunks, chat):
    """(role chunks, token chunks, finish chunks, usage chunk) of a stream."""
    role, tokens, fin, usage = [], [], [], None
    for c in chunks:
        if not c["choices"]:
            check(usage is None, "two usage chunks")
            usage = c["usage"]
            continue
        check(len(c["choices"]) == 1, "a chunk with %d choices" % len(c["choices"]))
        ch = c["choices"][0]
        if ch["finish_reason"] is not None:
            fin.append(ch)
        elif chat and ch["delta"].get("role"):
            check(ch["delta"].get("content", "") == "" and ch["logprobs"] is None, "the role chunk carries a token: %r" % ch)
            role.append(ch)
        else:
            check(not fin or all(f["index"] != ch["index"] for f in fin), "a token after its choice's finish chunk")
            tokens.append(ch)
    return role, tokens, fin, usage


def text_of(ch, chat):
    return (ch["delta"].get("content") or "") if chat else ch["text"]


def lp_count(ch, chat):
    """Tokens whose log-probabilities the chunk carries (0 when none)."""
    lp = ch["logprobs"]
    if lp is None:
        return 0
    if chat:
        return len(lp["content"])
    n = len(lp["tokens"])
    check(len(lp["token_logprobs"]) == n and len(lp["top_logprobs"]) == n and len(lp["text_offset"]) == n,
          "completions logprobs lists of different lengths: %r" % lp)
    return n


def t_completions():
    for logprobs in (None, 2):
        body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        if logprobs is not None:
            body["logprobs"] = logprobs
        ref = S.completion(body)["choices"][0]
        chunks = stream(S, "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
        _, toks, fin, usage = split(chunks, False)
        check(usage and usage["completion_tokens"] == 48, "usage %r" % usage)
        check(len(toks) == 48, "48 tokens arrived in %d events (logprobs %r)" % (len(toks), logprobs))
        check(len(fin) == 1 and fin[0]["finish_reason"] == "length" and fin[0]["logprobs"] is None, "finish %r" % fin)
        check("".join(t["text"] for t in toks) + fin[0]["text"] == ref["text"], "streamed text differs from the reply")
        if logprobs is not None:
            for i, t in enumerate(toks):
                check(lp_count(t, False) == 1, "event %d carries %d tokens' log-probabilities" % (i, lp_count(t, False)))
                check(t["logprobs"]["tokens"][0] == t["text"], "event %d: token %r, text %r" % (i, t["logprobs"]["tokens"][0], t["text"]))
                check(len(t["logprobs"]["top_logprobs"][0]) == 2, "event %d: top %r" % (i, t["logprobs"]["top_logprobs"][0]))
            got = [t["logprobs"]["token_logprobs"][0] for t in toks]
            want = ref["logprobs"]["token_logprobs"]
            check(all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) for a, b in zip(got, want)),
                  "streamed log-probabilities differ from the reply's")
            check([t["logprobs"]["text_offset"][0] for t in toks] == ref["logprobs"]["text_offset"],
                  "streamed text offsets differ from the reply's")
    ok("completions: 48 tokens -> 48 events (+ finish, usage), each with its own log-probabilities")


def t_chat():
    body = {"messages": MSGS, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 3}
    ref = S.chat(body)["choices"][0]
    chunks = stream(S, "/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    role, toks, fin, usage = split(chunks, True)
    check(len(role) == 1 and chunks[0]["choices"][0]["delta"].get("role") == "assistant", "role chunk %r" % role)
    check(usage and usage["completion_tokens"] == 40 and len(toks) == 40, "40 tokens in %d events; usage %r" % (len(toks), usage))
    for i, t in enumerate(toks):
        check(lp_count(t, True) == 1, "chat event %d carries %d tokens' log-probabilities" % (i, lp_count(t, True)))
        item = t["logprobs"]["content"][0]
        check(item["token"] == t["delta"]["content"] and len(item["top_logprobs"]) == 3, "chat event %d: %r" % (i, item))
    check("".join(text_of(t, True) for t in toks) + (fin[0]["delta"].get("content") or "") == ref["message"]["content"],
          "streamed chat text differs from the reply")
    check([t["logprobs"]["content"][0]["token"] for t in toks] == [c["token"] for c in ref["logprobs"]["content"]],
          "streamed chat log-probability tokens differ from the reply's")
    ok("chat: role, then 40 tokens -> 40 events with one logprobs.content entry each, finish, usage")


def t_n_choices():
    for chat in (False, True):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = {"max_tokens": 24, "temperature": 1.0, "seed": 7, "n": 3}
        body.update({"messages": MSGS, "logprobs": True} if chat else {"prompt": PROMPT, "logprobs": 0})
        ref = S.post(path, body)
        check(ref[0] == 200, "n=3 %s -> %r" % (path, ref))
        ref = json.loads(ref[2])
        chunks = stream(S, path, dict(body, stream=True, stream_options={"include_usage": True}))
        _, toks, fin, usage = split(chunks, chat)
        check(len(fin) == 3 and sorted(f["index"] for f in fin) == [0, 1, 2], "n=3 finish chunks %r" % fin)
        check(len(toks) == usage["completion_tokens"], "n=3 %s: %d token events, completion_tokens %d"
              % (path, len(toks), usage["completion_tokens"]))
        for c in ref["choices"]:
            mine = [t for t in toks if t["index"] == c["index"]]
            want = len(c["logprobs"]["content"]) if chat else len(c["logprobs"]["tokens"])
            check(len(mine) == want, "n=3 choice %d: %d events for %d tokens" % (c["index"], len(mine), want))
            check(all(lp_count(t, chat) == 1 for t in mine), "n=3 choice %d: an event with other than one token" % c["index"])
            f = next(f for f in fin if f["index"] == c["index"])
            text = "".join(text_of(t, chat) for t in mine) + text_of(f, chat)
            check(text == (c["message"]["content"] if chat else c["text"]), "n=3 choice %d: text differs" % c["index"])
    ok("n=3 (completions and chat): each choice's tokens one event each, in order, as the reply has them")


def t_stop_and_echo():
    # a stop string: the tokens up to it, each an event; the text stops before it
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["girl named"], "stream": True,
            "stream_options": {"include_usage": True}}
    _, toks, fin, usage = split(stream(S, "/v1/completions", body), False)
    check("".join(t["text"] for t in toks) + fin[0]["text"] == ", there was a little ", "stop: %r" % toks)
    check(fin[0]["finish_reason"] == "stop" and len(toks) == usage["completion_tokens"],
          "stop: %d events, usage %r" % (len(toks), usage))
    # echo: the prompt as its own event, then one per token
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "echo": True, "stream": True}
    _, toks, fin, _ = split(stream(S, "/v1/completions", body), False)
    check(toks[0]["text"] == PROMPT and len(toks) == 11, "echo: %d events, first %r" % (len(toks), toks[0]))
    ok("a stop string and echo keep one event per token")


def t_interval():
    for chat in (False, True):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        for n_tok, want in ((48, [4] * 12), (10, [4, 4, 2])):
            body = {"max_tokens": n_tok, "temperature": 0, "ignore_eos": True, "stream": True}
            body.update({"messages": MSGS, "logprobs": True} if chat else {"prompt": PROMPT, "logprobs": 1})
            _, toks, fin, _ = split(stream(M, path, body), chat)
            got = [lp_count(t, chat) for t in toks]
            check(got == want, "--stream-interval 4, %s %d tokens: events of %r tokens (want %r)" % (path, n_tok, got, want))
            ref = M.post(path, dict(body, stream=False))
            ref = json.loads(ref[2])["choices"][0]
            text = "".join(text_of(t, chat) for t in toks) + text_of(fin[0], chat)
            check(text == (ref["message"]["content"] if chat else ref["text"]), "--stream-interval 4: text differs")
    ok("--stream-interval 4: 48 tokens in 12 events, 10 in 4+4+2 (completions and chat)")


def main():
    global S, M
    d = workdir("stream_events")
    eng = build_stories(d)
    S = Server(eng, log=os.path.join(d, "s.log")).start()
    M = Server(eng, "--stream-interval", "4", log=os.path.join(d, "m.log")).start()
    run_tests([("completions", t_completions), ("chat", t_chat), ("n choices", t_n_choices),
               ("stop and echo", t_stop_and_echo), ("stream interval", t_interval)])


if __name__ == "__main__":
    main()

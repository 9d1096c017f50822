"""OpenAI wire format of `turbine serve`: completions and chat, streaming and
not, usage, token-id prompts, lists of prompts, prompt scoring (echo +
logprobs), /v1/models, /health, /tokenize + /detokenize,
logprobs. Run by tests/test_serve_api.sh."""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (Server, build_stories, check, ok, run_tests, workdir)  # noqa: E402

PROMPT = "Once upon a time"
GREEDY_START = ", there was a little girl named Lily."
S = None
MODEL = None


def check_common(j, obj, what):
    check(isinstance(j.get("id"), str) and j["id"], "%s: 'id' missing or empty: %r" % (what, j))
    check(j.get("object") == obj, "%s: object %r, want %r" % (what, j.get("object"), obj))
    check(isinstance(j.get("created"), int) and abs(j["created"] - time.time()) < 600,
          "%s: 'created' is not the current Unix time: %r" % (what, j.get("created")))
    check(j.get("model") == MODEL, "%s: model %r, want %r" % (what, j.get("model"), MODEL))
    check(isinstance(j.get("choices"), list), "%s: 'choices' is not a list" % what)


def check_usage(u, n_prompt, n_completion, what):
    check(isinstance(u, dict), "%s: usage missing: %r" % (what, u))
    check(u.get("prompt_tokens") == n_prompt, "%s: usage.prompt_tokens %r, want %d" % (what, u.get("prompt_tokens"), n_prompt))
    check(u.get("completion_tokens") == n_completion,
          "%s: usage.completion_tokens %r, want %d" % (what, u.get("completion_tokens"), n_completion))
    check(u.get("total_tokens") == n_prompt + n_completion, "%s: usage.total_tokens %r" % (what, u.get("total_tokens")))


def n_tokens(text):
    st, _, d = S.post("/tokenize", {"prompt": text})
    check(st == 200, "/tokenize -> %s" % st)
    return json.loads(d)["count"]


def t_health_models():
    global MODEL
    st, hd, d = S.get("/health")
    check(st == 200, "/health -> %s" % st)
    st, hd, d = S.get("/v1/models")
    check(st == 200, "/v1/models -> %s %r" % (st, d))
    check(hd.get("content-type", "").startswith("application/json"), "/v1/models content-type %r" % hd.get("content-type"))
    j = json.loads(d)
    check(j.get("object") == "list" and isinstance(j.get("data"), list) and len(j["data"]) == 1,
          "/v1/models: want a list of one model, got %r" % j)
    m = j["data"][0]
    check(isinstance(m.get("id"), str) and m["id"], "/v1/models: model id missing: %r" % m)
    check(m.get("object") == "model" and isinstance(m.get("created"), int) and isinstance(m.get("owned_by"), str),
          "/v1/models: model entry lacks object/created/owned_by: %r" % m)
    MODEL = m["id"]
    ok("/health 200, /v1/models lists %r" % MODEL)


def t_completion():
    j = S.completion({"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0})
    check_common(j, "text_completion", "completion")
    check(len(j["choices"]) == 1, "completion: %d choices" % len(j["choices"]))
    c = j["choices"][0]
    check(c.get("index") == 0, "completion: index %r" % c.get("index"))
    check(isinstance(c.get("text"), str), "completion: text is not a string")
    check(c["text"].startswith(GREEDY_START), "completion: greedy text %r does not start with %r" % (c["text"], GREEDY_START))
    check(c.get("finish_reason") == "length", "completion: finish_reason %r, want 'length'" % c.get("finish_reason"))
    check("logprobs" in c and c["logprobs"] is None, "completion: logprobs should be null when not asked")
    check_usage(j.get("usage"), n_tokens(PROMPT), 40, "completion")
    ok("non-streaming completion: fields, greedy text, finish 'length', usage")
    # without "model" too (it is optional); the same greedy text
    j2 = S.completion({"prompt": PROMPT, "max_tokens": 40, "temperature": 0})
    check(j2["choices"][0]["text"] == c["text"], "completion without 'model' gives other text")
    check(j2["id"] != j["id"], "two completions share the id %r" % j["id"])


def t_completion_stop_reason():
    j = S.completion({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["named"]})
    c = j["choices"][0]
    check(c["finish_reason"] == "stop", "completion with a stop string: finish_reason %r, want 'stop'" % c["finish_reason"])
    check(c["text"] == ", there was a little girl ", "stop string: text %r" % c["text"])
    ok("finish_reason 'stop' on a stop string")


def t_chat():
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me a story."}]
    j = S.chat({"model": MODEL, "messages": msgs, "max_tokens": 30, "temperature": 0})
    check_common(j, "chat.completion", "chat")
    c = j["choices"][0]
    check(c.get("index") == 0, "chat: index %r" % c.get("index"))
    m = c.get("message") or {}
    check(m.get("role") == "assistant", "chat: message.role %r" % m.get("role"))
    check(isinstance(m.get("content"), str) and m["content"], "chat: message.content empty or missing: %r" % m)
    check(c.get("finish_reason") == "length", "chat: finish_reason %r, want 'length'" % c.get("finish_reason"))
    u = j.get("usage")
    check(isinstance(u, dict) and u.get("completion_tokens") == 30 and u.get("prompt_tokens", 0) > 0 and
          u.get("total_tokens") == u["prompt_tokens"] + 30, "chat: usage %r" % u)
    # max_completion_tokens is the newer name of max_tokens
    j2 = S.chat({"messages": msgs, "max_completion_tokens": 12, "temperature": 0})
    check(j2["usage"]["completion_tokens"] == 12, "chat: max_completion_tokens 12 gave %r" % j2["usage"])
    check(c["message"]["content"].startswith(j2["choices"][0]["message"]["content"]),
          "chat: the 12-token greedy reply is not a prefix of the 30-token one")
    # content as a list of one text part
    j3 = S.chat({"messages": [msgs[0], {"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}],
                 "max_tokens": 30, "temperature": 0})
    check(j3["choices"][0]["message"]["content"] == m["content"], "chat: content parts give other text")
    ok("non-streaming chat: fields, role, content, usage, max_completion_tokens, content parts")


def stream_chunks(path, body):
    st, hd, ev = S.stream(path, body)
    check(st == 200, "stream %s -> %s %r" % (path, st, ev))
    check(hd.get("content-type", "").startswith("text/event-stream"), "stream content-type %r" % hd.get("content-type"))
    check(len(ev) >= 2 and ev[-1] == "[DONE]", "stream does not end with data: [DONE]: %r" % ev[-3:])
    check(ev.count("[DONE]") == 1, "data: [DONE] appears %d times" % ev.count("[DONE]"))
    chunks = []
    for e in ev[:-1]:
        try:
            chunks.append(json.loads(e))
        except ValueError:
            check(False, "stream chunk is not JSON: %r" % e[:200])
    return chunks


def t_stream_completion():
    ref = S.completion({"prompt": PROMPT, "max_tokens": 40, "temperature": 0})["choices"][0]["text"]
    chunks = stream_chunks("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                               "stream": True})
    ids = {c.get("id") for c in chunks}
    check(len(ids) == 1 and None not in ids, "stream chunks carry ids %r (want one)" % ids)
    text = ""
    for i, c in enumerate(chunks):
        check_common(c, "text_completion", "completion chunk %d" % i)
        check(len(c["choices"]) == 1, "completion chunk %d has %d choices" % (i, len(c["choices"])))
        ch = c["choices"][0]
        check(isinstance(ch.get("text"), str), "completion chunk %d: text not a string" % i)
        text += ch["text"]
        fr = ch.get("finish_reason")
        if i < len(chunks) - 1:
            check(fr is None, "completion chunk %d (not last) has finish_reason %r" % (i, fr))
    check(chunks[-1]["choices"][0]["finish_reason"] == "length",
          "last completion chunk finish_reason %r" % chunks[-1]["choices"][0].get("finish_reason"))
    check(text == ref, "streamed text %r != non-streaming %r" % (text, ref))
    ok("streaming completion: %d chunks of valid JSON, one id, finish on the last, [DONE], same text" % len(chunks))


def t_stream_chat():
    msgs = [{"role": "user", "content": "Tell me a story."}]
    ref = S.chat({"messages": msgs, "max_tokens": 30, "temperature": 0})["choices"][0]["message"]["content"]
    chunks = stream_chunks("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 30,
                                                    "temperature": 0, "stream": True})
    ids = {c.get("id") for c in chunks}
    check(len(ids) == 1 and None not in ids, "chat chunks carry ids %r (want one)" % ids)
    first = chunks[0]["choices"][0].get("delta", {})
    check(first.get("role") == "assistant", "first chat delta has no role 'assistant': %r" % first)
    text = ""
    for i, c in enumerate(chunks):
        check_common(c, "chat.completion.chunk", "chat chunk %d" % i)
        ch = c["choices"][0]
        d = ch.get("delta")
        check(isinstance(d, dict), "chat chunk %d: delta missing" % i)
        if i > 0:
            check("role" not in d, "chat chunk %d repeats the role" % i)
        if d.get("content") is not None:
            check(isinstance(d["content"], str), "chat chunk %d: content not a string" % i)
            text += d["content"]
        if i < len(chunks) - 1:
            check(ch.get("finish_reason") is None, "chat chunk %d (not last) has finish_reason" % i)
    check(chunks[-1]["choices"][0]["finish_reason"] == "length",
          "last chat chunk finish_reason %r" % chunks[-1]["choices"][0].get("finish_reason"))
    check(text == ref, "streamed chat %r != non-streaming %r" % (text, ref))
    ok("streaming chat: role first, content deltas, finish on the last, [DONE], same text")


def t_include_usage():
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        body = dict(body, max_tokens=17, temperature=0, stream=True, stream_options={"include_usage": True})
        chunks = stream_chunks(path, body)
        last = chunks[-1]
        check(last.get("choices") == [], "%s include_usage: the last chunk has choices %r (want [])" % (path, last.get("choices")))
        u = last.get("usage")
        n_prompt = n_tokens(PROMPT) if "prompt" in body else (u or {}).get("prompt_tokens", 0)
        check_usage(u, n_prompt, 17, path + " include_usage")
        check(n_prompt > 0, "%s: prompt_tokens is 0" % path)
        check(chunks[-2]["choices"][0]["finish_reason"] == "length",
              "%s include_usage: the chunk before usage has no finish_reason" % path)
        for c in chunks[:-1]:
            check(c.get("usage") is None, "%s include_usage: usage on a content chunk: %r" % (path, c.get("usage")))
    # without stream_options there is no usage chunk
    chunks = stream_chunks("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "stream": True})
    check(all(c.get("choices") for c in chunks), "a usage chunk was sent without stream_options.include_usage")
    ok("stream_options.include_usage: a final chunk with empty choices and usage (completions and chat)")


def t_token_ids():
    st, _, d = S.post("/tokenize", {"prompt": PROMPT})
    check(st == 200, "/tokenize -> %s" % st)
    ids = json.loads(d)["tokens"]
    check(all(isinstance(t, int) for t in ids) and len(ids) == 5, "/tokenize %r gave %r" % (PROMPT, ids))
    a = S.completion({"prompt": PROMPT, "max_tokens": 30, "temperature": 0})
    b = S.completion({"prompt": ids, "max_tokens": 30, "temperature": 0})
    check(b["choices"][0]["text"] == a["choices"][0]["text"],
          "token-id prompt gives %r, text prompt %r" % (b["choices"][0]["text"], a["choices"][0]["text"]))
    check(b["usage"]["prompt_tokens"] == len(ids), "token-id prompt: usage.prompt_tokens %r" % b["usage"])
    c = S.completion({"prompt": [PROMPT], "max_tokens": 30, "temperature": 0})
    check(c["choices"][0]["text"] == a["choices"][0]["text"], "prompt [\"text\"] gives other text")
    ok("prompt as token ids %r gives the same text as the string" % ids)


def t_tokenize_roundtrip():
    texts = [PROMPT, "Lily and Tom went to the park. They saw a big dog!",
             "Hello\n\tworld,  two  spaces and \"quotes\"", "caf\u00e9 costs 5\u20ac \U0001F600 \u65e5\u672c"]
    for t in texts:
        st, _, d = S.post("/tokenize", {"prompt": t})
        check(st == 200, "/tokenize %r -> %s" % (t, st))
        j = json.loads(d)
        check(j.get("count") == len(j.get("tokens", [])) and j["count"] > 0, "/tokenize %r: %r" % (t, j))
        check(isinstance(j.get("max_model_len"), int) and j["max_model_len"] == 512, "/tokenize: max_model_len %r" % j.get("max_model_len"))
        st, _, d = S.post("/detokenize", {"tokens": j["tokens"]})
        check(st == 200, "/detokenize -> %s" % st)
        back = json.loads(d).get("prompt")
        check(back == t, "round trip of %r gives %r" % (t, back))
    st, _, d = S.post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False})
    j = json.loads(d)
    st2, _, d2 = S.post("/tokenize", {"prompt": PROMPT})
    check(json.loads(d2)["tokens"][1:] == j["tokens"] and json.loads(d2)["count"] == j["count"] + 1,
          "add_special_tokens false should drop exactly the BOS: %r vs %r" % (j, d2))
    ok("/tokenize then /detokenize gives back %d texts (ASCII, whitespace, UTF-8)" % len(texts))


def t_nul_characters():
    # "\u0000" is valid JSON: a prompt holding it is text like any other (a byte-fallback token)
    text = "Once upon\u0000 a time"
    st, _, d = S.post("/tokenize", {"prompt": text})
    check(st == 200, "/tokenize of a prompt with U+0000 -> %s %r" % (st, d[:200]))
    ids = json.loads(d)["tokens"]
    st, _, d = S.post("/tokenize", {"prompt": text.replace("\u0000", "")})
    check(len(ids) == len(json.loads(d)["tokens"]) + 1, "the NUL has no token of its own: %r vs %s" % (ids, d))
    pieces = []
    for t in ids:
        st, _, d = S.post("/detokenize", {"tokens": [t]})
        pieces.append(json.loads(d)["prompt"])
    nul_id = [t for t, p in zip(ids, pieces) if p == "\u0000"]
    check(len(nul_id) == 1, "no token of %r decodes to U+0000 alone: %r" % (ids, pieces))
    st, _, d = S.post("/detokenize", {"tokens": ids})
    check(st == 200 and json.loads(d)["prompt"] == text, "round trip of %r: %s %r" % (text, st, d[:200]))
    j = S.completion({"prompt": text, "max_tokens": 5, "temperature": 0})
    check(j["usage"]["prompt_tokens"] == len(ids), "completion of a prompt with U+0000: prompt_tokens %r, tokens %r"
          % (j["usage"], ids))
    b = S.completion({"prompt": ids, "max_tokens": 5, "temperature": 0})
    check(b["choices"][0]["text"] == j["choices"][0]["text"], "the text prompt and its ids give different completions")
    j = S.chat({"messages": [{"role": "user", "content": "a\u0000b"}], "max_tokens": 3})
    check(j["usage"]["completion_tokens"] == 3, "chat with U+0000 in a message: %r" % j)
    # a stop string with a NUL: matched with its length (not cut at the NUL, which would stop at once)
    j = S.completion({"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "stop": [",\u0000"]})
    check(j["choices"][0]["finish_reason"] == "length", "the stop string ',\\u0000' matched %r" % j["choices"][0])
    ok("U+0000 in prompts, messages and stop strings: 200, its own token (%d), round trip" % nul_id[0])


def t_echo():
    plain = S.completion({"prompt": PROMPT, "max_tokens": 12, "temperature": 0})["choices"][0]["text"]
    j = S.completion({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "echo": True})
    check(j["choices"][0]["text"] == PROMPT + plain, "echo: %r, want %r" % (j["choices"][0]["text"], PROMPT + plain))
    check(j["usage"]["completion_tokens"] == 12, "echo: usage %r" % j["usage"])
    st, _, d = S.post("/tokenize", {"prompt": PROMPT})
    ids = json.loads(d)["tokens"]
    j = S.completion({"prompt": ids, "max_tokens": 12, "temperature": 0, "echo": True, "n": 2})
    check([c["text"] for c in j["choices"]] == [PROMPT + plain] * 2, "echo of token ids, n=2: %r" % j["choices"])
    chunks = stream_chunks("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "echo": True,
                                               "stream": True})
    check("".join(c["choices"][0]["text"] for c in chunks) == PROMPT + plain, "streamed echo: %r" % chunks)
    j = S.completion({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "echo": False})
    check(j["choices"][0]["text"] == plain, "echo false: %r" % j["choices"][0]["text"])
    ok("echo: the prompt (text or token ids) before the completion, streamed and not")


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(a))


def t_logprobs_completion():
    j = S.completion({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2})
    c = j["choices"][0]
    lp = c.get("logprobs")
    check(isinstance(lp, dict), "completions logprobs=2: logprobs %r" % lp)
    toks, tlp, top = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    check(isinstance(toks, list) and len(toks) == 8, "logprobs.tokens %r (want 8)" % toks)
    check(isinstance(tlp, list) and len(tlp) == 8, "logprobs.token_logprobs %r (want 8)" % tlp)
    check(isinstance(top, list) and len(top) == 8, "logprobs.top_logprobs %r (want 8)" % top)
    check("".join(toks) == c["text"], "logprobs tokens %r do not spell the text %r" % (toks, c["text"]))
    offs = lp.get("text_offset")
    check(isinstance(offs, list) and len(offs) == 8 and offs == sorted(offs) and offs[0] == 0,
          "logprobs.text_offset %r" % offs)
    for i in range(8):
        check(isinstance(tlp[i], (int, float)) and math.isfinite(tlp[i]) and tlp[i] <= 0, "token_logprobs[%d] = %r" % (i, tlp[i]))
        check(isinstance(top[i], dict) and len(top[i]) == 2, "top_logprobs[%d] has %r (want 2 entries)" % (i, top[i]))
        for k, v in top[i].items():
            check(v <= 0, "top_logprobs[%d][%r] = %r > 0" % (i, k, v))
        best = max(top[i].values())
        check(close(tlp[i], best), "temperature 0: token %d logprob %r is not the top one %r" % (i, tlp[i], best))
        check(close(top[i].get(toks[i], 1.0), tlp[i]), "top_logprobs[%d] %r lacks the chosen token %r" % (i, top[i], toks[i]))
    check(sum(math.exp(v) for v in top[0].values()) <= 1.0 + 1e-5, "top probabilities sum above 1: %r" % top[0])
    # the same through a stream: the same tokens and values
    chunks = stream_chunks("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2,
                                               "stream": True})
    stoks, slp = [], []
    for ch in chunks:
        l = ch["choices"][0].get("logprobs")
        if l:
            stoks += l["tokens"]
            slp += l["token_logprobs"]
    check(stoks == toks and all(close(a, b) for a, b in zip(slp, tlp)) and len(slp) == 8,
          "streamed logprobs differ: %r %r vs %r %r" % (stoks, slp, toks, tlp))
    ok("completions logprobs=2: tokens, token_logprobs <= 0 = max of 2 top entries, text_offset, also streamed")


def t_logprobs_chat():
    j = S.chat({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8, "temperature": 0,
                "logprobs": True, "top_logprobs": 2})
    c = j["choices"][0]
    lp = c.get("logprobs")
    check(isinstance(lp, dict) and isinstance(lp.get("content"), list), "chat logprobs %r" % lp)
    items = lp["content"]
    check(len(items) == 8, "chat logprobs.content has %d items (want 8)" % len(items))
    check("".join(it["token"] for it in items) == c["message"]["content"], "chat logprob tokens do not spell the content")
    for i, it in enumerate(items):
        check(isinstance(it.get("token"), str) and isinstance(it.get("logprob"), (int, float)) and it["logprob"] <= 0,
              "chat logprobs item %d: %r" % (i, it))
        check(it.get("bytes") == list(it["token"].encode()), "chat item %d: bytes %r for %r" % (i, it.get("bytes"), it["token"]))
        top = it.get("top_logprobs")
        check(isinstance(top, list) and len(top) == 2, "chat item %d: top_logprobs %r (want 2)" % (i, top))
        check(all(t["logprob"] <= 0 and isinstance(t["token"], str) for t in top), "chat item %d: top %r" % (i, top))
        check(top[0]["logprob"] >= top[1]["logprob"], "chat item %d: top_logprobs not sorted %r" % (i, top))
        check(close(it["logprob"], max(t["logprob"] for t in top)),
              "temperature 0: chat token %d logprob %r is not the max of %r" % (i, it["logprob"], top))
        check(top[0]["token"] == it["token"], "chat item %d: the chosen %r is not the top %r" % (i, it["token"], top[0]))
    j0 = S.chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True})
    items0 = j0["choices"][0]["logprobs"]["content"]
    check(len(items0) == 3 and all(it["top_logprobs"] == [] for it in items0),
          "chat logprobs without top_logprobs: %r" % items0)
    ok("chat logprobs + top_logprobs 2: values <= 0, chosen = max, bytes, sorted alternatives")


def t_sampling_seed():
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 1234}
    a = S.completion(body)["choices"][0]["text"]
    b = S.completion(body)["choices"][0]["text"]
    check(a == b, "the same seed gives different texts: %r vs %r" % (a, b))
    texts = {S.completion(dict(body, seed=s))["choices"][0]["text"] for s in range(1, 6)}
    check(len(texts) > 1, "five seeds at temperature 1 give one text: sampling ignores the seed")
    ok("sampling: a seed repeats its text, other seeds differ")


def t_n_choices():
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.5, "seed": 99, "ignore_eos": True}
    j = S.completion(dict(body, n=3))
    check_common(j, "text_completion", "n=3")
    ch = j["choices"]
    check([c["index"] for c in ch] == [0, 1, 2], "n=3: choice indexes %r" % [c.get("index") for c in ch])
    texts = [c["text"] for c in ch]
    check(all(c["finish_reason"] == "length" for c in ch), "n=3: finish reasons %r" % [c["finish_reason"] for c in ch])
    check(len(set(texts)) > 1, "n=3 at temperature 1.5 gave one text three times: %r" % texts)
    n_prompt = n_tokens(PROMPT) + 0
    check_usage(j["usage"], j["usage"]["prompt_tokens"], 3 * 12, "n=3 usage (prompt once, 3 x 12 completion)")
    check(j["usage"]["prompt_tokens"] in (n_prompt, n_prompt + 1), "n=3: prompt_tokens %r" % j["usage"])
    again = [c["text"] for c in S.completion(dict(body, n=3))["choices"]]
    check(again == texts, "n=3 with a seed is not repeatable:\n%r\n%r" % (texts, again))
    one = S.completion(body)["choices"][0]["text"]
    check(one == texts[0], "choice 0 of n=3 differs from n=1 with the same seed: %r vs %r" % (texts[0], one))
    g = [c["text"] for c in S.completion({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "n": 2})["choices"]]
    check(len(g) == 2 and g[0] == g[1] and g[0].startswith(GREEDY_START[:20]), "greedy n=2: %r" % g)
    # streamed: every index gets its own text and one finish_reason; usage at the end
    chunks = stream_chunks("/v1/completions", dict(body, n=3, stream=True, stream_options={"include_usage": True}))
    got, fin = {}, {}
    for c in chunks[:-1]:
        for x in c["choices"]:
            got[x["index"]] = got.get(x["index"], "") + x["text"]
            if x["finish_reason"] is not None:
                check(x["index"] not in fin, "index %d finished twice" % x["index"])
                fin[x["index"]] = x["finish_reason"]
    check([got.get(i) for i in range(3)] == texts, "streamed n=3 texts differ:\n%r\n%r" % (got, texts))
    check(fin == {0: "length", 1: "length", 2: "length"}, "streamed finish reasons %r" % fin)
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 36,
          "streamed n=3 usage chunk %r" % chunks[-1])
    # chat, streamed: a role chunk per choice
    chunks = stream_chunks("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                    "n": 2, "stream": True, "temperature": 1.0, "seed": 5})
    roles = sorted(x["index"] for c in chunks for x in c["choices"] if x.get("delta", {}).get("role") == "assistant")
    check(roles == [0, 1], "chat n=2 role chunks for indexes %r" % roles)
    ok("n=3: three seeded samples (repeatable, choice 0 = n=1), greedy n=2 identical, streamed by index")


def t_prompt_list():
    st, _, d = S.post("/tokenize", {"prompt": "The dog"})
    ids = json.loads(d)["tokens"]
    prompts = [PROMPT, ids, "Lily and Tom"]
    body = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    alone = [S.completion(dict(body, prompt=p)) for p in prompts]
    j = S.completion(dict(body, prompt=prompts))
    check_common(j, "text_completion", "prompt list")
    ch = j["choices"]
    check([c["index"] for c in ch] == [0, 1, 2], "prompt list: choice indexes %r" % [c.get("index") for c in ch])
    want = [a["choices"][0]["text"] for a in alone]
    check([c["text"] for c in ch] == want, "prompt list: texts differ from each prompt alone:\n%r\n%r"
          % ([c["text"] for c in ch], want))
    check_usage(j["usage"], sum(a["usage"]["prompt_tokens"] for a in alone), 30,
                "prompt list usage (every prompt's tokens once, 3 x 10 completion)")
    # n = 2 for each prompt: prompt k's choices are 2k and 2k + 1, each the choice it is alone (same seed)
    sb = {"max_tokens": 8, "temperature": 1.5, "seed": 17, "n": 2, "ignore_eos": True}
    alone = [[c["text"] for c in S.completion(dict(sb, prompt=p))["choices"]] for p in prompts[:2]]
    j = S.completion(dict(sb, prompt=prompts[:2]))
    got = [c["text"] for c in j["choices"]]
    check([c["index"] for c in j["choices"]] == [0, 1, 2, 3], "prompt list, n=2: indexes %r" % j["choices"])
    check(got == alone[0] + alone[1], "prompt list, n=2: %r, want each prompt's seeded choices %r" % (got, alone))
    check(j["usage"]["completion_tokens"] == 32, "prompt list, n=2: usage %r" % j["usage"])
    # echo: each choice after its own prompt's text
    j = S.completion(dict(body, prompt=[PROMPT, ids], echo=True))
    check([c["text"] for c in j["choices"]] == [PROMPT + want[0], "The dog" + want[1]],
          "prompt list with echo: %r" % [c["text"] for c in j["choices"]])
    # streamed: every index its own text and finish_reason, usage summed
    chunks = stream_chunks("/v1/completions", dict(body, prompt=prompts, stream=True,
                                                   stream_options={"include_usage": True}))
    text, fin = {}, {}
    for c in chunks[:-1]:
        for x in c["choices"]:
            text[x["index"]] = text.get(x["index"], "") + x["text"]
            if x["finish_reason"] is not None:
                fin[x["index"]] = x["finish_reason"]
    check([text.get(i) for i in range(3)] == want, "streamed prompt list: %r, want %r" % (text, want))
    check(fin == {0: "length", 1: "length", 2: "length"}, "streamed prompt list: finish reasons %r" % fin)
    check(chunks[-1]["usage"]["completion_tokens"] == 30, "streamed prompt list usage %r" % chunks[-1])
    # refusals name the prompt
    for bad, frag in [([PROMPT, ""], "prompt 1"), ([PROMPT, [1, "x"]], "prompt 1"), ([[1, 2], [1, 99999]], "prompt 1"),
                      ([PROMPT, 7], "prompt 1"), (["x"] * 65, "at most 64 prompts")]:
        st, _, d = S.post("/v1/completions", {"prompt": bad, "max_tokens": 4})
        msg = json.loads(d).get("error", {}).get("message", "") if st == 400 else d[:200]
        check(st == 400 and frag in msg, "prompt %r: %s %r, want a 400 naming %r" % (bad[:3], st, msg, frag))
    st, _, d = S.post("/v1/completions", {"prompt": ["a", "b " * 300], "max_tokens": 400})
    msg = json.loads(d).get("error", {}).get("message", "")
    check(st == 400 and "in prompt 1" in msg, "too long a prompt of a list: %s %r" % (st, msg))
    ok("a list of prompts (text and token ids): each choice as its prompt alone (greedy, seeded n=2, echo, "
       "streamed), usage summed, refusals name the prompt")


def t_prompt_scoring():
    st, _, d = S.post("/tokenize", {"prompt": PROMPT})
    ids = json.loads(d)["tokens"]
    # the greedy continuation's own log-probabilities, as generated
    gen = S.completion({"prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 0})["choices"][0]["logprobs"]
    st, _, d = S.post("/tokenize", {"prompt": PROMPT + "".join(gen["tokens"])})
    full = ids + json.loads(d)["tokens"][len(ids):]
    check(len(full) == len(ids) + 8, "the greedy text re-tokenizes differently: %r" % full)
    # that text as a prompt, scored (max_tokens 0: nothing generated): each token's score is its log-probability
    # given those before it, so the last 8 equal the generated ones (an off-by-one would shift them)
    j = S.completion({"prompt": full, "max_tokens": 0, "echo": True, "logprobs": 2})
    c = j["choices"][0]
    lp = c["logprobs"]
    check(len(lp["tokens"]) == len(full) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
          "scored prompt: %d tokens (want %d), first %r" % (len(lp["tokens"]), len(full), lp["token_logprobs"][:1]))
    got = lp["token_logprobs"][len(ids):]
    check(all(close_to(a, b, 2e-3) for a, b in zip(got, gen["token_logprobs"])),
          "scored continuation %r, generated %r" % (got, gen["token_logprobs"]))
    check(all(v <= 0 for v in lp["token_logprobs"][1:]), "a positive log-probability: %r" % lp["token_logprobs"])
    for k in range(1, len(full)):
        top = lp["top_logprobs"][k]
        check(isinstance(top, dict) and 1 <= len(top) <= 2 and max(top.values()) >= lp["token_logprobs"][k] - 1e-4,
              "prompt token %d: alternatives %r, its own %r" % (k, top, lp["token_logprobs"][k]))
    offs = lp["text_offset"]
    check(offs[0] == 0 and all(a <= b for a, b in zip(offs, offs[1:])), "text_offset %r" % offs)
    check(c["text"] == PROMPT + "".join(gen["tokens"]) and c["finish_reason"] == "length",
          "max_tokens 0: text %r, finish %r" % (c["text"], c["finish_reason"]))
    check(j["usage"]["completion_tokens"] == 0 and j["usage"]["prompt_tokens"] == len(full), "usage %r" % j["usage"])
    # again (its blocks now in the prefix cache): the same scores, every token computed again
    again = S.completion({"prompt": full, "max_tokens": 0, "echo": True, "logprobs": 2})["choices"][0]["logprobs"]
    check(again["token_logprobs"] == lp["token_logprobs"], "a second scoring differs: %r" % again["token_logprobs"])
    # with generation: the prompt's scores, then the completion's, offsets into the echoed text
    j = S.completion({"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "echo": True, "logprobs": 1})
    c = j["choices"][0]
    plain = S.completion({"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 1})["choices"][0]
    n = len(ids)
    check(c["text"] == PROMPT + plain["text"], "echo + logprobs text %r" % c["text"])
    check(len(c["logprobs"]["tokens"]) == n + 5 and c["logprobs"]["tokens"][n:] == plain["logprobs"]["tokens"],
          "echo + logprobs tokens %r" % c["logprobs"]["tokens"])
    check(c["logprobs"]["text_offset"][n] == len(PROMPT), "the completion's first offset %r, want %d"
          % (c["logprobs"]["text_offset"][n], len(PROMPT)))
    check(j["usage"]["completion_tokens"] == 5, "echo + logprobs usage %r" % j["usage"])
    # streamed: the echo event carries the prompt's scores
    chunks = stream_chunks("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "echo": True,
                                               "logprobs": 1, "stream": True})
    first = chunks[0]["choices"][0]
    check(first["text"] == PROMPT and first["logprobs"]["tokens"] == c["logprobs"]["tokens"][:n] and
          first["logprobs"]["token_logprobs"][1:] == c["logprobs"]["token_logprobs"][1:n],
          "streamed echo event %r" % first)
    check("".join(x["choices"][0]["text"] for x in chunks) == c["text"], "streamed text %r" % chunks)
    # a prompt longer than a step's token budget: scored over several chunks, the same figures
    small = Server(S.engine, "--max-batched-tokens", "4", "--max-num-seqs", "2", "--threads", "1",
                   log=S.log_path + ".small").start()
    try:
        st, _, d = small.post("/v1/completions", {"prompt": full, "max_tokens": 0, "echo": True, "logprobs": 2})
        check(st == 200, "chunked scoring -> %s %r" % (st, d[:200]))
        ch = json.loads(d)["choices"][0]["logprobs"]
        check(all(close_to(a, b, 2e-3) for a, b in zip(ch["token_logprobs"][1:], lp["token_logprobs"][1:])) and
              ch["tokens"] == lp["tokens"], "scored in chunks of 4: %r, in one step %r"
              % (ch["token_logprobs"], lp["token_logprobs"]))
    finally:
        small.kill()
    ok("echo + logprobs scores the prompt (max_tokens 0 too): the greedy continuation scored as a prompt has its "
       "generated log-probabilities, the same in chunks of 4 and from the prefix cache, streamed with the echo")


def close_to(a, b, tol):
    return a is not None and b is not None and abs(a - b) <= tol


def main():
    global S
    d = workdir("api")
    S = Server(build_stories(d)).start()
    run_tests([("health+models", t_health_models), ("completion", t_completion), ("NUL characters", t_nul_characters),
               ("echo", t_echo),
               ("completion finish stop", t_completion_stop_reason), ("chat", t_chat),
               ("stream completion", t_stream_completion), ("stream chat", t_stream_chat),
               ("include_usage", t_include_usage), ("token-id prompt", t_token_ids),
               ("tokenize round trip", t_tokenize_roundtrip), ("logprobs completions", t_logprobs_completion),
               ("logprobs chat", t_logprobs_chat), ("seeded sampling", t_sampling_seed), ("n choices", t_n_choices),
               ("prompt list", t_prompt_list), ("prompt scoring", t_prompt_scoring)])


if __name__ == "__main__":
    main()

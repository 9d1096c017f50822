"""An LLM engine and a general engine side by side in one model repository,
with a real `turbine serve --model-repository` on a loopback port:
    mlp/1/model.engine    an ONNX MLP built here (x FP32 [N,6] -> y FP32 [N,4])
    story/1/model.engine  stories260K (an LLM engine)
    broken_llm/1/model.engine  the first half of stories260K's engine
What each test asserts is in its docstring. The greedy reference is a plain
`turbine serve story.engine` of the same engine, and the stories260K
folder's expected text (greedy, 200 tokens).
"""
import json
import re
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (BIN, STORIES, Server, TestFailure, build_stories, check, metric, ok,  # noqa: E402
                        run_tests, wait_until, workdir)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

D = workdir("v2_repo_llm")
REPO = os.path.join(D, "repo")
rng = np.random.default_rng(11)
W = rng.standard_normal((6, 4)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)
PROMPT = "Once upon a time"


def setup():
    shutil.rmtree(REPO, ignore_errors=True)
    for p in ("mlp/1", "story/1", "broken_llm/1"):
        os.makedirs(os.path.join(REPO, p))
    init = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])]
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src = os.path.join(D, "lin.onnx")
    onnx.save(m, src)
    r = subprocess.run([BIN, "build", src, "-o", os.path.join(REPO, "mlp/1/model.engine"), "--min-shapes", "x:1x6",
                        "--opt-shapes", "x:4x6", "--max-shapes", "x:8x6"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        raise TestFailure("build failed:\n" + r.stdout.decode(errors="replace"))
    eng = build_stories(D, max_batch=4)
    shutil.copy(eng, os.path.join(REPO, "story/1/model.engine"))
    # the LLM warms up at load (on a CPU only when asked): its texts must
    # still equal the plain server's, which does not
    with open(os.path.join(REPO, "story/config.json"), "w") as f:
        json.dump({"warmup": True}, f)
    with open(eng, "rb") as f:
        data = f.read()
    with open(os.path.join(REPO, "broken_llm/1/model.engine"), "wb") as f:
        f.write(data[: len(data) // 2])
    return eng


ENGINE = setup()
S = Server(None, "--model-repository", REPO, "--threads", "1", log=os.path.join(D, "serve.log")).start(wait_s=240)
PLAIN = Server(ENGINE, "--threads", "1", log=os.path.join(D, "plain.log")).start(wait_s=120)
with open(os.path.join(STORIES, "expected_once_upon_a_time_n200.txt")) as f:
    EXPECTED = f.read()


def index():
    st, _, data = S.post("/v2/repository/index", {})
    check(st == 200, "index -> %s %r" % (st, data[:300]))
    return {(e["name"], e["version"]): e for e in json.loads(data)}


def mlp_infer(x):
    b = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    st, _, data = S.post("/v2/models/mlp/infer", b, timeout=120)
    if st != 200:
        return st, data
    o = json.loads(data)["outputs"][0]
    return st, np.array(o["data"], np.float32).reshape(o["shape"])


def text_infer(prompt, max_tokens=None, params=None, model="story"):
    b = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}]}
    if max_tokens is not None:
        b["inputs"].append({"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [max_tokens]})
    if params:
        b["parameters"] = params
    st, _, data = S.post("/v2/models/%s/infer" % model, b, timeout=120)
    return st, json.loads(data)


def plain_greedy(prompt, n):
    j = PLAIN.completion({"prompt": prompt, "max_tokens": n, "temperature": 0})
    return j["choices"][0]["text"]


def test_index_and_metadata():
    """Both good models READY, the broken LLM UNAVAILABLE with its reason (and
    in the log); the LLM's v2 metadata names Triton's LLM tensors."""
    ix = index()
    check(ix[("mlp", "1")]["state"] == "READY" and ix[("story", "1")]["state"] == "READY", "index %s" % ix)
    br = ix.get(("broken_llm", "1"))
    check(br is not None and br["state"] == "UNAVAILABLE" and br["reason"], "broken_llm: %s" % ix)
    check("broken_llm" in S.log(), "the log names the broken model")
    check(re.search(r"model 'story' version 1 ready \(LLM llama, context \d+, 4 sequences, 4 warm-up steps", S.log()),
          "no warm-up in story's ready line (config.json \"warmup\": true):\n" + S.log()[-1500:])
    st, _, data = S.get("/v2/models/story")
    check(st == 200, "metadata -> %s" % st)
    md = json.loads(data)
    ins = {i["name"]: (i["datatype"], i["shape"]) for i in md["inputs"]}
    outs = {o["name"]: (o["datatype"], o["shape"]) for o in md["outputs"]}
    check(ins == {"text_input": ("BYTES", [1]), "max_tokens": ("INT32", [1])}, "inputs %s" % ins)
    check(outs == {"text_output": ("BYTES", [1])}, "outputs %s" % outs)
    for m in ("story", "mlp"):
        st, _, _ = S.get("/v2/models/%s/ready" % m)
        check(st == 200, "%s ready -> %s" % (m, st))
    ok("index: mlp and story READY, broken_llm UNAVAILABLE (%s); story's metadata: %s -> %s"
       % (br["reason"][:60], ins, outs))


def test_v2_infer_both():
    """v2 infer on the ONNX model equals numpy; on the LLM, text_output is the
    greedy continuation: equal to a plain `turbine serve ENGINE`'s greedy
    completion and a prefix of the stories260K reference after the prompt."""
    x = rng.standard_normal((3, 6)).astype(np.float32)
    st, y = mlp_infer(x)
    check(st == 200 and np.allclose(y, x @ W + B, rtol=1e-5, atol=1e-5), "mlp -> %s %s" % (st, y))
    st, j = text_infer(PROMPT, 24)
    check(st == 200, "story -> %s %s" % (st, j))
    o = j["outputs"][0]
    check(o["name"] == "text_output" and o["datatype"] == "BYTES" and o["shape"] == [1], "output %s" % o)
    text = o["data"][0]
    ref = plain_greedy(PROMPT, 24)
    check(text == ref, "v2 %r != plain serve %r" % (text, ref))
    check(EXPECTED.startswith(PROMPT + text), "%r is not the reference's continuation" % text)
    # max_tokens from parameters when the input is absent; 16 by default
    st, j2 = text_infer(PROMPT, params={"max_tokens": 24})
    check(st == 200 and j2["outputs"][0]["data"][0] == text, "parameters.max_tokens -> %s %s" % (st, j2))
    st, j3 = text_infer(PROMPT)
    check(st == 200 and j3["outputs"][0]["data"][0] == plain_greedy(PROMPT, 16), "default 16 tokens: %s" % j3)
    ok("mlp equals numpy; story's text_output %r equals plain serve and the reference" % text)


def test_openai_same_model():
    """The same LLM answers /v1/completions (also streamed) and
    /v1/chat/completions by its name with the plain server's greedy text,
    and /tokenize; /v1/models lists only it; the
    ONNX model named there is a 400, an unknown name a 404."""
    j = S.completion({"model": "story", "prompt": PROMPT, "max_tokens": 40, "temperature": 0})
    text = j["choices"][0]["text"]
    check(j["model"] == "story" and text == plain_greedy(PROMPT, 40), "completion %r" % text)
    check(EXPECTED.startswith(PROMPT + text), "completion is not the reference's continuation: %r" % text)
    msgs = [{"role": "user", "content": "Tell me a story"}]
    c1 = S.chat({"model": "story", "messages": msgs, "max_tokens": 12, "temperature": 0})
    c2 = PLAIN.chat({"messages": msgs, "max_tokens": 12, "temperature": 0})
    check(c1["choices"][0]["message"]["content"] == c2["choices"][0]["message"]["content"], "chat differs")
    st, _, ev = S.stream("/v1/completions", {"model": "story", "prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                             "stream": True})
    check(st == 200 and ev[-1] == "[DONE]", "stream -> %s" % st)
    streamed = "".join(json.loads(x)["choices"][0]["text"] for x in ev[:-1])
    check(streamed == text, "streamed %r != %r" % (streamed, text))
    st, _, data = S.post("/tokenize", {"model": "story", "prompt": PROMPT})
    check(st == 200 and json.loads(data)["count"] > 0, "tokenize -> %s %r" % (st, data[:200]))
    st, _, data = S.get("/v1/models")
    ids = [m["id"] for m in json.loads(data)["data"]]
    check(st == 200 and ids == ["story"], "/v1/models -> %s %s" % (st, ids))
    st, _, data = S.post("/v1/completions", {"model": "mlp", "prompt": "x"})
    check(st == 400 and b"KServe v2" in data, "mlp on OpenAI -> %s %r" % (st, data))
    st, _, data = S.post("/v1/completions", {"model": "nosuch", "prompt": "x"})
    check(st == 404 and json.loads(data)["error"]["code"] == "model_not_found", "unknown -> %s %r" % (st, data))
    # the repository serves one LLM: "model" may be left out
    j = S.completion({"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    check(j["choices"][0]["text"] == plain_greedy(PROMPT, 8), "no 'model' -> %s" % j)
    ok("OpenAI completion %r equals plain serve and the reference; chat equal; /v1/models %s" % (text[:40], ids))


def binary_text_infer(prompt, max_tokens):
    """text_input as binary data (4-byte length + bytes), max_tokens as JSON,
    every output binary; returns (status, text_output bytes)."""
    raw = prompt.encode()
    elem = struct.pack("<I", len(raw)) + raw
    hdr = json.dumps({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": len(elem)}},
                                 {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [max_tokens]}],
                      "parameters": {"binary_data_output": True}}).encode()
    st, hd, data = S.post("/v2/models/story/infer", hdr + elem,
                          headers={"Inference-Header-Content-Length": str(len(hdr)),
                                   "Content-Type": "application/octet-stream"})
    if st != 200:
        return st, data
    hl = int(hd["inference-header-content-length"])
    head = json.loads(data[:hl])
    o = head["outputs"][0]
    size = o["parameters"]["binary_data_size"]
    body = data[hl:]
    check(len(body) == size, "binary part %d bytes, header says %d" % (len(body), size))
    (n,) = struct.unpack("<I", body[:4])
    check(n + 4 == size, "element length %d in %d bytes" % (n, size))
    return st, body[4:]


def test_bytes_round_trips():
    """BYTES in JSON and binary give the same text for the same prompt (a
    prompt with quotes, a backslash and non-ASCII text); a binary element
    whose length runs past its data is a 400."""
    prompts = [PROMPT, 'Lily said "hi" \\ to the caf\u00e9']
    for p in prompts:
        st, j = text_infer(p, 10)
        check(st == 200, "JSON -> %s %s" % (st, j))
        st, b = binary_text_infer(p, 10)
        check(st == 200, "binary -> %s %r" % (st, b))
        check(b.decode() == j["outputs"][0]["data"][0], "binary %r != JSON %r" % (b, j))
    raw = PROMPT.encode()
    elem = struct.pack("<I", len(raw) + 5) + raw
    hdr = json.dumps({"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES",
                                  "parameters": {"binary_data_size": len(elem)}}]}).encode()
    st, _, data = S.post("/v2/models/story/infer", hdr + elem,
                         headers={"Inference-Header-Content-Length": str(len(hdr))})
    check(st == 400 and b"BYTES" in data, "bad length -> %s %r" % (st, data))
    st, j = text_infer(PROMPT, params={"bogus": 1})
    check(st == 400 and "bogus" in j["error"], "unknown parameter -> %s %s" % (st, j))
    st, _, data = S.post("/v2/models/story/infer", {"inputs": [{"name": "text_input", "shape": [1],
                                                                 "datatype": "FP32", "data": [1]}]})
    check(st == 400, "FP32 text_input -> %s" % st)
    ok("JSON and binary BYTES agree for %d prompts; bad lengths and parameters refused" % len(prompts))


def test_json_equals_binary_onnx():
    """The ONNX model given the same float32 values as JSON (Python's
    17-digit floats and nested lists) and as binary data answers with the
    same output bytes (outputs binary in both)."""
    x = (rng.standard_normal((8, 6)) * np.array([1e-30, 1e-3, 1, 1e3, 1e30, 0.1])).astype(np.float32)
    x[0, 0] = -0.0
    outs = []
    for form in ("flat", "nested", "binary"):
        inp = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
        if form == "binary":
            raw = x.astype("<f4").tobytes()
            inp["parameters"] = {"binary_data_size": len(raw)}
        else:
            inp["data"] = x.ravel().tolist() if form == "flat" else x.tolist()
        hdr = json.dumps({"inputs": [inp], "parameters": {"binary_data_output": True}}).encode()
        h = {"Inference-Header-Content-Length": str(len(hdr))} if form == "binary" else {}
        st, hd, data = S.post("/v2/models/mlp/infer", hdr + (raw if form == "binary" else b""), headers=h)
        check(st == 200, "%s -> %s %r" % (form, st, data[:200]))
        outs.append(data[int(hd["inference-header-content-length"]):])
    check(outs[0] == outs[1] == outs[2], "JSON and binary inputs gave different outputs")
    ref = (x @ W + B).astype("<f4")
    check(np.allclose(np.frombuffer(outs[2], "<f4").reshape(8, 4), ref, rtol=1e-5, atol=1e-5), "differs from numpy")
    ok("flat JSON, nested JSON and binary inputs: the same %d output bytes" % len(outs[0]))


def test_scheduler_gauges_per_llm():
    """/metrics carries the scheduler gauges (running, waiting, KV cache,
    batch size) of each loaded LLM under its model and version: the running
    count of "story" reads 1 during a generation and 0 after; the broken
    LLM has none; promtool accepts the text when it is installed."""
    ms = S.metrics()
    for name in ("turbine_requests_running", "turbine_requests_waiting"):
        check(metric(ms, name, model="story", version="1") == 0, "%s of the idle story" % name)
    for name in ("turbine_kv_cache_usage_ratio", "turbine_batch_size_current"):
        metric(ms, name, model="story", version="1")  # present
    check(not any("broken_llm" in k for k in ms), "a series of the broken LLM")
    # a 300-token generation of this model takes ~10-20 ms, about one /metrics
    # round trip: the gauge is polled through up to 20 generations, each
    # until it ends, and must read 1 during one of them
    seen, kv = False, 0.0
    for _ in range(20):
        res = {}
        g = threading.Thread(target=lambda: res.update(r=S.post("/v1/completions", {
            "model": "story", "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "temperature": 0},
            timeout=120)))
        g.start()
        while g.is_alive() and not seen:
            ms = S.metrics()
            if metric(ms, "turbine_requests_running", model="story", version="1") == 1:
                seen = True
                kv = metric(ms, "turbine_kv_cache_usage_ratio", model="story", version="1")
        g.join(120)
        check(res["r"][0] == 200, "the generation -> %s" % res["r"][0])
        if seen:
            break
    check(seen, "running never read 1 during 20 generations")
    check(wait_until(lambda: metric(S.metrics(), "turbine_requests_running", model="story", version="1") == 0, 10),
          "running after the generation")
    promtool = shutil.which("promtool")
    if promtool:
        st, _, data = S.get("/metrics")
        r = subprocess.run([promtool, "check", "metrics"], input=data, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        out = r.stdout.decode(errors="replace")
        check("error" not in out.lower() and "duplicate" not in out.lower(), "promtool check metrics: %s" % out[:600])
    ok("story's scheduler gauges by model and version: running 1 during a generation (KV usage %.3f), 0 after%s"
       % (kv, "; promtool clean" if promtool else ""))


def test_token_metrics_per_llm():
    """Two LLMs of one repository keep their own token counters and latency
    histograms, under their model and version: a generation of "story"
    moves story's and leaves story2's where they were. story2 is added to
    the repository and loaded here, and unloaded at the end."""
    os.makedirs(os.path.join(REPO, "story2/1"), exist_ok=True)
    shutil.copy(ENGINE, os.path.join(REPO, "story2/1/model.engine"))
    st, _, data = S.post("/v2/repository/models/story2/load", {}, timeout=120)
    check(st == 200, "load story2 -> %s %r" % (st, data[:300]))
    def read(model, name):
        return metric(S.metrics(), name, model=model, version="1")
    names = ("turbine_generation_tokens_total", "turbine_prompt_tokens_total", "turbine_time_to_first_token_seconds_count",
             "turbine_e2e_request_latency_seconds_count")
    b1 = {n: read("story", n) for n in names}
    b2 = {n: read("story2", n) for n in names}
    j = S.completion({"model": "story", "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0})
    check(j["usage"]["completion_tokens"] == 12, "usage %s" % j["usage"])
    a1 = {n: read("story", n) for n in names}
    a2 = {n: read("story2", n) for n in names}
    check(a1["turbine_generation_tokens_total"] - b1["turbine_generation_tokens_total"] == 12,
          "story's generated tokens %s -> %s" % (b1, a1))
    check(a1["turbine_time_to_first_token_seconds_count"] - b1["turbine_time_to_first_token_seconds_count"] == 1,
          "story's TTFT count %s -> %s" % (b1, a1))
    check(a2 == b2, "story2's series moved with story's request: %s -> %s" % (b2, a2))
    st, _, data = S.get("/metrics")
    text = data.decode()
    check('turbine_requests_finished_total{model="story2",version="1",finished_reason="length"}' in text,
          "story2's finish reasons are not labelled by model and version")
    st, _, data = S.post("/v2/repository/models/story2/unload", {}, timeout=120)
    check(st == 200, "unload story2 -> %s %r" % (st, data[:300]))
    ok("story +12 generated tokens and one TTFT sample under model=story; story2's series unchanged")


def test_unload_load_llm_while_onnx_serves():
    """While a thread keeps sending v2 requests to the ONNX model, the LLM is
    unloaded (a generation in flight finishes 200; then v2 and OpenAI get
    503 and the index says UNAVAILABLE) and loaded again (the same greedy
    text). Every ONNX request meanwhile is 200 with numpy's values."""
    x = rng.standard_normal((2, 6)).astype(np.float32)
    stop = threading.Event()
    codes = []

    def onnx_load():
        while not stop.is_set():
            st, y = mlp_infer(x)
            codes.append(st if st != 200 or np.allclose(y, x @ W + B, rtol=1e-5, atol=1e-5) else -1)

    t = threading.Thread(target=onnx_load)
    t.start()
    res = {}

    def long_gen():
        res["r"] = S.post("/v1/completions", {"model": "story", "prompt": PROMPT, "max_tokens": 400,
                                              "ignore_eos": True, "temperature": 0}, timeout=120)

    g = threading.Thread(target=long_gen)
    try:
        g.start()
        time.sleep(0.05)
        st, _, data = S.post("/v2/repository/models/story/unload", {})
        check(st == 200, "unload -> %s %r" % (st, data))
        g.join(120)
        st_g = res["r"][0]
        check(st_g in (200, 503), "generation during unload -> %s" % st_g)
        if st_g == 200:
            n_gen = json.loads(res["r"][2])["usage"]["completion_tokens"]
            check(n_gen == 400, "the accepted generation was cut at %d tokens" % n_gen)
        st, j = text_infer(PROMPT, 8)
        check(st == 503, "v2 after unload -> %s %s" % (st, j))
        st, _, _ = S.post("/v1/completions", {"model": "story", "prompt": PROMPT})
        check(st == 503, "OpenAI after unload -> %s" % st)
        check(index()[("story", "1")]["state"] == "UNAVAILABLE", "index after unload")
        st, _, data = S.post("/v2/repository/models/story/load", {})
        check(st == 200, "load -> %s %r" % (st, data))
        st, j = text_infer(PROMPT, 24)
        check(st == 200 and j["outputs"][0]["data"][0] == plain_greedy(PROMPT, 24), "after load -> %s %s" % (st, j))
        st, _, data = S.post("/v2/repository/models/broken_llm/load", {})
        check(st == 400 and b"error" in data, "broken_llm load -> %s %r" % (st, data))
    finally:
        stop.set()
        t.join(60)
    check(codes and all(c == 200 for c in codes), "ONNX requests during unload/load: %s" % sorted(set(codes)))
    ok("LLM unloaded (in-flight generation %s) and loaded while %d ONNX requests all answered 200"
       % (res["r"][0], len(codes)))


run_tests([("index_and_metadata", test_index_and_metadata), ("v2_infer_both", test_v2_infer_both),
           ("openai_same_model", test_openai_same_model), ("bytes_round_trips", test_bytes_round_trips),
           ("json_equals_binary_onnx", test_json_equals_binary_onnx),
           ("scheduler_gauges_per_llm", test_scheduler_gauges_per_llm),
           ("token_metrics_per_llm", test_token_metrics_per_llm),
           ("unload_load_llm_while_onnx_serves", test_unload_load_llm_while_onnx_serves)])

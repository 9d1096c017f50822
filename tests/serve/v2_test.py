"""`turbine serve` over KServe v2 (the Open Inference Protocol, as Triton
speaks it), with a real server on a loopback port and real HTTP clients
(http.client and curl).

The model: a small MLP made here with onnx.helper, with a dynamic batch
dimension, two inputs and two outputs of different datatypes:
    x FP32 [N, 4], z FP32 [N, 3] -> y = relu(x W1 + b1) W2 + b2 + z  FP32 [N, 3]
                                    pos = y > 0                        BOOL [N, 3]
built into an engine for N in 1..8. Outputs are compared with numpy (the
model's own maths, within float tolerance) and with `turbine exec` on the
same engine (bit for bit: the same kernels run). Every endpoint and error
of the protocol is exercised; an LLM engine is checked to keep the OpenAI
API and answer the v2 health and metadata routes.
"""
import http.client
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (BIN, Server, TestFailure, build_stories, check, metric, ok, parse_metrics,  # noqa: E402
                        promtool_only_mandated_units, request, run_tests, workdir)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

D = workdir("v2")
rng = np.random.default_rng(7)
W1 = rng.standard_normal((4, 16)).astype(np.float32)
B1 = rng.standard_normal(16).astype(np.float32)
W2 = rng.standard_normal((16, 3)).astype(np.float32)
B2 = rng.standard_normal(3).astype(np.float32)


def make_model(path):
    init = [numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (W2, "W2"), (B2, "B2"))]
    init.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
        helper.make_node("Add", ["o0", "B2"], ["o1"]),
        helper.make_node("Add", ["o1", "z"], ["y"]),
        helper.make_node("Greater", ["y", "zero"], ["pos"]),
    ]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("pos", TensorProto.BOOL, ["N", 3])],
        init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)


def reference(x, z):
    y = np.maximum(x @ W1 + B1, 0) @ W2 + B2 + z
    return y.astype(np.float32), y > 0


ENGINE = os.path.join(D, "mlp.engine")


def build():
    onnx_path = os.path.join(D, "mlp.onnx")
    make_model(onnx_path)
    r = subprocess.run([BIN, "build", onnx_path, "-o", ENGINE, "--min-shapes", "x:1x4,z:1x3", "--opt-shapes",
                        "x:4x4,z:4x3", "--max-shapes", "x:8x4,z:8x3"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        raise TestFailure("build failed:\n" + r.stdout.decode(errors="replace"))


def exec_engine(x, z):
    """The engine run by `turbine exec` on the same inputs."""
    d = tempfile.mkdtemp(dir=D)
    for i, a in enumerate((x, z)):
        with open(os.path.join(d, "input_%d.pb" % i), "wb") as f:
            f.write(numpy_helper.from_array(a).SerializeToString())
    out = os.path.join(d, "out")
    r = subprocess.run([BIN, "exec", ENGINE, "--inputs", d, "--outputs", out, "--threads", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    check(r.returncode == 0, "turbine exec failed: %s" % r.stdout.decode(errors="replace"))
    res = []
    for i in range(2):
        t = onnx.TensorProto()
        with open(os.path.join(out, "output_%d.pb" % i), "rb") as f:
            t.ParseFromString(f.read())
        res.append(numpy_helper.to_array(t))
    return res


build()
S = Server(ENGINE, "--threads", "1", "--max-body", "64KiB", "--served-model-name", "mlp",
           log=os.path.join(D, "serve.log")).start()
COUNT = {"ok": 0, "fail": 0}  # infer requests this script sent, for the metrics check


def get(path):
    st, hd, body = S.get(path)
    return st, hd, (json.loads(body) if body else None)


def infer(body, path="/v2/models/mlp/infer", headers=None, expect=200):
    st, hd, data = S.post(path, body, headers=headers)
    if path.startswith("/v2/models/mlp/") and path.endswith("/infer"):
        COUNT["ok" if st == 200 else "fail"] += 1
    check(st == expect, "POST %s -> %s (expected %s): %r" % (path, st, expect, data[:400]))
    return st, hd, data


def tensor_json(name, a, nested=False):
    dt = {np.float32: "FP32", np.bool_: "BOOL", np.int64: "INT64"}[a.dtype.type]
    return {"name": name, "shape": list(a.shape), "datatype": dt, "data": a.tolist() if nested else a.ravel().tolist()}


def inputs(n):
    return rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)


def outputs_of(resp):
    return {o["name"]: o for o in resp["outputs"]}


def check_json_outputs(resp, x, z, exact=True):
    y_ref, pos_ref = reference(x, z)
    o = outputs_of(resp)
    check(set(o) == {"y", "pos"}, "outputs %s" % list(o))
    y = np.array(o["y"]["data"], np.float32).reshape(o["y"]["shape"])
    pos = np.array(o["pos"]["data"], bool).reshape(o["pos"]["shape"])
    check(o["y"]["datatype"] == "FP32" and o["pos"]["datatype"] == "BOOL", "datatypes %s" % o)
    check(list(y.shape) == [x.shape[0], 3], "y shape %s" % (y.shape,))
    check(np.allclose(y, y_ref, rtol=1e-5, atol=1e-5), "y differs from numpy: %s vs %s" % (y, y_ref))
    if exact:
        ye, pe = exec_engine(x, z)
        check(np.array_equal(y.view(np.uint32), ye.view(np.uint32)), "y differs from turbine exec: %s vs %s" % (y, ye))
        check(np.array_equal(pos, pe), "pos differs from turbine exec")
    # pos is y > 0 on the engine's own y
    check(np.array_equal(pos, y > 0), "pos is not y > 0")


def test_health():
    for p in ("/v2/health/live", "/v2/health/ready"):
        st, _, j = get(p)
        check(st == 200, "%s -> %s" % (p, st))
    st, _, _ = S.get("/health")
    check(st == 200, "/health -> %s" % st)
    st, _, _ = S.post("/v2/health/live", {})
    check(st == 405, "POST /v2/health/live -> %s" % st)
    ok("health live and ready")


def test_server_metadata():
    st, _, j = get("/v2")
    check(st == 200 and j["name"] == "turbine" and "version" in j, "/v2 -> %s %s" % (st, j))
    check("binary_tensor_data" in j["extensions"], "extensions %s" % j["extensions"])
    st, _, j = get("/v2/nonsense")
    check(st == 404 and "error" in j, "/v2/nonsense -> %s %s" % (st, j))
    ok("server metadata")


def test_model_metadata():
    for p in ("/v2/models/mlp", "/v2/models/mlp/versions/1"):
        st, _, j = get(p)
        check(st == 200, "%s -> %s" % (p, st))
        check(j["name"] == "mlp" and j["versions"] == ["1"] and j["platform"] == "turbine", "metadata %s" % j)
        check(j["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                              {"name": "z", "datatype": "FP32", "shape": [-1, 3]}], "inputs %s" % j["inputs"])
        check(j["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]},
                               {"name": "pos", "datatype": "BOOL", "shape": [-1, 3]}], "outputs %s" % j["outputs"])
    for p in ("/v2/models/mlp/ready", "/v2/models/mlp/versions/1/ready"):
        st, _, j = get(p)
        check(st == 200 and j["ready"] is True, "%s -> %s %s" % (p, st, j))
    for p in ("/v2/models/other", "/v2/models/other/ready", "/v2/models/mlp/versions/2",
              "/v2/models/mlp/versions/2/ready"):
        st, _, j = get(p)
        check(st == 404 and isinstance(j.get("error"), str), "%s -> %s %s" % (p, st, j))
    ok("model metadata, readiness, 404 for an unknown model or version")


def test_infer_json():
    for n, nested in ((1, False), (3, True), (8, False)):
        x, z = inputs(n)
        _, hd, data = infer({"id": "r%d" % n, "inputs": [tensor_json("x", x, nested), tensor_json("z", z, nested)]})
        check(hd.get("content-type", "").startswith("application/json"), "content type %s" % hd)
        resp = json.loads(data)
        check(resp["model_name"] == "mlp" and resp["model_version"] == "1" and resp["id"] == "r%d" % n,
              "response head %s" % {k: resp[k] for k in resp if k != "outputs"})
        check_json_outputs(resp, x, z)
    # the versioned path, inputs listed in another order, one output asked for
    x, z = inputs(2)
    _, _, data = infer({"inputs": [tensor_json("z", z), tensor_json("x", x)], "outputs": [{"name": "y"}]},
                       path="/v2/models/mlp/versions/1/infer")
    resp = json.loads(data)
    check([o["name"] for o in resp["outputs"]] == ["y"], "outputs %s" % resp["outputs"])
    check(np.allclose(np.array(resp["outputs"][0]["data"], np.float32), reference(x, z)[0].ravel(), 1e-5, 1e-5),
          "y of the versioned path")
    ok("JSON tensors (flat and nested, batch 1, 3, 8) equal to numpy and bit-equal to turbine exec")


def binary_body(tensors, outputs=None, params=None):
    """A binary-extension body: JSON header, then each tensor's raw bytes."""
    head = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": a.nbytes}} for n, a in tensors]}
    if outputs is not None:
        head["outputs"] = outputs
    if params is not None:
        head["parameters"] = params
    h = json.dumps(head).encode()
    return h + b"".join(a.astype("<f4").tobytes() for _, a in tensors), len(h)


def split_binary(hd, data):
    hl = int(hd["inference-header-content-length"])
    head = json.loads(data[:hl])
    out, off = {}, hl
    for o in head["outputs"]:
        if "data" in o:
            out[o["name"]] = o
            continue
        size = o["parameters"]["binary_data_size"]
        dt = {"FP32": "<f4", "BOOL": "?"}[o["datatype"]]
        out[o["name"]] = np.frombuffer(data[off:off + size], dt).reshape(o["shape"])
        off += size
    check(off == len(data), "binary response: %d bytes after the header, outputs take %d" % (len(data) - hl, off - hl))
    return head, out


def test_infer_binary():
    x, z = inputs(5)
    ye, pe = exec_engine(x, z)
    body, hl = binary_body([("x", x), ("z", z)], outputs=[{"name": "y", "parameters": {"binary_data": True}},
                                                          {"name": "pos", "parameters": {"binary_data": True}}])
    _, hd, data = infer(body, headers={"Inference-Header-Content-Length": str(hl),
                                       "Content-Type": "application/octet-stream"})
    check(hd.get("content-type") == "application/octet-stream", "content type %s" % hd.get("content-type"))
    head, out = split_binary(hd, data)
    check(np.array_equal(out["y"].view(np.uint32), ye.view(np.uint32)), "binary y differs from turbine exec")
    check(np.array_equal(out["pos"], pe), "binary pos differs from turbine exec")
    # binary_data_output for all, one output back to JSON; a JSON input beside a binary one
    hdr = {"parameters": {"binary_data_output": True},
           "inputs": [{"name": "x", "shape": [5, 4], "datatype": "FP32", "parameters": {"binary_data_size": 80}},
                      tensor_json("z", z)],
           "outputs": [{"name": "pos", "parameters": {"binary_data": False}}, {"name": "y"}]}
    h = json.dumps(hdr).encode()
    _, hd, data = infer(h + x.tobytes(), headers={"Inference-Header-Content-Length": str(len(h))})
    head, out = split_binary(hd, data)
    check([o["name"] for o in head["outputs"]] == ["pos", "y"], "order %s" % head["outputs"])
    check(np.array_equal(np.array(out["pos"]["data"], bool).reshape(5, 3), pe), "pos as JSON")
    check(np.array_equal(out["y"].view(np.uint32), ye.view(np.uint32)), "y binary by binary_data_output")
    # JSON inputs, binary outputs: no header in the request, one in the response
    _, hd, data = infer({"inputs": [tensor_json("x", x), tensor_json("z", z)],
                         "parameters": {"binary_data_output": True}})
    head, out = split_binary(hd, data)
    check(np.array_equal(out["y"].view(np.uint32), ye.view(np.uint32)), "y binary from JSON inputs")
    ok("binary tensor extension (inputs, outputs, mixed with JSON) bit-equal to turbine exec")


def test_curl():
    x, z = inputs(2)
    url = "http://127.0.0.1:%d/v2/models/mlp/infer" % S.port
    body = json.dumps({"inputs": [tensor_json("x", x), tensor_json("z", z)]})
    r = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", body, url],
                       stdout=subprocess.PIPE, timeout=60)
    COUNT["ok"] += 1
    text, code = r.stdout.decode().rsplit("\n", 1)
    check(code == "200", "curl JSON -> %s %s" % (code, text[:300]))
    check_json_outputs(json.loads(text), x, z)
    raw, hl = binary_body([("x", x), ("z", z)], params={"binary_data_output": True})
    f = os.path.join(D, "req.bin")
    with open(f, "wb") as fh:
        fh.write(raw)
    out = os.path.join(D, "resp.bin")
    hdrs = os.path.join(D, "resp.headers")
    r = subprocess.run(["curl", "-sS", "-o", out, "-D", hdrs, "-w", "%{http_code}", "-H",
                        "Inference-Header-Content-Length: %d" % hl, "-H", "Content-Type: application/octet-stream",
                        "--data-binary", "@" + f, url], stdout=subprocess.PIPE, timeout=60)
    COUNT["ok"] += 1
    check(r.stdout.decode() == "200", "curl binary -> %s" % r.stdout)
    with open(hdrs) as fh:
        h = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in fh if ":" in l}
    with open(out, "rb") as fh:
        data = fh.read()
    _, o = split_binary(h, data)
    ye, _ = exec_engine(x, z)
    check(np.array_equal(o["y"].view(np.uint32), ye.view(np.uint32)), "curl binary y")
    ok("curl: JSON and binary requests")


def test_errors():
    x, z = inputs(2)
    good = [tensor_json("x", x), tensor_json("z", z)]

    def err(body, expect, word, path="/v2/models/mlp/infer", headers=None):
        _, hd, data = infer(body, path=path, headers=headers, expect=expect)
        j = json.loads(data)
        check(isinstance(j.get("error"), str) and word in j["error"], "%s: error %r lacks %r" % (expect, j, word))

    err({"inputs": [tensor_json("x", np.zeros((2, 5), np.float32)), good[1]]}, 400, "shape")       # wrong shape
    err({"inputs": [tensor_json("x", np.zeros((9, 4), np.float32)), good[1]]}, 400, "shape")       # beyond the profile
    err({"inputs": [tensor_json("x", np.zeros((2, 4), np.int64)), good[1]]}, 400, "datatype")      # wrong datatype
    err({"inputs": good + [tensor_json("w", x)]}, 400, "unknown input")
    err({"inputs": [good[0]]}, 400, "missing")
    err({"inputs": good, "outputs": [{"name": "q"}]}, 400, "unknown output")
    err("{not json", 400, "JSON")
    err({"inputs": [dict(good[0], data=[1, 2]), good[1]]}, 400, "values")
    # batch dims that disagree pass each input's profile; the engine refuses them
    err({"inputs": [tensor_json("x", np.zeros((2, 4), np.float32)), tensor_json("z", np.zeros((3, 3), np.float32))]},
        400, "inference failed")
    body, hl = binary_body([("x", x), ("z", z)])
    err(body, 400, "Inference-Header-Content-Length")                                               # no header
    err(body, 400, "Inference-Header-Content-Length", headers={"Inference-Header-Content-Length": "x1"})
    err(body[:-4], 400, "ends", headers={"Inference-Header-Content-Length": str(hl)})
    err(body + b"\0", 400, "after the JSON header", headers={"Inference-Header-Content-Length": str(hl)})
    err(body, 400, "exceeds", headers={"Inference-Header-Content-Length": str(len(body) + 1)})
    # 404s and 405, not counted as the model's
    for p in ("/v2/models/other/infer", "/v2/models/mlp/versions/7/infer"):
        st, _, data = S.post(p, {"inputs": good})
        check(st == 404 and "error" in json.loads(data), "%s -> %s" % (p, st))
    st, _, data = S.get("/v2/models/mlp/infer")
    check(st == 405 and "error" in json.loads(data), "GET infer -> %s" % st)
    # a body beyond --max-body (64 KiB)
    big = {"inputs": [tensor_json("x", np.zeros((8, 4), np.float32)), tensor_json("z", np.zeros((8, 3), np.float32))],
           "pad": "a" * 70000}
    err(big, 413, "exceeds")
    check(S.alive(), "the server died")
    ok("errors: 400 (shape, datatype, unknown/missing input, unknown output, malformed, binary framing), 404, 405, 413")


def test_concurrent():
    errors = []

    def worker(k):
        try:
            for i in range(6):
                n = 1 + (k + i) % 8
                x, z = inputs(n)
                st, _, data = S.post("/v2/models/mlp/infer", {"inputs": [tensor_json("x", x), tensor_json("z", z)]})
                if st != 200:
                    errors.append("status %s" % st)
                    continue
                y = np.array(outputs_of(json.loads(data))["y"]["data"], np.float32).reshape(n, 3)
                if not np.allclose(y, reference(x, z)[0], 1e-5, 1e-5):
                    errors.append("wrong y for batch %d" % n)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    COUNT["ok"] += 36
    check(not errors, "concurrent requests: %s" % errors[:5])
    ok("36 concurrent requests of batch 1..8 from 6 clients, each answered with its own outputs")


def test_metrics_and_stats():
    st, _, data = S.get("/metrics")
    check(st == 200, "/metrics -> %s" % st)
    text = data.decode()
    r = subprocess.run(["promtool", "check", "metrics"], input=data, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60) if os.path.exists("/usr/bin/promtool") else None
    if r is not None:
        check(r.returncode == 0 or promtool_only_mandated_units(r.stdout.decode()), "promtool: %s" % r.stdout.decode())
    ms = parse_metrics(text)
    succ = metric(ms, "turbine_inference_request_success_total", model="mlp", version="1")
    fail = metric(ms, "turbine_inference_request_failure_total", model="mlp", version="1")
    check(succ == COUNT["ok"], "success counter %s, requests answered %d" % (succ, COUNT["ok"]))
    check(fail == COUNT["fail"], "failure counter %s, requests refused %d" % (fail, COUNT["fail"]))
    execs = metric(ms, "turbine_inference_exec_count_total", model="mlp")
    infs = metric(ms, "turbine_inference_count_total", model="mlp")
    # the batcher may merge concurrent requests: at most one call per request,
    # and the batch-size histogram counts every call
    check(1 <= execs <= COUNT["ok"], "exec count %s for %d requests" % (execs, COUNT["ok"]))
    check(metric(ms, "turbine_inference_batch_size_count", model="mlp") == execs, "batch-size histogram count")
    check(metric(ms, "turbine_inference_batch_size_sum", model="mlp") == infs, "batch-size histogram sum")
    check(infs > execs, "inference count %s counts batch elements (> %s runs)" % (infs, execs))
    check(metric(ms, "turbine_inference_compute_duration_seconds_total", model="mlp") > 0, "compute time")
    check(metric(ms, "turbine_model_gpu_memory_bytes", model="mlp", version="1") == 0,
          "the CPU model's GPU memory gauge")
    st, _, j = get("/v2/models/mlp/stats")
    check(st == 200, "stats -> %s" % st)
    s0 = j["model_stats"][0]
    check(s0["name"] == "mlp" and s0["execution_count"] == execs and s0["inference_count"] == infs,
          "stats %s" % s0)
    check(s0["inference_stats"]["success"]["count"] == COUNT["ok"], "stats success %s" % s0["inference_stats"])
    ok("metrics (promtool-clean) and statistics count %d answered and %d refused requests" % (COUNT["ok"], COUNT["fail"]))


def test_openai_routes_on_general_engine():
    st, _, j = get("/v1/models")
    check(st == 200 and j["data"] == [], "/v1/models -> %s %s" % (st, j))
    st, _, data = S.post("/v1/completions", {"model": "mlp", "prompt": "hi"})
    check(st == 400 and b"KServe v2" in data, "/v1/completions -> %s %r" % (st, data[:200]))
    ok("OpenAI routes on a general engine: no models listed, completions refused with a pointer to v2")


def test_llm_engine():
    eng = build_stories(D)
    L = Server(eng, "--served-model-name", "stories", log=os.path.join(D, "llm.log")).start()
    try:
        for p in ("/v2/health/live", "/v2/health/ready", "/v2/models/stories/ready"):
            st, _, _ = L.get(p)
            check(st == 200, "LLM %s -> %s" % (p, st))
        st, _, data = L.get("/v2/models/stories")
        j = json.loads(data)
        check(st == 200 and j["name"] == "stories" and j["platform"] == "turbine", "LLM metadata %s" % j)
        check([i["name"] for i in j["inputs"]] == ["text_input", "max_tokens"] and
              j["outputs"][0]["name"] == "text_output", "LLM metadata tensors %s" % j)
        st, _, data = L.post("/v2/models/stories/infer", {"inputs": []})
        check(st == 400 and b"text_input" in data, "LLM v2 infer without text_input -> %s %r" % (st, data[:200]))
        st, _, data = L.post("/v1/completions", {"model": "stories", "prompt": "Once", "max_tokens": 4,
                                                 "temperature": 0})
        check(st == 200 and json.loads(data)["choices"][0]["text"] is not None, "LLM completions -> %s" % st)
        text = json.loads(data)["choices"][0]["text"]
        st, _, data = L.post("/v2/models/stories/infer", {"inputs": [
            {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["Once"]},
            {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [4]}]})
        out = json.loads(data)["outputs"][0]["data"][0] if st == 200 else data[:200]
        check(st == 200 and out == text, "LLM v2 infer -> %s %r (OpenAI greedy: %r)" % (st, out, text))
    finally:
        L.kill()
    ok("an LLM engine answers the OpenAI API and v2 infer (text_input -> text_output, the same greedy text)")


def test_not_ready_while_stopping():
    """After SIGTERM the server stops accepting connections but answers on
    open ones while it drains: readiness and infer are 503 then, liveness
    still 200."""
    T = Server(ENGINE, "--threads", "1", "--served-model-name", "mlp", "--grace", "2",
               log=os.path.join(D, "stop.log")).start()
    c = http.client.HTTPConnection("127.0.0.1", T.port, timeout=10)

    def req(method, path, body=None):
        c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()

    x, z = inputs(1)
    body = {"inputs": [tensor_json("x", x), tensor_json("z", z)]}
    try:
        check(req("GET", "/v2/health/ready")[0] == 200, "ready before SIGTERM")
        check(req("POST", "/v2/models/mlp/infer", body)[0] == 200, "infer before SIGTERM")
        T.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        st, d = req("GET", "/v2/health/ready")
        check(st == 503, "ready while stopping -> %s %r" % (st, d))
        st, d = req("GET", "/v2/models/mlp/ready")
        check(st == 503, "model ready while stopping -> %s %r" % (st, d))
        st, d = req("POST", "/v2/models/mlp/infer", body)
        check(st == 503 and "not ready" in json.loads(d)["error"], "infer while stopping -> %s %r" % (st, d))
        st, d = req("GET", "/v2/health/live")
        check(st == 200, "live while stopping -> %s" % st)
    finally:
        c.close()
        T.proc.wait(timeout=30)
    ok("503 for readiness and infer while the server drains after SIGTERM; live stays 200")


def test_api_key():
    K = Server(ENGINE, "--threads", "1", "--served-model-name", "mlp", api_key="k3y",
               log=os.path.join(D, "key.log")).start()
    try:
        x, z = inputs(1)
        body = {"inputs": [tensor_json("x", x), tensor_json("z", z)]}
        for p in ("/v2/health/live", "/v2/health/ready"):
            st, _, _ = request(K.port, "GET", p)
            check(st == 200, "%s without a key -> %s" % (p, st))
        for m, p in (("GET", "/v2"), ("GET", "/v2/models/mlp"), ("GET", "/v2/models/mlp/ready"),
                     ("POST", "/v2/models/mlp/infer")):
            st, _, d = request(K.port, m, p, body if m == "POST" else None,
                               headers={"Authorization": "Bearer wrong"})
            check(st == 401 and "error" in json.loads(d), "%s %s with a wrong key -> %s" % (m, p, st))
        st, _, d = K.post("/v2/models/mlp/infer", body)
        check(st == 200, "infer with the key -> %s %r" % (st, d[:200]))
    finally:
        K.kill()
    ok("--api-key: v2 health probes open, every other v2 route 401 without the key, 200 with it")


run_tests([
    ("health", test_health),
    ("server_metadata", test_server_metadata),
    ("model_metadata", test_model_metadata),
    ("infer_json", test_infer_json),
    ("infer_binary", test_infer_binary),
    ("curl", test_curl),
    ("errors", test_errors),
    ("concurrent", test_concurrent),
    ("metrics_and_stats", test_metrics_and_stats),
    ("openai_routes_on_general_engine", test_openai_routes_on_general_engine),
    ("llm_engine", test_llm_engine),
    ("not_ready_while_stopping", test_not_ready_while_stopping),
    ("api_key", test_api_key),
])

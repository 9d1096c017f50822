"""`turbine serve --model-repository DIR` with a real server on a loopback
port: a repository in Triton's layout holding
    mlp_engine/1/model.engine  an engine built here, config.json with dynamic batching
    mlp_onnx/2/model.onnx      built by the server at load (config's "build" shapes)
    broken/1/model.engine      not an engine
The index lists all three (broken UNAVAILABLE with its error), both good
models answer with numpy's values, and an unload while requests run lets
every accepted request finish (200) while later ones get 503; a load brings
the model back.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (BIN, Server, TestFailure, check, metric, ok, parse_metrics,  # noqa: E402
                        promtool_only_mandated_units, run_tests, workdir)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

D = workdir("v2_repo")
REPO = os.path.join(D, "repo")
rng = np.random.default_rng(5)
W = rng.standard_normal((6, 4)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)


def make_onnx(path):
    init = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])]
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def setup():
    shutil.rmtree(REPO, ignore_errors=True)
    for p in ("mlp_engine/1", "mlp_onnx/2", "broken/1"):
        os.makedirs(os.path.join(REPO, p))
    src = os.path.join(D, "lin.onnx")
    make_onnx(src)
    r = subprocess.run([BIN, "build", src, "-o", os.path.join(REPO, "mlp_engine/1/model.engine"), "--min-shapes",
                        "x:1x6", "--opt-shapes", "x:4x6", "--max-shapes", "x:8x6"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        raise TestFailure("build failed:\n" + r.stdout.decode(errors="replace"))
    with open(os.path.join(REPO, "mlp_engine/config.json"), "w") as f:
        json.dump({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 300000}}, f)
    shutil.copy(src, os.path.join(REPO, "mlp_onnx/2/model.onnx"))
    with open(os.path.join(REPO, "mlp_onnx/config.json"), "w") as f:
        json.dump({"build": {"min_shapes": "x:1x6", "opt_shapes": "x:2x6", "max_shapes": "x:4x6"}}, f)
    with open(os.path.join(REPO, "broken/1/model.engine"), "wb") as f:
        f.write(b"this is not an engine\n" * 8)


setup()
S = Server(None, "--model-repository", REPO, "--threads", "1", log=os.path.join(D, "serve.log")).start(wait_s=240)


def infer(model, x):
    b = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    st, _, data = S.post("/v2/models/%s/infer" % model, b, timeout=120)
    j = json.loads(data)
    if st != 200:
        return st, j
    return st, np.array(j["outputs"][0]["data"], np.float32).reshape(j["outputs"][0]["shape"])


def index():
    st, _, data = S.post("/v2/repository/index", {})
    check(st == 200, "POST index -> %s %r" % (st, data[:300]))
    st2, _, data2 = S.get("/v2/repository/index")
    check(st2 == 200 and json.loads(data2) == json.loads(data), "GET index differs from POST")
    return {(e["name"], e["version"]): e for e in json.loads(data)}


def test_index():
    ix = index()
    check(ix[("mlp_engine", "1")]["state"] == "READY", "mlp_engine: %s" % ix)
    check(ix[("mlp_onnx", "2")]["state"] == "READY", "mlp_onnx: %s" % ix)
    br = ix.get(("broken", "1"))
    check(br is not None and br["state"] == "UNAVAILABLE" and br["reason"], "broken: %s" % ix)
    check("broken" in S.log() and br["reason"][:30] in S.log(), "the log names the broken model's error")
    ok("index: mlp_engine/1 and mlp_onnx/2 READY, broken/1 UNAVAILABLE: %s" % br["reason"])


def test_both_answer():
    x = rng.standard_normal((3, 6)).astype(np.float32)
    ref = x @ W + B
    for m in ("mlp_engine", "mlp_onnx"):
        st, y = infer(m, x)
        check(st == 200, "%s -> %s %s" % (m, st, y))
        check(np.allclose(y, ref, rtol=1e-5, atol=1e-5), "%s differs from numpy" % m)
    st, j = infer("broken", x)
    check(st == 503 and "error" in j, "broken -> %s %s" % (st, j))
    st, _, _ = S.get("/v2/models/mlp_onnx/versions/2/ready")
    check(st == 200, "mlp_onnx v2 ready -> %s" % st)
    ok("both good models answer with numpy's values; the broken one 503")


def test_unload_load_while_serving():
    # the 300 ms batcher delay keeps requests queued while the unload comes
    x = rng.standard_normal((1, 6)).astype(np.float32)
    res = []
    lock = threading.Lock()

    def one():
        r = infer("mlp_engine", x)
        with lock:
            res.append(r[0])
    ts = [threading.Thread(target=one) for _ in range(6)]
    for t in ts:
        t.start()
    time.sleep(0.1)  # accepted and waiting in the queue
    st, _, data = S.post("/v2/repository/models/mlp_engine/unload", {})
    check(st == 200, "unload -> %s %r" % (st, data))
    for t in ts:
        t.join(60)
    check(res.count(200) == 6, "accepted requests during the unload: %s (all must finish 200)" % res)
    st, j = infer("mlp_engine", x)
    check(st == 503, "after unload -> %s %s" % (st, j))
    check(index()[("mlp_engine", "1")]["state"] == "UNAVAILABLE", "index after unload")
    st2, y = infer("mlp_onnx", x)
    check(st2 == 200, "the other model serves on: %s" % st2)
    st, _, data = S.post("/v2/repository/models/mlp_engine/load", {})
    check(st == 200, "load -> %s %r" % (st, data))
    st, y = infer("mlp_engine", x)
    check(st == 200 and np.allclose(y, x @ W + B, rtol=1e-5, atol=1e-5), "after load -> %s" % st)
    st, _, data = S.post("/v2/repository/models/broken/load", {})
    check(st == 400 and b"error" in data, "loading broken -> %s %r" % (st, data))
    st, _, data = S.post("/v2/repository/models/nosuch/load", {})
    check(st == 404, "loading an unknown model -> %s" % st)
    ok("unload while 6 requests waited: all 6 answered 200, then 503; load serves again; bad loads 400/404")


def test_metrics():
    st, _, data = S.get("/metrics")
    check(st == 200, "/metrics -> %s" % st)
    if os.path.exists("/usr/bin/promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=data, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        check(r.returncode == 0 or promtool_only_mandated_units(r.stdout.decode()), "promtool: %s" % r.stdout.decode())
    ms = parse_metrics(data.decode())
    for m, v in (("mlp_engine", "1"), ("mlp_onnx", "2")):
        n = metric(ms, "turbine_inference_batch_size_count", model=m, version=v)
        check(n >= 1, "%s: batch-size histogram count %s" % (m, n))
        check(metric(ms, "turbine_inference_pending_requests", model=m, version=v) == 0, "%s pending" % m)
    check(not any('model="broken"' in k for k in ms), "an unavailable model has no batcher series")
    ok("/metrics: both models' histograms and gauges, none for the broken one, promtool-clean but the _us lint")


run_tests([
    ("index", test_index),
    ("both_answer", test_both_answer),
    ("unload_load_while_serving", test_unload_load_while_serving),
    ("metrics", test_metrics),
])

"""The dynamic batcher behind `turbine serve`'s KServe v2 infer, with real
servers on loopback ports and concurrent http.client requests.

The model: y = relu(x W1 + b1) W2 + b2, x FP32 [N, 16] -> y FP32 [N, 8],
N in 1..16, made here with onnx.helper and built with `turbine build`.
Each server runs with batcher flags chosen so the behaviour under test is
forced by timing that does not depend on the machine's speed (long delays,
tiny queues, short timeouts), not raced.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BIN, Server, TestFailure, check, metric, ok, parse_metrics, run_tests, workdir  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

D = workdir("v2_batching")
rng = np.random.default_rng(11)
W1 = rng.standard_normal((16, 32)).astype(np.float32)
B1 = rng.standard_normal(32).astype(np.float32)
W2 = rng.standard_normal((32, 8)).astype(np.float32)
B2 = rng.standard_normal(8).astype(np.float32)
ENGINE = os.path.join(D, "mlp.engine")


def build():
    init = [numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (W2, "W2"), (B2, "B2"))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "B1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
             helper.make_node("Add", ["o0", "B2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = os.path.join(D, "mlp.onnx")
    onnx.save(m, path)
    r = subprocess.run([BIN, "build", path, "-o", ENGINE, "--min-shapes", "x:1x16", "--opt-shapes", "x:8x16",
                        "--max-shapes", "x:16x16"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        raise TestFailure("build failed:\n" + r.stdout.decode(errors="replace"))


def body(x, timeout_us=None):
    b = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
         "parameters": {"binary_data_output": False}}
    if timeout_us is not None:
        b["parameters"]["timeout"] = timeout_us
    return b


def infer(s, x, timeout_us=None):
    st, _, data = s.post("/v2/models/mlp/infer", body(x, timeout_us), timeout=120)
    j = json.loads(data)
    if st != 200:
        return st, j
    return st, np.array(j["outputs"][0]["data"], np.float32).reshape(j["outputs"][0]["shape"])


def concurrently(fns):
    res = [None] * len(fns)

    def run(i):
        try:
            res[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            res[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(180)
    for r in res:
        if isinstance(r, Exception):
            raise r
    return res


def batch_buckets(s):
    """{le: cumulative count} of the model's turbine_inference_batch_size."""
    st, _, data = s.get("/metrics")
    check(st == 200, "/metrics -> %s" % st)
    ms = parse_metrics(data.decode())
    return {le: metric(ms, "turbine_inference_batch_size_bucket", model="mlp", version="1", le=le)
            for le in ("1", "2", "4", "8", "16", "+Inf")}, ms


def test_batched_equals_unbatched():
    # 5-row requests: every call has more than 4 GEMM rows, so the CPU sgemm
    # sums each output in one order whether a request runs alone or merged
    # (docs/BATCHING.md, Exactness): equality is bit for bit.
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "16", "--max-queue-delay-us", "300000",
               log=os.path.join(D, "equal.log")).start()
    xs = [rng.standard_normal((5, 16)).astype(np.float32) for _ in range(3)]
    alone = []
    for x in xs:  # one at a time: each waits out the delay and runs alone
        st, y = infer(s, x)
        check(st == 200, "alone -> %s %s" % (st, y))
        alone.append(y)
    b0, _ = batch_buckets(s)
    merged = concurrently([lambda x=x: infer(s, x) for x in xs])
    b1, _ = batch_buckets(s)
    for (st, y), a in zip(merged, alone):
        check(st == 200, "merged -> %s %s" % (st, y))
        check(y.shape == a.shape and np.array_equal(y.view(np.uint32), a.view(np.uint32)),
              "a merged answer differs from the same request alone: max |d| %g" % float(np.max(np.abs(y - a))))
    grew = b1["16"] - b1["8"] - (b0["16"] - b0["8"])
    check(grew >= 1, "no call of 9..16 rows after 3 concurrent 5-row requests: %s -> %s" % (b0, b1))
    s.kill()
    ok("3 concurrent 5-row requests merged into a call of 10 or 15 rows, answers bit-equal to each alone")


def test_batch_sizes_and_preferred():
    # max batch 8, preferred 4, a 2 s delay: 8 one-row requests sent together
    # go as calls of 4 (the preferred size, at once) or 8 (full), never wait
    # the delay out one by one.
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "8", "--preferred-batch-size", "4",
               "--max-queue-delay-us", "2000000", log=os.path.join(D, "pref.log")).start()
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(8)]
    t0 = time.time()
    res = concurrently([lambda x=x: infer(s, x) for x in xs])
    took = time.time() - t0
    for st, y in res:
        check(st == 200, "infer -> %s %s" % (st, y))
    b, ms = batch_buckets(s)
    calls = b["+Inf"]
    above1 = b["+Inf"] - b["1"]
    four = b["4"] - b["2"]
    check(above1 >= 1, "no call of more than 1 row: %s" % b)
    check(four >= 1, "no call of 3..4 rows (preferred 4): %s" % b)
    check(metric(ms, "turbine_inference_batch_size_sum", model="mlp") == 8, "batch-size sum is the 8 rows")
    check(metric(ms, "turbine_inference_count_total", model="mlp") == 8, "inference count")
    check(metric(ms, "turbine_inference_exec_count_total", model="mlp") == calls, "exec count = histogram count")
    check(metric(ms, "turbine_inference_queue_duration_us_count", model="mlp") == 8, "queue histogram count")
    check(metric(ms, "turbine_inference_compute_duration_us_count", model="mlp") == 8, "compute histogram count")
    check(metric(ms, "turbine_inference_pending_requests", model="mlp") == 0, "nothing pending after")
    # some call may still have waited the delay (requests that arrived after
    # a preferred batch left); all 8 answered within one delay of the last
    check(took < 6, "8 requests took %.1f s with a 2 s delay" % took)
    s.kill()
    ok("8 concurrent 1-row requests ran in %d calls (%s cumulative by le), a preferred 4 among them" % (calls, b))


def test_queue_full_429():
    # one request may wait; the delay holds it in the queue, so the others
    # sent meanwhile find the queue full
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "8", "--max-queue-delay-us", "1500000",
               "--max-queue-size", "1", log=os.path.join(D, "q.log")).start()
    x = rng.standard_normal((1, 16)).astype(np.float32)
    first = threading.Thread(target=lambda: infer(s, x))
    first.start()
    time.sleep(0.3)
    res = concurrently([lambda: infer(s, x) for _ in range(6)])
    first.join(30)
    codes = [st for st, _ in res]
    check(codes.count(429) >= 1, "no 429 with a queue of 1: %s" % codes)
    for st, j in res:
        if st == 429:
            check("error" in j and "queue" in j["error"], "429 body %s" % j)
        else:
            check(st == 200, "status %s %s" % (st, j))
    s.kill()
    ok("queue of 1 held by a waiting request: %d of 6 more got 429 {\"error\": ...}" % codes.count(429))


def test_timeout_504():
    # a lone request waits the 1 s delay; its own 20 ms timeout passes first
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "8", "--max-queue-delay-us", "1000000",
               log=os.path.join(D, "t.log")).start()
    x = rng.standard_normal((2, 16)).astype(np.float32)
    st, j = infer(s, x, timeout_us=20000)
    check(st == 504 and "error" in j, "parameters.timeout 20 ms -> %s %s" % (st, j))
    st, y = infer(s, x)  # no timeout: waits the delay and runs
    check(st == 200, "without a timeout -> %s" % st)
    s.kill()
    # the server-wide default
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "8", "--max-queue-delay-us", "1000000",
               "--request-timeout-us", "20000", log=os.path.join(D, "t2.log")).start()
    st, j = infer(s, x)
    check(st == 504, "--request-timeout-us 20000 -> %s %s" % (st, j))
    s.kill()
    ok("504 {\"error\": ...} past parameters.timeout and past --request-timeout-us")


def test_model_warmup():
    # on: every batch size 1..16 runs twice at load (the CPU's default is off);
    # answers and the request counters are those of a server without it
    s = Server(ENGINE, "--threads", "1", "--max-batch-size", "16", "--model-warmup", "on",
               log=os.path.join(D, "warm.log")).start()
    x = rng.standard_normal((3, 16)).astype(np.float32)
    st, y = infer(s, x)
    check(st == 200 and y.shape == (3, 8), "infer after the warm-up -> %s" % st)
    ref = np.maximum(x @ W1 + B1, 0) @ W2 + B2
    check(np.allclose(y, ref, rtol=1e-4, atol=1e-4), "warm server's answer off by %g" % float(np.max(np.abs(y - ref))))
    m = s.metrics()
    n = metric(m, "turbine_inference_request_success_total", model="mlp")
    check(n == 1, "request counter after one request: %s (the warm-up's runs are not requests)" % n)
    s.kill()
    with open(os.path.join(D, "warm.log")) as f:
        log = f.read()
    check("max batch 16, 32 warm-up runs)" in log, "the start-up line does not report 16 sizes run twice:\n" + log)
    r = subprocess.run([BIN, "serve", ENGINE, "--port", "1", "--model-warmup", "sometimes"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = r.stdout.decode(errors="replace")
    check(r.returncode != 0 and "--model-warmup" in out, "--model-warmup sometimes -> rc %d: %s" % (r.returncode, out))
    ok("--model-warmup on: exact answers, counters untouched; a bad value refused by name")


build()
run_tests([
    ("batched_equals_unbatched", test_batched_equals_unbatched),
    ("batch_sizes_and_preferred", test_batch_sizes_and_preferred),
    ("queue_full_429", test_queue_full_429),
    ("timeout_504", test_timeout_504),
    ("model_warmup", test_model_warmup),
])

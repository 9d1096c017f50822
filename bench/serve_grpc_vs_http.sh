#!/usr/bin/env bash
# serve_grpc_vs_http.sh — one tiny model (Identity, x FP32 [N,4] -> y) served
# by one `turbine serve --threads 1` on both its HTTP port and --grpc-port,
# driven by a closed-loop Python client (one request in flight, batch 1):
# http.client on a kept-alive connection with a JSON body, and a
# python3-grpcio stub (stubs generated from src/serve/kserve_grpc.proto)
# with raw_input_contents. Per round and protocol: requests/s and the server
# process's CPU time per request (utime + stime from /proc over the round,
# divided by the requests sent). Rounds alternate HTTP and gRPC so that the
# shared machine's swings fall on both.
#
#   bench/serve_grpc_vs_http.sh [ROUNDS] [REQUESTS]   (TURBINE: the binary, default build/turbine)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TURBINE:-build/turbine}
ROUNDS=${1:-3}
N=${2:-3000}
D=$(mktemp -d /tmp/serve_grpc_vs_http.XXXXXX)
trap 'kill $SP 2>/dev/null || true; rm -rf "$D"' EXIT
/usr/bin/python3 -m grpc_tools.protoc -I src/serve --python_out="$D" --grpc_python_out="$D" src/serve/kserve_grpc.proto
/usr/bin/python3 - "$D" <<'PY'
import sys
from onnx import TensorProto, helper, save
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
save(m, sys.argv[1] + "/id.onnx")
PY
"$T" build "$D/id.onnx" -o "$D/id.engine" --min-shapes x:1x4 --opt-shapes x:1x4 --max-shapes x:8x4 >/dev/null
HP=$((20000 + RANDOM % 20000)); GP=$((HP + 1))
"$T" serve "$D/id.engine" --threads 1 --port $HP --grpc-port $GP 2>"$D/serve.log" &
SP=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HP/health" >/dev/null && break; sleep 0.1; done
/usr/bin/python3 - "$D" $HP $GP $SP "$ROUNDS" "$N" <<'PY'
import http.client, json, os, sys, time
d, hp, gp, pid, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
sys.path.insert(0, d)
import grpc, struct
import kserve_grpc_pb2 as pb, kserve_grpc_pb2_grpc as pbg
tick = os.sysconf("SC_CLK_TCK")

def cpu():
    f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
conn = http.client.HTTPConnection("127.0.0.1", hp)
def http_one():
    conn.request("POST", "/v2/models/id/infer", body, {"Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    assert r.status == 200 and b"[1,2,3,4]" in data.replace(b" ", b"").replace(b".0", b""), data

stub = pbg.GRPCInferenceServiceStub(grpc.insecure_channel("127.0.0.1:%d" % gp))
req = pb.ModelInferRequest(model_name="id")
req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
req.raw_input_contents.append(struct.pack("<4f", 1, 2, 3, 4))
def grpc_one():
    r = stub.ModelInfer(req)
    assert r.raw_output_contents[0] == req.raw_input_contents[0]

for f in (http_one, grpc_one):  # warm-up
    for _ in range(200): f()
print("| round | protocol | req/s (1 client) | server CPU / request |")
print("|---|---|---|---|")
for rd in range(1, rounds + 1):
    for name, f in (("HTTP/1.1 JSON", http_one), ("gRPC raw", grpc_one)):
        c0, t0 = cpu(), time.perf_counter()
        for _ in range(n): f()
        t1, c1 = time.perf_counter(), cpu()
        print("| %d | %s | %.0f | %.1f µs |" % (rd, name, n / (t1 - t0), (c1 - c0) / n * 1e6), flush=True)
PY

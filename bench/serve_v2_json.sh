#!/usr/bin/env bash
# serve_v2_json.sh — the server CPU time of an image-sized KServe v2 input
# sent as JSON against the same input sent binary: an Identity ONNX model on
# x FP32 [1..8, 3, 224, 224] (150,528 values), served with one engine
# thread; every response binary, so the difference between the two is the
# parsing of the JSON `data` array. Per round and per binary: the server
# process's utime + stime (/proc) over N requests sent one at a time,
# divided by N. With BASE_TURBINE set, that binary's server is measured in
# the same rounds, interleaved (A, B, A, B ...), and the ratio printed.
#
#   bench/serve_v2_json.sh [ROUNDS] [N]   (TURBINE: default build/turbine; BASE_TURBINE: optional)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TURBINE:-build/turbine}
ROUNDS=${1:-3}
N=${2:-10}
D=$(mktemp -d /tmp/serve_v2_json.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"' EXIT
/usr/bin/python3 - "$D" <<'PY'
import sys
from onnx import TensorProto, helper, save
d = sys.argv[1]
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 224, 224])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
save(m, d + "/id.onnx")
PY
"$T" build "$D/id.onnx" -o "$D/id.engine" --min-shapes x:1x3x224x224 --opt-shapes x:1x3x224x224 \
  --max-shapes x:8x3x224x224 >"$D/build.log" 2>&1
start() { # binary port -> pid
  "$1" serve "$D/id.engine" --port "$2" --threads 1 --max-body 16MiB >"$D/serve.$2.log" 2>&1 &
  local p=$!
  for _ in $(seq 100); do curl -sf "localhost:$2/v2/health/ready" >/dev/null && break; sleep 0.1; done
  echo $p
}
PA=$((20000 + RANDOM % 20000)); PB=$((PA + 1))
SA=$(start "$T" $PA); PIDS+=("$SA")
ARGS=("A:$SA:$PA")
if [ -n "${BASE_TURBINE:-}" ]; then SB=$(start "$BASE_TURBINE" $PB); PIDS+=("$SB"); ARGS+=("B:$SB:$PB"); fi
/usr/bin/python3 - "$ROUNDS" "$N" "${ARGS[@]}" <<'PY'
import http.client, json, os, random, struct, sys
rounds, n = int(sys.argv[1]), int(sys.argv[2])
servers = [a.split(":") for a in sys.argv[3:]]
random.seed(1)
# what numpy clients send: float32 values printed as Python floats (17 digits)
vals = [float(struct.unpack("<f", struct.pack("<f", random.gauss(0, 1)))[0]) for _ in range(3 * 224 * 224)]
shape = [1, 3, 224, 224]
body_json = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": vals}],
                        "parameters": {"binary_data_output": True}}).encode()
raw = struct.pack("<%df" % len(vals), *vals)
hdr = json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                              "parameters": {"binary_data_size": len(raw)}}],
                  "parameters": {"binary_data_output": True}}).encode()
body_bin = hdr + raw
tck = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck

def send(port, body, binary):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=300)
    h = {"Content-Type": "application/json"}
    if binary:
        h["Inference-Header-Content-Length"] = str(len(hdr))
    c.request("POST", "/v2/models/id/infer", body=body, headers=h)
    r = c.getresponse()
    out = r.read()
    assert r.status == 200, (r.status, out[:200])
    hl = int(r.getheader("Inference-Header-Content-Length"))
    c.close()
    return out[hl:]

def measure(pid, port, body, binary):
    send(port, body, binary)  # warm
    t0 = cpu(pid)
    for _ in range(n):
        out = send(port, body, binary)
    assert out == raw, "the output differs from the input"
    return (cpu(pid) - t0) / n * 1e3

print("JSON body %d bytes, binary body %d bytes, %d requests per figure" % (len(body_json), len(body_bin), n))
for r in range(rounds):
    res = {}
    for name, pid, port in servers:
        res[name] = (measure(pid, port, body_json, False), measure(pid, port, body_bin, True))
    line = "round %d (load %s):" % (r + 1, open("/proc/loadavg").read().split()[0])
    for name in res:
        line += "  %s JSON %.1f ms, binary %.2f ms CPU/request;" % (name, res[name][0], res[name][1])
    if "B" in res:
        line += "  B/A JSON %.1fx" % (res["B"][0] / res["A"][0])
    print(line, flush=True)
PY

#!/usr/bin/env bash
# serve_v2_overhead.sh — what a KServe v2 request costs the server beyond the
# engine call: an Identity-sized ONNX model (x FP32 [N,4] -> y), served with
# one engine thread and driven by `turbine bench --endpoint kserve` on the
# same machine. Per round: requests/s at 8 clients (closed loop, 5 s), the
# server's CPU time per request (utime + stime of the server process from
# /proc over the round, divided by the requests its metrics counted) beside
# its engine compute time per request (turbine_inference_compute_duration),
# and requests/s at one client.
#
#   bench/serve_v2_overhead.sh [ROUNDS]      (TURBINE: the binary, default build/turbine)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TURBINE:-build/turbine}
ROUNDS=${1:-3}
D=$(mktemp -d /tmp/serve_v2_overhead.XXXXXX)
trap 'kill $SP 2>/dev/null || true; rm -rf "$D"' EXIT
/usr/bin/python3 - "$D" <<'PY'
import json, sys
from onnx import TensorProto, helper, save
d = sys.argv[1]
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
save(m, d + "/id.onnx")
json.dump({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]},
          open(d + "/body.json", "w"))
PY
"$T" build "$D/id.onnx" -o "$D/id.engine" --min-shapes x:1x4 --opt-shapes x:1x4 --max-shapes x:8x4 >"$D/build.log" 2>&1
PORT=$((20000 + RANDOM % 20000))
"$T" serve "$D/id.engine" --port $PORT --threads 1 >"$D/serve.log" 2>&1 &
SP=$!
for _ in $(seq 50); do curl -sf "localhost:$PORT/v2/health/ready" >/dev/null && break; sleep 0.1; done
counters() {
  curl -s "localhost:$PORT/metrics" | awk '/^turbine_inference_request_success_total/{s=$2}
    /^turbine_inference_compute_duration_seconds_total/{c=$2} END{print s, c}'
}
tck=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
  t0=$(awk '{print $14 + $15}' /proc/$SP/stat); m0=$(counters)
  c8=$("$T" bench "http://127.0.0.1:$PORT" --endpoint kserve --model id --body "$D/body.json" -c 8 -d 5 2>&1 |
       awk '$1 == "c=8" && NF > 5 {print $4}' | tail -1)
  t1=$(awk '{print $14 + $15}' /proc/$SP/stat); m1=$(counters)
  c1=$("$T" bench "http://127.0.0.1:$PORT" --endpoint kserve --model id --body "$D/body.json" -c 1 -n 2000 2>&1 |
       awk '$1 == "c=1" && NF > 5 {print $4}' | tail -1)
  echo "$t0 $t1 $m0 $m1" | awk -v r="$r" -v c8="$c8" -v c1="$c1" -v tck="$tck" -v load="$(cut -d' ' -f1 /proc/loadavg)" '{
    n = $5 - $3
    printf "round %d: %s req/s at c=8, %s req/s at c=1; server CPU %.1f us/request (engine %.2f us) over %d requests; load %s\n",
           r, c8, c1, ($2 - $1) / tck * 1e6 / n, ($6 - $4) * 1e6 / n, n, load }'
done

#!/usr/bin/python3
"""A tiny KServe v2 (Open Inference Protocol) server for test_bench_kserve.sh.

One model, "tiny", version "1": inputs x FP32 [-1, 4] and ids INT32 [-1, 2];
outputs y FP32 [b, 4] (2 * x) and n INT64 [b] (the sum of each row of ids).
It answers GET /v2/models/tiny (metadata), POST /v2/models/tiny/infer with
JSON tensors or the binary tensor extension (Inference-Header-Content-Length,
binary_data_size; binary outputs when asked), checks every shape, datatype
and size (400 otherwise), and exports /metrics with the turbine_inference_*
series a Turbine server exports: each request is one execution of batch b
(dim 0 of x), queued a fixed 300 us and computed 2 ms, so the load tester's
figures are known exactly. Counters start non-zero (the bench reports
deltas), and another model's series sit beside them.

GET /fake/stats gives what it served: {"json": N, "binary": N, "bad": N}.
Options: --reject-every K (every K-th infer is a 429), --bad-output (the
binary outputs one byte short), --no-metrics, --port-file, --lifetime S.
"""
import argparse
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BATCH_LE = [1, 2, 4, 8, 16, 32]
QUEUE_LE = [100, 500, 1000, 5000]
COMPUTE_LE = [1000, 5000, 10000]
META = {
    "name": "tiny", "versions": ["1"], "platform": "turbine_fake",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
               {"name": "ids", "datatype": "INT32", "shape": [-1, 2]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]},
                {"name": "n", "datatype": "INT64", "shape": [-1]}],
}
SIZES = {"FP32": 4, "INT32": 4, "INT64": 8}


class Hist:
    def __init__(self, les):
        self.les, self.counts, self.sum, self.count = les, [0] * (len(les) + 1), 0.0, 0

    def observe(self, v, n=1):
        i = next((k for k, le in enumerate(self.les) if v <= le), len(self.les))
        self.counts[i] += n
        self.sum += v * n
        self.count += n

    def lines(self, name, labels):
        out, cum = [], 0
        for le, c in zip(self.les + ["+Inf"], self.counts):
            cum += c
            out.append('%s_bucket{%s,le="%s"} %d' % (name, labels, le, cum))
        out.append("%s_sum{%s} %g" % (name, labels, self.sum))
        out.append("%s_count{%s} %d" % (name, labels, self.count))
        return out


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.batch, self.queue, self.compute = Hist(BATCH_LE), Hist(QUEUE_LE), Hist(COMPUTE_LE)
        # earlier traffic: the bench must report the difference, not these
        self.batch.observe(8, 5)
        self.queue.observe(4000, 5)
        self.compute.observe(9000, 5)
        self.success, self.failure, self.inferences, self.executions = 5, 2, 40, 5
        self.infers = 0
        self.stats = {"json": 0, "binary": 0, "bad": 0}


ST = State()
ARGS = None


def metrics_text():
    lab = 'model="tiny",version="1"'
    with ST.lock:
        lines = ["# HELP turbine_inference_batch_size requests per engine call",
                 "# TYPE turbine_inference_batch_size histogram"]
        lines += ST.batch.lines("turbine_inference_batch_size", lab)
        lines += ["# TYPE turbine_inference_queue_duration_us histogram"]
        lines += ST.queue.lines("turbine_inference_queue_duration_us", lab)
        lines += ST.compute.lines("turbine_inference_compute_duration_us", lab)
        lines += ["turbine_inference_request_success_total{%s} %d" % (lab, ST.success),
                  'turbine_inference_request_failure_total{%s,reason="rejected"} %d' % (lab, ST.failure),
                  "turbine_inference_count_total{%s} %d" % (lab, ST.inferences),
                  "turbine_inference_exec_count_total{%s} %d" % (lab, ST.executions)]
    other = Hist(BATCH_LE)
    other.observe(32, 1000)
    lines += other.lines("turbine_inference_batch_size", 'model="other",version="3"')
    lines += ["turbine_requests_running 0", "process_cpu_seconds_total 1.5"]
    return "\n".join(lines) + "\n"


class BadRequest(Exception):
    pass


def decode(tensor, raw):
    """The values of one input (a flat list) from JSON data or raw bytes."""
    dt, shape = tensor.get("datatype"), tensor.get("shape")
    spec = {i["name"]: i for i in META["inputs"]}.get(tensor.get("name"))
    if spec is None:
        raise BadRequest("unknown input %r" % tensor.get("name"))
    if dt != spec["datatype"]:
        raise BadRequest("input %s: datatype %s, expected %s" % (spec["name"], dt, spec["datatype"]))
    if not isinstance(shape, list) or len(shape) != 2 or shape[1] != spec["shape"][1] or shape[0] < 1:
        raise BadRequest("input %s: shape %r, expected %r" % (spec["name"], shape, spec["shape"]))
    n = shape[0] * shape[1]
    if raw is not None:
        if len(raw) != n * SIZES[dt]:
            raise BadRequest("input %s: %d bytes for %d elements" % (spec["name"], len(raw), n))
        return list(struct.unpack("<%d%s" % (n, "f" if dt == "FP32" else "i"), raw)), shape
    data = tensor.get("data")
    if not isinstance(data, list) or len(data) != n:
        raise BadRequest("input %s: %s values for shape %r" % (spec["name"], len(data) if isinstance(data, list) else "no", shape))
    return data, shape


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body, headers=()):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-type" for k, _ in headers):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        p = self.path
        if p == "/metrics" and not ARGS.no_metrics:
            self.reply(200, metrics_text(), [("Content-Type", "text/plain; version=0.0.4")])
        elif p in ("/v2/models/tiny", "/v2/models/tiny/versions/1"):
            self.reply(200, META)
        elif p == "/v2/health/ready":
            self.reply(200, b"")
        elif p == "/fake/stats":
            with ST.lock:
                self.reply(200, dict(ST.stats))
        else:
            self.reply(404, {"error": "not found: " + p})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        if self.path not in ("/v2/models/tiny/infer", "/v2/models/tiny/versions/1/infer"):
            self.reply(404, {"error": "unknown model"})
            return
        with ST.lock:
            ST.infers += 1
            k = ST.infers
        if ARGS.reject_every and k % ARGS.reject_every == 0:
            with ST.lock:
                ST.failure += 1
            self.reply(429, {"error": "queue full"})
            return
        try:
            out, binary = self.infer(body)
        except (BadRequest, ValueError, KeyError, struct.error) as e:
            with ST.lock:
                ST.stats["bad"] += 1
                ST.failure += 1
            self.reply(400, {"error": str(e)})
            return
        head, tail = out
        headers = []
        if tail is not None:
            headers = [("Inference-Header-Content-Length", str(len(head))),
                       ("Content-Type", "application/octet-stream")]
            self.reply(200, head + tail, headers)
        else:
            self.reply(200, head)

    def infer(self, body):
        hl = self.headers.get("Inference-Header-Content-Length")
        binary = hl is not None
        header = json.loads(body[:int(hl)] if binary else body)
        raw_at = int(hl) if binary else 0
        values, b = {}, None
        for t in header.get("inputs", []):
            raw = None
            size = (t.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if not binary:
                    raise BadRequest("binary_data_size without Inference-Header-Content-Length")
                raw = body[raw_at:raw_at + size]
                raw_at += size
            values[t["name"]], shape = decode(t, raw)
            if b is not None and shape[0] != b:
                raise BadRequest("inputs disagree on dim 0")
            b = shape[0]
        if set(values) != {"x", "ids"}:
            raise BadRequest("inputs %s, expected x and ids" % sorted(values))
        if binary and raw_at != len(body):
            raise BadRequest("%d bytes after the tensors" % (len(body) - raw_at))
        y = [2 * v for v in values["x"]]
        ids = values["ids"]
        nn = [ids[2 * i] + ids[2 * i + 1] for i in range(b)]
        want_bin = bool((header.get("parameters") or {}).get("binary_data_output"))
        for o in header.get("outputs") or []:
            if o.get("name") not in ("y", "n"):
                raise BadRequest("unknown output %r" % o.get("name"))
            if (o.get("parameters") or {}).get("binary_data"):
                want_bin = True
        with ST.lock:
            ST.stats["binary" if binary else "json"] += 1
            ST.success += 1
            ST.inferences += b
            ST.executions += 1
            ST.batch.observe(b)
            ST.queue.observe(300)
            ST.compute.observe(2000)
        outs = [{"name": "y", "datatype": "FP32", "shape": [b, 4]},
                {"name": "n", "datatype": "INT64", "shape": [b]}]
        resp = {"model_name": "tiny", "model_version": "1", "outputs": outs}
        if not want_bin:
            outs[0]["data"], outs[1]["data"] = y, nn
            return (json.dumps(resp).encode(), None), binary
        yb, nb = struct.pack("<%df" % len(y), *y), struct.pack("<%dq" % len(nn), *nn)
        if ARGS.bad_output:
            nb = nb[:-1]
        outs[0]["parameters"] = {"binary_data_size": len(yb)}
        outs[1]["parameters"] = {"binary_data_size": len(nb) + (1 if ARGS.bad_output else 0)}
        return (json.dumps(resp).encode(), yb + nb), binary


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client closing its connection is no error here


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--lifetime", type=float, default=300)
    ap.add_argument("--reject-every", type=int, default=0)
    ap.add_argument("--bad-output", action="store_true")
    ap.add_argument("--no-metrics", action="store_true")
    ARGS = ap.parse_args()
    srv = Server(("127.0.0.1", ARGS.port), Handler)
    if ARGS.port_file:
        with open(ARGS.port_file + ".tmp", "w") as f:
            f.write(str(srv.server_address[1]))
        import os
        os.replace(ARGS.port_file + ".tmp", ARGS.port_file)
    threading.Timer(ARGS.lifetime, srv.shutdown).start()
    srv.serve_forever()


if __name__ == "__main__":
    main()

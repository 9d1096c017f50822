#!/usr/bin/python3
"""A scripted OpenAI-compatible server for testing `turbine bench`.

Listens on 127.0.0.1 with an ephemeral port, written to --port-file. Each
completion streams max_tokens chunks: the first after TTFT, the rest ITL apart
(defaults from the command line; a prompt containing `ttft=N` / `itl=N`
overrides them for that request, in ms). A prompt containing `fail=KIND`
fails that request: http500, http400 (a 400 with a scripted message: the
load tester must show it), malformed (a broken SSE event), close (drop the
connection with no response), hang (sleep --hang-ms before answering). A
prompt containing `nul=1` makes every token's text the byte 0x00, sent as
"\u0000" (valid JSON).
--log FILE: one JSON line per completion request with what the server did,
in time.monotonic() seconds (the clock the load tester's CLOCK_MONOTONIC
reads too): "arrival" (the request read), "sends" (taken just before each
token chunk was written), "dues" (when each was scripted to go), "end" (just
before the last bytes were written), so a test can compare the load
tester's figures with what was actually sent, and the lateness sends - dues
measures the scheduling jitter of the machine during the same run.
--stall-at S --stall-ms M: S seconds after the first request, every request
in progress or arriving waits until the stall is over (a frozen server).
The process exits by itself after --lifetime seconds.
"""
import argparse
import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
STATE = {"first": None, "running": 0, "served": 0}
LOCK = threading.Lock()
LOG = None


def log_request(rec):
    if LOG is None:
        return
    line = json.dumps(rec) + "\n"
    with LOCK:
        LOG.write(line)
        LOG.flush()


def chunk_bytes(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def stall_wait():
    if ARGS.stall_ms <= 0 or STATE["first"] is None:
        return
    start = STATE["first"] + ARGS.stall_at
    end = start + ARGS.stall_ms / 1000.0
    now = time.monotonic()
    if start <= now < end:
        time.sleep(end - now)


def sleep_ms(ms):
    if ms > 0:
        time.sleep(ms / 1000.0)
    stall_wait()


def prompt_of(req):
    if "messages" in req:
        return " ".join(str(m.get("content", "")) for m in req["messages"])
    p = req.get("prompt", "")
    return p if isinstance(p, str) else json.dumps(p)


def directive(prompt, key, default):
    m = re.search(r"\b%s=(\w+)" % key, prompt)
    if not m:
        return default
    v = m.group(1)
    return float(v) if re.fullmatch(r"[0-9.]+", v) else v


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *a):
        pass

    def send_plain(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_plain(200, json.dumps({"object": "list", "data": [
                {"id": ARGS.model, "object": "model", "owned_by": "fake"}]}))
        elif self.path == "/health":
            self.send_plain(200, "ok", "text/plain")
        elif self.path == "/metrics":
            with LOCK:
                running = STATE["running"]
            text = ("# TYPE vllm:num_requests_running gauge\n"
                    'vllm:num_requests_running{model_name="%s"} %d\n'
                    'vllm:num_requests_waiting{model_name="%s"} 0\n'
                    'vllm:gpu_cache_usage_perc{model_name="%s"} %.3f\n'
                    % (ARGS.model, running, ARGS.model, ARGS.model, min(1.0, running / 64.0)))
            self.send_plain(200, text, "text/plain; version=0.0.4")
        else:
            self.send_plain(404, json.dumps({"error": {"message": "not found"}}))

    def chunk(self, data):
        self.wfile.write(chunk_bytes(data))

    def do_POST(self):
        self.t_arrival = time.monotonic()
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n) if n else b""
        with LOCK:
            if STATE["first"] is None:
                STATE["first"] = time.monotonic()
            STATE["running"] += 1
            STATE["served"] += 1
        try:
            self.serve_post(raw)
        finally:
            with LOCK:
                STATE["running"] -= 1

    def serve_post(self, raw):
        if self.path.startswith("/v2/models/") and self.path.endswith("/infer"):
            sleep_ms(ARGS.ttft)
            self.send_plain(200, json.dumps({"model_name": ARGS.model, "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [1], "data": [1.0]}]}))
            return
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_plain(404, json.dumps({"error": {"message": "not found"}}))
            return
        try:
            req = json.loads(raw)
        except ValueError:
            self.send_plain(400, json.dumps({"error": {"message": "bad json"}}))
            return
        prompt = prompt_of(req)
        ttft = directive(prompt, "ttft", ARGS.ttft)
        itl = directive(prompt, "itl", ARGS.itl)
        fail = directive(prompt, "fail", "")
        ntok = int(req.get("max_tokens", 16))
        if fail == "http500":
            self.send_plain(500, json.dumps({"error": {"message": "scripted failure"}}))
            return
        if fail == "http400":
            self.send_plain(400, json.dumps({"error": {
                "message": "scripted 400: the fake server rejects this prompt \u2013 reason #%d" % ntok,
                "type": "BadRequestError", "param": None, "code": 400}}))
            return
        if fail == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fail == "hang":
            time.sleep(ARGS.hang_ms / 1000.0)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        nul = directive(prompt, "nul", 0) == 1
        rec = {"path": self.path, "stream": bool(req.get("stream")), "max_tokens": ntok,
               "arrival": self.t_arrival, "sends": [], "dues": []}

        def tok(i):
            return "\x00" if nul else " tok%d" % i

        def event(i, final=False):
            if chat:
                choice = {"index": 0, "delta": {"content": tok(i)} if not final else {},
                          "finish_reason": "length" if final else None}
            else:
                choice = {"index": 0, "text": tok(i) if not final else "",
                          "finish_reason": "length" if final else None}
            return {"id": "cmpl-fake", "object": obj, "created": created,
                    "model": ARGS.model, "choices": [choice]}

        if not req.get("stream"):
            d = self.t_arrival + (ttft + itl * max(0, ntok - 1)) / 1000.0 - time.monotonic()
            sleep_ms(d * 1000.0)
            text = "".join(tok(i) for i in range(ntok))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            body = json.dumps({
                "id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": ARGS.model, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": ntok,
                          "total_tokens": len(prompt.split()) + ntok}})
            rec["dues"].append(self.t_arrival + (ttft + itl * max(0, ntok - 1)) / 1000.0)
            rec["end"] = time.monotonic()
            rec["sends"].append(rec["end"])
            self.send_plain(200, body)
            log_request(rec)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        rec["head"] = time.monotonic()  # the response's first byte
        self.end_headers()
        if chat:
            first = {"id": "cmpl-fake", "object": obj, "created": created, "model": ARGS.model,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "finish_reason": None}]}
            self.chunk(b"data: " + json.dumps(first).encode() + b"\n\n")
        t0 = self.t_arrival
        for i in range(ntok):
            # sleep to the scripted absolute time so errors do not accumulate
            due = t0 + (ttft + itl * i) / 1000.0
            d = due - time.monotonic()
            if d > 0:
                time.sleep(d)
            stall_wait()
            if fail == "malformed" and i == 1:
                self.chunk(b"data: {\"choices\": [{\"text\": \"oops\"\n\n")
                continue
            data = b"data: " + json.dumps(event(i)).encode() + b"\n\n"
            rec["dues"].append(due)
            rec["sends"].append(time.monotonic())
            self.chunk(data)
        last = event(ntok, final=True)
        self.chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
        if (req.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "cmpl-fake", "object": obj, "created": created, "model": ARGS.model,
                     "choices": [], "usage": {"prompt_tokens": len(prompt.split()),
                                              "completion_tokens": ntok,
                                              "total_tokens": len(prompt.split()) + ntok}}
            self.chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
        rec["end"] = time.monotonic()
        self.wfile.write(chunk_bytes(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        log_request(rec)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096

    def handle_error(self, request, client_address):
        pass  # clients that hang up (timeouts, scripted failures) are expected


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--ttft", type=float, default=50.0)
    ap.add_argument("--itl", type=float, default=10.0)
    ap.add_argument("--hang-ms", type=float, default=3000.0)
    ap.add_argument("--stall-at", type=float, default=1.0)
    ap.add_argument("--stall-ms", type=float, default=0.0)
    ap.add_argument("--lifetime", type=float, default=300.0)
    ap.add_argument("--log", default="")
    ARGS = ap.parse_args()
    global LOG
    if ARGS.log:
        LOG = open(ARGS.log, "a")
    srv = Server(("127.0.0.1", 0), Handler)
    with open(ARGS.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.replace(ARGS.port_file + ".tmp", ARGS.port_file)
    threading.Timer(ARGS.lifetime, srv.shutdown).start()
    srv.serve_forever(poll_interval=0.2)
    sys.exit(0)


if __name__ == "__main__":
    main()

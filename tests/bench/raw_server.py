#!/usr/bin/python3
"""Canned raw HTTP/1.1 responses for testing the load tester's HTTP clients.

Listens on 127.0.0.1 with an ephemeral port, written to --port-file; exits
after --lifetime seconds. Keeps connections alive and answers each request by
its path, writing the bytes in pieces (short pauses between them) so the
client sees responses split at awkward places:

  /cl          200, Content-Length
  /chunked     200, chunked with extensions and a trailer, split mid-line
  /close       200, no length: the body ends with the connection
  /http10      HTTP/1.0 200 with a length, then the connection closes
  /continue    100 Continue, then 200
  /status404   404 with a body
  /nothing     closes the connection without answering
  /partial     Content-Length 100, 10 bytes, close
  /badchunk    a chunk size that is not hex
  /weird       not HTTP at all
  /bigheader   a 200 KB header
  /slow        answers after 3 s
  /idleclose   200 (keep-alive), then closes the idle connection
  POST /v1/completions   an OpenAI SSE stream of 6 tokens, 20 ms apart,
               chunked with chunk boundaries inside events and lines
  GET /v1/models         one model
--log FILE: for each SSE stream one JSON line {"sends": [...]}, the
time.monotonic() just before each token event's first byte was written, so a
test compares the clients' inter-token gaps with the gaps actually sent.
"""
import argparse
import json
import socket
import threading
import time

LOG = None
LOG_LOCK = threading.Lock()


def pieces(data, cuts):
    out, last = [], 0
    for c in cuts:
        if last < c < len(data):
            out.append(data[last:c])
            last = c
    out.append(data[last:])
    return out


def send_split(conn, data, cuts, pause=0.002):
    for i, p in enumerate(pieces(data, cuts)):
        if i:
            time.sleep(pause)
        conn.sendall(p)


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_body():
    evs = []
    for i in range(6):
        evs.append(b"data: " + json.dumps({"choices": [{"index": 0, "text": " t%d" % i}]}).encode() + b"\n\n")
    evs.append(b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}).encode()
               + b"\n\n")
    evs.append(b"data: [DONE]\n\n")
    return evs


def handle(conn):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            d = conn.recv(65536)
            if not d:
                return
            buf += d
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        n = 0
        for l in lines[1:]:
            k, _, v = l.partition(":")
            if k.strip().lower() == "content-length":
                n = int(v)
        while len(buf) < n:
            d = conn.recv(65536)
            if not d:
                return
            buf += d
        buf = buf[n:]
        if path == "/v1/models":
            b = json.dumps({"data": [{"id": "raw-model"}]}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
        elif path == "/v1/completions":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            sends = []
            for i, ev in enumerate(sse_body()):
                time.sleep(0.02)
                if i < 6:
                    sends.append(time.monotonic())
                # one event over two chunks, the cut inside the JSON, each chunk split mid size line
                half = len(ev) // 2
                data = chunk(ev[:half]) + chunk(ev[half:])
                send_split(conn, data, [1, 3 + half // 3, len(chunk(ev[:half])) + 1], pause=0)
            conn.sendall(b"0\r\n\r\n")
            if LOG is not None:
                with LOG_LOCK:
                    LOG.write(json.dumps({"sends": sends}) + "\n")
                    LOG.flush()
        elif path == "/cl":
            send_split(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok", [5, 17, 40])
        elif path == "/chunked":
            data = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"5;ext=1\r\nhello\r\n"
                    + b"6\r\n world\r\n" + b"0\r\nX-Trailer: yes\r\n\r\n")
            send_split(conn, data, [20, 46, 50, 55, 62, 70, 80])
        elif path == "/close":
            send_split(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome body", [30])
            conn.close()
            return
        elif path == "/http10":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
            conn.close()
            return
        elif path == "/continue":
            send_split(conn, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", [25])
        elif path == "/status404":
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
        elif path == "/nothing":
            conn.close()
            return
        elif path == "/partial":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            time.sleep(0.01)
            conn.close()
            return
        elif path == "/badchunk":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
            time.sleep(0.01)
            conn.close()
            return
        elif path == "/weird":
            conn.sendall(b"garbage garbage garbage\r\n\r\n")
            time.sleep(0.01)
            conn.close()
            return
        elif path == "/bigheader":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200000 + b"\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.01)
            conn.close()
            return
        elif path == "/slow":
            time.sleep(3)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif path == "/idleclose":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.005)
            conn.close()
            return
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


def serve(conn):
    try:
        handle(conn)
    except OSError:
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--lifetime", type=float, default=120.0)
    ap.add_argument("--log", default="")
    a = ap.parse_args()
    global LOG
    if a.log:
        LOG = open(a.log, "a")
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    ls.settimeout(0.2)
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    import os
    os.replace(a.port_file + ".tmp", a.port_file)
    end = time.monotonic() + a.lifetime
    while time.monotonic() < end:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(c,), daemon=True).start()


if __name__ == "__main__":
    main()

"""Helpers for the `turbine serve` integration tests (Python stdlib only).

Environment (set by ctest): TURBINE_BIN, TURBINE_SHARED, TURBINE_TMP.
Every wait is bounded; every server started here is killed at exit.
"""
import atexit
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

BIN = os.environ.get("TURBINE_BIN", "")
SHARED = os.environ.get("TURBINE_SHARED", "")
TMP = os.environ.get("TURBINE_TMP", "/tmp")
SRC = os.environ.get("TURBINE_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STORIES = os.path.join(SHARED, "models", "stories260K")

_servers = []
PR_SET_PDEATHSIG = 1

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # this script ends with the shell that ran it
except (OSError, AttributeError):
    _libc = None


def _die_with_parent():
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class TestFailure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def ok(msg):
    print("ok: " + msg, flush=True)


def workdir(name):
    d = os.path.join(TMP, "serve_" + name)
    os.makedirs(d, exist_ok=True)
    return d


def build_stories(d, max_batch=16):
    """Builds the stories260K engine into d and returns its path."""
    out = os.path.join(d, "s.engine")
    r = subprocess.run([BIN, "build", os.path.join(STORIES, "stories260K.bin"), "--tokenizer",
                        os.path.join(STORIES, "tok512.bin"), "-o", out, "--max-batch", str(max_batch)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0:
        raise TestFailure("engine build failed:\n" + r.stdout.decode(errors="replace"))
    return out


def build_slow(d, max_batch=8):
    """A random-weight llama (10M parameters: hidden 384, 6 layers, vocab 512,
    context 512): about 3 ms a token on one thread, so that a request of some
    hundred tokens lasts long enough to be cancelled or drained. Its text is
    noise. Serve it with --threads 1 for steady timing."""
    out = os.path.join(d, "slow.engine")
    ck = os.path.join(d, "slow_ckpt")
    sys.path.insert(0, os.path.join(SRC, "tests"))
    import gen_checkpoints as gc
    gc.PRESETS["serve-slow"] = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                                    num_attention_heads=6, num_key_value_heads=6,
                                    max_position_embeddings=512)
    gc.generate("serve-slow", "f32", ck, seed=1)
    r = subprocess.run([BIN, "build", ck, "--tokenizer", os.path.join(STORIES, "tok512.bin"), "-o", out,
                        "--max-batch", str(max_batch)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0:
        raise TestFailure("engine build failed:\n" + r.stdout.decode(errors="replace"))
    shutil.rmtree(ck, ignore_errors=True)
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """A `turbine serve` process on 127.0.0.1 with a free port."""

    def __init__(self, engine, *args, log=None, api_key=None):
        self.engine = engine
        self.args = [str(a) for a in args]
        self.api_key = api_key
        self.log_path = log or (engine + ".serve.log")
        self.proc = None
        self.port = None

    def start(self, wait_s=30):
        last = ""
        for _attempt in range(5):  # a port taken between probe and bind: retry with another
            self.port = free_port()
            cmd = [BIN, "serve"] + ([self.engine] if self.engine else []) + ["--port", str(self.port)] + self.args
            if self.api_key:
                cmd += ["--api-key", self.api_key]
            self.logf = open(self.log_path, "ab")
            self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
            _servers.append(self)
            deadline = time.time() + wait_s
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    st, _, _ = request(self.port, "GET", "/health", timeout=2)
                    if st == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill()
                raise TestFailure("server did not become healthy within %d s; log:\n%s" % (wait_s, self.log()))
            last = self.log()
            if "cannot listen" not in last:
                break
        raise TestFailure("server exited during start (rc %s); log:\n%s" % (self.proc.returncode, last))

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    def post(self, path, body, timeout=60, headers=None):
        h = self.headers()
        h.update(headers or {})
        return request(self.port, "POST", path, body, headers=h, timeout=timeout)

    def get(self, path, timeout=30):
        return request(self.port, "GET", path, headers=self.headers(), timeout=timeout)

    def completion(self, body, timeout=60):
        st, hd, data = self.post("/v1/completions", body, timeout=timeout)
        check(st == 200, "POST /v1/completions %s -> %s %r" % (short(body), st, data[:300]))
        return json.loads(data)

    def chat(self, body, timeout=60):
        st, hd, data = self.post("/v1/chat/completions", body, timeout=timeout)
        check(st == 200, "POST /v1/chat/completions %s -> %s %r" % (short(body), st, data[:300]))
        return json.loads(data)

    def stream(self, path, body, timeout=60):
        return stream(self.port, path, body, headers=self.headers(), timeout=timeout)

    def metrics(self):
        st, _, data = self.get("/metrics")
        check(st == 200, "GET /metrics -> %s" % st)
        return parse_metrics(data.decode())


def _cleanup():
    for s in _servers:
        s.kill()


atexit.register(_cleanup)


def _on_term(sig, frame):
    _cleanup()
    sys.exit(128 + sig)


signal.signal(signal.SIGTERM, _on_term)
signal.signal(signal.SIGINT, _on_term)


def short(body):
    s = json.dumps(body) if not isinstance(body, (bytes, str)) else str(body)
    return s if len(s) < 200 else s[:200] + "..."


def request(port, method, path, body=None, headers=None, timeout=30):
    """One request on a fresh connection; returns (status, headers dict (lower-case), body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def stream(port, path, body, headers=None, timeout=60):
    """A streaming request; returns (status, headers, [payload strings of `data:` lines]).
    Checks the SSE framing: every event is `data: ...` followed by a blank line."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = dict(headers or {})
        h["Content-Type"] = "application/json"
        c.request("POST", path, body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        hd = {k.lower(): v for k, v in r.getheaders()}
        raw = r.read().decode()
        if r.status != 200:
            return r.status, hd, raw
        return r.status, hd, sse_events(raw)
    finally:
        c.close()


def sse_events(raw):
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = [l for l in block.split("\n") if not l.startswith(":")]  # comments: keep-alives
        if not lines:
            continue
        check(len(lines) == 1 and lines[0].startswith("data: "), "bad SSE event %r" % block[:200])
        events.append(lines[0][len("data: "):])
    check(raw.endswith("\n\n"), "the stream does not end with a blank line: %r" % raw[-100:])
    return events


_metric_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_metrics(text):
    """{'name{labels}': value, 'name': sum over label sets}"""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _metric_re.match(line)
        check(m is not None, "unparseable metrics line %r" % line)
        name, labels, val = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = val
        out[name] = out.get(name, 0.0) + val if labels else val
    return out


def metric(ms, name, **labels):
    """The value of the series of `name` whose labels include `labels`."""
    for k, v in ms.items():
        if k == name and not labels:
            return v
        if k.startswith(name + "{") and all('%s="%s"' % (a, b) in k for a, b in labels.items()):
            return v
    raise TestFailure("metric %s%s not found" % (name, labels))


def wait_until(fn, timeout_s, step=0.05):
    """Polls fn() until it returns a truthy value or timeout_s passes; returns the last value."""
    deadline = time.time() + timeout_s
    v = fn()
    while not v and time.time() < deadline:
        time.sleep(step)
        v = fn()
    return v


def run_tests(tests):
    """Runs [(name, fn)] in order; prints ok/FAIL for each; exits 1 when any failed."""
    failed = []
    t0 = time.time()
    for name, fn in tests:
        t = time.time()
        try:
            fn()
            print("PASS %s (%.1f s)" % (name, time.time() - t), flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            failed.append(name)
            kind = "" if isinstance(e, TestFailure) else type(e).__name__ + ": "
            print("FAIL %s: %s%s" % (name, kind, e), flush=True)
    print("%d/%d passed in %.1f s" % (len(tests) - len(failed), len(tests), time.time() - t0), flush=True)
    _cleanup()
    sys.exit(1 if failed else 0)


def http_body(raw):
    """The body of a raw HTTP/1.1 response (bytes), chunked transfer coding removed."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"chunked" not in head.lower():
        return body
    out = b""
    while body:
        line, _, rest = body.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return out


# The histograms named turbine_inference_{queue,compute}_duration_us are
# what Triton users' dashboards and `turbine bench` scrape; promtool's lint
# (no switch to turn it off in Debian's 2.42) flags their "_us" suffix. That
# lint line, for those two names only, is the one complaint accepted.
MANDATED_US = ("turbine_inference_queue_duration_us", "turbine_inference_compute_duration_us")


def promtool_only_mandated_units(out):
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return bool(lines) and all(ln.split(" ")[0] in MANDATED_US and "abbreviated units" in ln for ln in lines)

#!/usr/bin/python3
"""`turbine bench` against a real `turbine serve` of the bundled demo model
(models/demo/shakespeare, a 512-token context), on loopback:

1. a plain run with the default lengths (512 in, 128 out) fits them into the
   model's max_model_len (read from /v1/models) and succeeds, saying so;
2. lengths given explicitly beyond it are kept, warned about, and the run
   fails (exit 1) with the server's own message in the report;
3. a sweep c=1,2 sends each point (and each warm-up) prompts no earlier point
   sent: the server's prefix cache reuses ~0% at both points, while the same
   sweep with --prefix-len (shared prefixes asked for) shows reuse.

Every run is bounded in requests and time; the server dies with this script.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve"))
import serve_util as su  # noqa: E402

DEMO = os.path.join(su.SRC, "models", "demo", "shakespeare")


def bench(url, *args, timeout=180):
    cmd = [su.BIN, "bench", url, "--no-progress", "--no-gpu"] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def main():
    d = su.workdir("bench")
    engine = os.path.join(d, "demo.engine")
    b = subprocess.run([su.BIN, "build", DEMO, "-o", engine], capture_output=True, text=True, timeout=300)
    su.check(b.returncode == 0, "build of the demo model failed: " + b.stderr[-2000:])
    srv = su.Server(engine, log=os.path.join(d, "serve.log")).start()
    url = "http://127.0.0.1:%d" % srv.port
    st, _, data = srv.get("/v1/models")
    models = json.loads(data)
    max_len = models["data"][0]["max_model_len"]
    su.check(st == 200 and max_len == 512, "demo /v1/models: %r" % data[:300])

    # 1. defaults fitted into the context
    out = os.path.join(d, "default.json")
    rc, so, se = bench(url, "-n", 4, "--json", out)
    su.check(rc == 0, "plain run exit %d:\n%s\n%s" % (rc, so, se))
    r = json.load(open(out))
    p = r["points"][0]
    cfg = r["config"]
    su.check(p["requests_ok"] == 4 and p["requests_failed"] == 0,
             "plain run: %d ok, %d failed: %s" % (p["requests_ok"], p["requests_failed"], p.get("first_error")))
    su.check("max_model_len is 512" in se, "no note about the fitted lengths on stderr:\n" + se)
    su.check(cfg["input_len"] < 512 and cfg["output_len"] <= 128, "config %r" % cfg)
    su.ok("plain bench against the demo: lengths fitted to max_model_len (input %d, output %d), 4 of 4 ok"
          % (cfg["input_len"], cfg["output_len"]))

    # 2. explicit lengths beyond the context: a warning, the server's message, exit 1
    st, _, data = srv.post("/v1/completions", {"model": models["data"][0]["id"], "prompt": "the " * 600,
                                               "max_tokens": 8})
    su.check(st == 400, "an over-long prompt got %d" % st)
    server_msg = json.loads(data)["error"]["message"]
    out = os.path.join(d, "long.json")
    rc, so, se = bench(url, "-n", 2, "--input-len", 600, "--output-len", 8, "--json", out)
    p = json.load(open(out))["points"][0]
    got = p["first_error_by_kind"].get("http", "")
    su.check(rc == 1, "an all-failed run exited %d" % rc)
    su.check("warning" in se and "max_model_len 512" in se, "no warning about the lengths:\n" + se)
    su.check(got.startswith("HTTP 400: ") and got[10:40] == server_msg[:30],
             "the report's message %r is not the server's %r" % (got, server_msg))
    su.check(server_msg[:30] in so, "the terminal summary lacks the server's message:\n" + so)
    su.ok("explicit lengths beyond max_model_len: warned, exit 1, server's message: %s" % got[:80])

    # 3. sweep points on fresh prompts
    def sweep(name, seed, *extra):
        # a --seed of its own: the same seed sends the same prompts again (runs
        # 1 and 2 above left theirs in the server's cache)
        out = os.path.join(d, name + ".json")
        rc, so, se = bench(url, "-c", "1,2", "-n", 6, "--warmup", 2, "--input-len", 64, "--output-len", 4,
                           "--seed", seed, "--json", out, *extra)
        su.check(rc == 0, "%s exit %d:\n%s\n%s" % (name, rc, so, se))
        pts = json.load(open(out))["points"]
        rates = [pt["server_prefix_cache_hit_rate"] for pt in pts]
        su.check(all(x is not None for x in rates), "%s: no prefix-cache figures: %r" % (name, rates))
        print("%s: prefix-cache reuse per point %s" % (name, ["%.1f%%" % (100 * x) for x in rates]))
        return rates

    rates = sweep("sweep", 11)
    su.check(rates[0] < 0.05 and rates[1] < 0.05, "sweep points reuse earlier prompts: %r" % rates)
    shared = sweep("sweep-prefix", 12, "--prefix-len", 64)
    su.check(shared[1] > 0.3, "with --prefix-len the cache shows no reuse (the check would be blind): %r" % shared)
    su.ok("sweep c=1,2: %.1f%% and %.1f%% prefix-cache reuse (with --prefix-len 64: %.1f%%)"
          % (100 * rates[0], 100 * rates[1], 100 * shared[1]))


if __name__ == "__main__":
    try:
        main()
    except su.TestFailure as e:
        print("FAIL: %s" % e)
        sys.exit(1)

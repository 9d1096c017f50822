"""`turbine serve` with no engine serves the bundled demo from the user's
cache only when the cache holds the engine built from the demo's current
files by this engine format: another engine copied over the cached one, or a
key from other demo files, makes it rebuild the demo instead of serving what
is there. The served model is told apart by a prompt of token id 600: inside
the demo's 1024-token vocabulary, outside stories260K's 512 (a 400).
Run by tests/test_cli_demo_cache.sh."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, TestFailure, build_stories, check, ok, workdir  # noqa: E402

d = workdir("demo_cache")
cache = os.path.join(d, "cache")
shutil.rmtree(cache, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = cache
cached = os.path.join(cache, "turbine", "shakespeare-demo.engine")
n_start = 0


def serve_demo():
    """Starts `turbine serve` with no engine argument (the Server helper puts
    its first argument where the engine goes: here a flag that changes
    nothing instead)."""
    global n_start
    n_start += 1
    log = os.path.join(d, "serve%d.log" % n_start)
    if os.path.exists(log):
        os.remove(log)
    return Server("--enable-prefix-caching", log=log).start(wait_s=240)


def served_is_demo(srv):
    st, _, data = srv.get("/v1/models")
    check(st == 200 and b"shakespeare-demo" in data, "/v1/models: %s %r" % (st, data[:200]))
    st, _, data = srv.post("/v1/completions", {"model": "shakespeare-demo", "prompt": [600], "max_tokens": 1,
                                               "temperature": 0})
    return st == 200


try:
    # 1. first start: builds the demo into the cache
    srv = serve_demo()
    log = srv.log()
    check("building the demo model" in log, "first start did not build the demo:\n" + log)
    check(served_is_demo(srv), "first start does not serve the demo")
    srv.kill()
    check(os.path.exists(cached), "no cached engine in " + cache)
    ok("first start builds and serves the demo")

    # 2. second start: reuses it
    srv = serve_demo()
    check("building the demo model" not in srv.log(), "second start rebuilt a valid cache:\n" + srv.log())
    check(served_is_demo(srv), "second start does not serve the demo")
    srv.kill()
    ok("second start reuses the cached demo")

    # 3. another engine copied over the cached one: rebuilt, not served
    shutil.copyfile(build_stories(d), cached)
    srv = serve_demo()
    log = srv.log()
    check("not the engine built for the demo" in log and "building the demo model" in log,
          "a foreign engine in the cache was not rebuilt:\n" + log)
    check(served_is_demo(srv), "the foreign engine copied over the cached demo was served")
    srv.kill()
    ok("an engine copied over the cached demo is replaced by a rebuilt demo")

    # 4. a key from other demo files (or another engine format): rebuilt
    check(os.path.exists(cached + ".key"), "no key file beside " + cached)
    with open(cached + ".key") as f:
        lines = f.read().splitlines()
    check(lines[1].startswith("key "), "unexpected key file: %r" % lines)
    lines[1] = "key 0123456789abcdef"
    with open(cached + ".key", "w") as f:
        f.write("\n".join(lines) + "\n")
    srv = serve_demo()
    log = srv.log()
    check("files or the engine format changed" in log and "building the demo model" in log,
          "a cache keyed by other demo files was not rebuilt:\n" + log)
    check(served_is_demo(srv), "rebuilt demo not served")
    srv.kill()
    ok("a cache keyed by other demo files is rebuilt")
except TestFailure as e:
    print("FAIL: %s" % e)
    sys.exit(1)
print("PASS")

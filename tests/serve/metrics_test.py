"""GET /metrics: valid Prometheus text (promtool check metrics) whose counters
and histograms count the requests served. Run by tests/test_serve_metrics.sh."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, build_stories, check, metric, ok, run_tests, wait_until, workdir  # noqa: E402

S = None
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DONE = {"prompt": 0, "gen": 0, "requests": 0, "completions": 0, "chat": 0}


def promtool_check():
    st, hd, d = S.get("/metrics")
    check(st == 200, "/metrics -> %s" % st)
    check(hd.get("content-type", "").startswith("text/plain"), "/metrics content-type %r" % hd.get("content-type"))
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    check(r.returncode == 0, "promtool check metrics failed (rc %d):\n%s" % (r.returncode, r.stdout.decode()))
    return d.decode()


def t_promtool_fresh():
    check(os.path.exists(PROMTOOL), "promtool not found (Debian package prometheus; scripts/setup.sh installs it "
                                    "with TURBINE_TEST_DEPS=1)")
    text = promtool_check()
    for name in ("turbine_requests_running", "turbine_requests_waiting", "turbine_kv_cache_usage_ratio",
                 "turbine_prompt_tokens_total", "turbine_generation_tokens_total", "turbine_preemptions_total",
                 "turbine_requests_finished_total", "turbine_time_to_first_token_seconds",
                 "turbine_e2e_request_latency_seconds", "turbine_inter_token_latency_seconds"):
        check("# TYPE %s " % name in text, "/metrics lacks a TYPE line for %s" % name)
    ms = S.metrics()
    check(metric(ms, "turbine_prompt_tokens_total") == 0 and metric(ms, "turbine_generation_tokens_total") == 0,
          "a fresh server counts tokens")
    # the model's own device memory: one gauge series, 0 for an engine on the CPU
    check("# TYPE turbine_model_gpu_memory_bytes gauge" in text, "/metrics lacks turbine_model_gpu_memory_bytes")
    check(metric(ms, "turbine_model_gpu_memory_bytes") == 0, "a CPU model holds GPU memory: %s"
          % metric(ms, "turbine_model_gpu_memory_bytes"))
    ok("a fresh server's /metrics passes promtool check metrics")


def run_requests():
    for i, n in enumerate((7, 12, 20)):
        j = S.completion({"prompt": "Once upon a time" + " there" * i, "max_tokens": n, "temperature": 0})
        DONE["prompt"] += j["usage"]["prompt_tokens"]
        DONE["gen"] += j["usage"]["completion_tokens"]
        DONE["completions"] += 1
    j = S.chat({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 9, "temperature": 0})
    DONE["prompt"] += j["usage"]["prompt_tokens"]
    DONE["gen"] += j["usage"]["completion_tokens"]
    DONE["chat"] += 1
    st, _, ev = S.stream("/v1/completions", {"prompt": "Lily", "max_tokens": 11, "temperature": 0, "stream": True,
                                             "stream_options": {"include_usage": True}})
    check(st == 200, "stream -> %s" % st)
    u = json.loads(ev[-2])["usage"]
    DONE["prompt"] += u["prompt_tokens"]
    DONE["gen"] += u["completion_tokens"]
    DONE["completions"] += 1
    DONE["requests"] = DONE["completions"] + DONE["chat"]
    st, _, _ = S.post("/v1/completions", {"prompt": "x", "temperature": "hot"})
    check(st == 400, "a bad request -> %s" % st)


def t_counters():
    run_requests()
    promtool_check()
    ms = wait_until(lambda: (lambda m: m if metric(m, "turbine_requests_running") == 0 else None)(S.metrics()), 10)
    check(ms, "turbine_requests_running stays above 0 after every request finished")
    p, g = metric(ms, "turbine_prompt_tokens_total"), metric(ms, "turbine_generation_tokens_total")
    check(p > 0 and g > 0, "token counters not counting: prompt %s generation %s" % (p, g))
    check(p == DONE["prompt"], "turbine_prompt_tokens_total %s, the replies' usage sums to %d" % (p, DONE["prompt"]))
    check(g == DONE["gen"], "turbine_generation_tokens_total %s, the replies' usage sums to %d" % (g, DONE["gen"]))
    n = DONE["requests"]
    for h in ("turbine_time_to_first_token_seconds", "turbine_e2e_request_latency_seconds",
              "turbine_request_queue_time_seconds"):
        c = metric(ms, h + "_count")
        check(c == n, "%s_count %s, want %d (one per request)" % (h, c, n))
        check(metric(ms, h + "_bucket", le="+Inf") == c, "%s: the +Inf bucket differs from _count" % h)
        check(metric(ms, h + "_sum") > 0, "%s_sum is 0" % h)
    itl = metric(ms, "turbine_inter_token_latency_seconds_count")
    check(itl == DONE["gen"] - n, "inter-token latency count %s, want %d (tokens after the first)" % (itl, DONE["gen"] - n))
    check(metric(ms, "turbine_requests_finished_total", finished_reason="length") == n,
          "finished{length} %s, want %d" % (metric(ms, "turbine_requests_finished_total", finished_reason="length"), n))
    check(metric(ms, "turbine_http_requests_total", endpoint="completions") >= DONE["completions"] and
          metric(ms, "turbine_http_requests_total", endpoint="chat") == DONE["chat"], "turbine_http_requests_total wrong")
    check(metric(ms, "turbine_http_errors_total", status="400") == 1, "turbine_http_errors_total{status=400} != 1")
    check(metric(ms, "turbine_kv_cache_usage_ratio") == 0, "KV usage %s with nothing running" %
          metric(ms, "turbine_kv_cache_usage_ratio"))
    steps = metric(ms, "turbine_step_duration_seconds_count")
    check(steps >= max(7, 12, 20), "turbine_step_duration_seconds_count %s is below the longest request" % steps)
    ok("after %d requests: prompt %d, generation %d tokens, TTFT count %d, ITL count %d, finished{length} %d"
       % (n, p, g, n, itl, n))


def t_buckets_monotonic():
    text = promtool_check()
    last = {}
    for line in text.splitlines():
        if "_bucket{" in line:
            name = line.split("{")[0]
            v = float(line.rsplit(" ", 1)[1])
            check(v >= last.get(name, 0), "%s buckets are not cumulative: %s" % (name, line))
            last[name] = v
    ok("histogram buckets are cumulative")


def main():
    global S
    S = Server(build_stories(workdir("metrics"))).start()
    run_tests([("promtool on a fresh server", t_promtool_fresh), ("counters after requests", t_counters),
               ("cumulative buckets", t_buckets_monotonic)])


if __name__ == "__main__":
    main()

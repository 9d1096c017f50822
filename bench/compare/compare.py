#!/usr/bin/python3
"""compare.py — the helpers of bench/compare_precisions.sh (standard library,
plus onnx/numpy for the model's shapes and calibration inputs).

    compare.py shapes MODEL.onnx BATCH      -> "name:BxCxHxW,..." (dynamic dims: BATCH first, 1 after)
    compare.py calib MODEL.onnx DIR N SEED  -> DIR/input_K.npy (one input) or DIR/K/NAME.npy sets
    compare.py port                         -> a free loopback TCP port
    compare.py accuracy URL MODEL N SEED OUT.json
                                            -> N seeded random rows sent one by one over KServe v2
                                               JSON; the first output's top-1 class per row and
                                               its values, so precisions compare row by row
    compare.py scrape URL MODEL OUT.jsonl INTERVAL_S
                                            -> until SIGTERM: every INTERVAL_S one line of
                                               URL/metrics' GPU gauges (NVML utilisation and
                                               memory of the machine, the model's own device
                                               memory), so a sweep point gets its mean
                                               utilisation and peak memory
    compare.py report DIR SLO_MS [LLM_SLO_MS]
                                            -> DIR/report.json and DIR/report.html from
                                               DIR/<dtype>/{bench.json,accuracy.json,meta.json,
                                               gpu_K.jsonl} and DIR/llm.json (+ DIR/llm/<dtype>/)

The report is one self-contained page: a table per precision, the
throughput-p99 curves of every precision on one inline SVG, no external asset.
"""
import html
import json
import math
import os
import random
import re
import signal
import socket
import struct
import sys
import time
import urllib.error
import urllib.request

DTYPES = ["f32", "f16", "int8"]


def shapes(model, batch):
    import onnx
    m = onnx.load(model, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = []
    for inp in m.graph.input:
        if inp.name in inits:
            continue
        dims = []
        for k, d in enumerate(inp.type.tensor_type.shape.dim):
            dims.append(d.dim_value if d.dim_value > 0 else (int(batch) if k == 0 else 1))
        out.append("%s:%s" % (inp.name, "x".join(str(x) for x in dims)))
    print(",".join(out))


def calib(model, d, n, seed):
    import numpy as np
    import onnx
    m = onnx.load(model, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]
    rng = np.random.default_rng(int(seed))
    os.makedirs(d, exist_ok=True)
    for k in range(int(n)):
        for i in ins:
            dims = [x.dim_value if x.dim_value > 0 else 1 for x in i.type.tensor_type.shape.dim]
            et = i.type.tensor_type.elem_type
            if et == onnx.TensorProto.FLOAT:
                a = rng.standard_normal(dims).astype(np.float32)
            else:
                a = rng.integers(0, 100, dims).astype(np.int64)
            if len(ins) == 1:
                np.save(os.path.join(d, "input_%d.npy" % k), a)
            else:
                os.makedirs(os.path.join(d, str(k)), exist_ok=True)
                np.save(os.path.join(d, str(k), i.name + ".npy"), a)


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()


def get(url):
    return json.loads(urllib.request.urlopen(url, timeout=30).read().decode())


def accuracy(url, model, n, seed, out):
    meta = get("%s/v2/models/%s" % (url, model))
    rng = random.Random(int(seed))
    rows = []
    for _ in range(int(n)):
        inputs = []
        for i in meta["inputs"]:
            shp = [d if d > 0 else 1 for d in i["shape"]]
            cnt = 1
            for d in shp:
                cnt *= d
            if i["datatype"].startswith("FP"):
                data = [rng.gauss(0.0, 1.0) for _ in range(cnt)]
            else:
                data = [rng.randrange(100) for _ in range(cnt)]
            inputs.append({"name": i["name"], "shape": shp, "datatype": i["datatype"], "data": data})
        req = urllib.request.Request("%s/v2/models/%s/infer" % (url, model),
                                     data=json.dumps({"inputs": inputs}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            r = json.loads(urllib.request.urlopen(req, timeout=120).read().decode())
        except urllib.error.HTTPError as e:
            sys.exit("compare.py: %s answered %d: %s" % (url, e.code, e.read().decode(errors="replace")[:300]))
        o = r["outputs"][0]
        vals = [float(v) for v in o["data"]]
        rows.append({"top1": max(range(len(vals)), key=vals.__getitem__), "values": vals})
    json.dump({"output": meta["outputs"][0]["name"], "rows": rows}, open(out, "w"))


METRIC_RE = re.compile(r'^(turbine_gpu_utilization_ratio|turbine_gpu_memory_used_bytes|turbine_model_gpu_memory_bytes)'
                       r'\{([^}]*)\}\s+(\S+)')


def scrape(url, model, out, interval):
    """Samples URL/metrics until SIGTERM, one JSON line per sample (written as
    it comes); SIGTERM takes one last sample, so a point shorter than the
    interval still has one from its start and one from its end."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    f = open(out, "a")
    last = False
    while not last:
        last = bool(stop)
        t = time.time()
        x = {"t": t, "gpu_util": None, "gpu_mem_bytes": None, "model_gpu_bytes": None}
        try:
            text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode(errors="replace")
            for line in text.splitlines():
                m = METRIC_RE.match(line)
                if not m:
                    continue
                labels, v = m.group(2), float(m.group(3))
                if m.group(1) == "turbine_model_gpu_memory_bytes":
                    if 'model="%s"' % model in labels:
                        x["model_gpu_bytes"] = max(v, x["model_gpu_bytes"] or 0.0)
                elif m.group(1) == "turbine_gpu_utilization_ratio":
                    x["gpu_util"] = v
                else:
                    x["gpu_mem_bytes"] = v
            f.write(json.dumps(x) + "\n")
            f.flush()
        except (OSError, ValueError):
            pass  # the server busy or going: the next sample
        if not last:
            time.sleep(max(0.0, float(interval) - (time.time() - t)))
    f.close()


def gpu_stats(path):
    """A point's GPU figures from its scrape: mean utilisation (%), peak
    memory of the machine (GiB), the model's own device memory (GiB, peak)."""
    r = {"gpu_util_pct": None, "gpu_mem_gib": None, "model_gpu_mem_gib": None, "gpu_samples": 0}
    if not os.path.exists(path):
        return r
    xs = [json.loads(l) for l in open(path) if l.strip()]
    r["gpu_samples"] = len(xs)
    u = [x["gpu_util"] for x in xs if x.get("gpu_util") is not None]
    m = [x["gpu_mem_bytes"] for x in xs if x.get("gpu_mem_bytes") is not None]
    g = [x["model_gpu_bytes"] for x in xs if x.get("model_gpu_bytes") is not None]
    if u:
        r["gpu_util_pct"] = 100.0 * sum(u) / len(u)
    if m:
        r["gpu_mem_gib"] = max(m) / 2**30
    if g:
        r["model_gpu_mem_gib"] = max(g) / 2**30
    return r


def fmt(v, nd=2):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return ("%." + str(nd) + "f") % v


def num(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def figures(d, dt, slo, ref):
    """One precision's figures from DIR/dt: the sweep, QPS at the SLO, accuracy against ref."""
    meta = json.load(open(os.path.join(d, dt, "meta.json")))
    b = json.load(open(os.path.join(d, dt, "bench.json")))
    pts = []
    for k, p in enumerate(b["points"]):
        e = p["e2e"]
        x = {"label": p["label"], "concurrency": p["concurrency"], "rate": p["rate"],
             "requests_ok": p["requests_ok"], "requests_failed": p["requests_failed"],
             "qps": p["request_throughput"], "p50_ms": e.get("p50_ms"), "p95_ms": e.get("p95_ms"),
             "p99_ms": e.get("p99_ms"),
             "batch_mean": (p.get("server") or {}).get("batch_size", {}).get("mean")}
        x.update(gpu_stats(os.path.join(d, dt, "gpu_%d.jsonl" % k)))
        pts.append(x)
    ok = [p for p in pts if p["requests_failed"] == 0 and p["requests_ok"] > 0
          and p["p99_ms"] is not None and p["p99_ms"] <= slo]
    best = max(ok, key=lambda p: p["qps"]) if ok else None
    top = max(pts, key=lambda p: p["qps"])
    f = {"dtype": dt, "device": meta.get("device", "cpu"), "engine_bytes": meta["engine_bytes"], "build_s": meta["build_s"],
         "server_peak_rss_mib": meta.get("server_peak_rss_mib"),
         "qps_at_slo": best["qps"] if best else None, "slo_point": best["label"] if best else None,
         "p50_ms": (best or top)["p50_ms"], "p95_ms": (best or top)["p95_ms"], "p99_ms": (best or top)["p99_ms"],
         "latency_point": (best or top)["label"], "max_qps": top["qps"],
         # the sweep's highest mean utilisation (a point's mean over its samples) and peak memory
         "gpu_util_pct": max((p["gpu_util_pct"] for p in pts if p["gpu_util_pct"] is not None), default=None),
         "gpu_mem_gib": max((p["gpu_mem_gib"] for p in pts if p["gpu_mem_gib"] is not None), default=None),
         "model_gpu_mem_gib": max((p["model_gpu_mem_gib"] for p in pts if p["model_gpu_mem_gib"] is not None),
                                  default=None),
         "points": pts}
    acc_path = os.path.join(d, dt, "accuracy.json")
    if os.path.exists(acc_path):
        a = json.load(open(acc_path))["rows"]
        r = json.load(open(os.path.join(d, ref, "accuracy.json")))["rows"]
        n = min(len(a), len(r))
        agree = sum(1 for k in range(n) if a[k]["top1"] == r[k]["top1"])
        err = max((abs(x - y) for k in range(n) for x, y in zip(a[k]["values"], r[k]["values"])), default=0.0)
        f["accuracy"] = {"rows": n, "top1_agreement": agree / n if n else None, "max_abs_err": err}
    return f


LLM_DTYPES = ["f32", "f16", "bf16", "int8", "int4", "fp8"]


def parse_compare(text, x):
    """turbine compare's lines: "A perplexity P nll N FILE", "B perplexity ...",
    "kl mean K p99 ...", "top1 agreement F (n of m)"."""
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 3 and w[1] == "perplexity":
            x["perplexity_f32" if w[0] == "A" else "perplexity"] = float(w[2])
        elif len(w) >= 3 and w[:2] == ["kl", "mean"]:
            x["kl_mean"] = float(w[2])
        elif len(w) >= 3 and w[:2] == ["top1", "agreement"]:
            x["top1_agreement"] = float(w[2])


def llm_figures(d, slo):
    """The LLM engines of DIR/llm/<dtype>/: accuracy against f32 (turbine
    compare) and, where served, the OpenAI sweep's figures; QPS and output
    tokens/s at the SLO: the highest-throughput point whose TTFT p99 meets
    it with no failed request."""
    L = os.path.join(d, "llm")
    cfg = json.load(open(os.path.join(L, "config.json")))
    engines = []
    for dt in LLM_DTYPES:
        dd = os.path.join(L, dt)
        if not os.path.exists(os.path.join(dd, "meta.json")):
            continue
        meta = json.load(open(os.path.join(dd, "meta.json")))
        x = {"dtype": dt, "device": meta.get("device", "cpu"), "engine_bytes": meta["engine_bytes"],
             "build_s": meta["build_s"], "server_peak_rss_mib": meta.get("server_peak_rss_mib")}
        c = os.path.join(dd, "compare.txt")
        x["compare"] = open(c).read().strip() if os.path.exists(c) else "(the reference)"
        parse_compare(x["compare"], x)
        bj = os.path.join(dd, "bench.json")
        pts = []
        if os.path.exists(bj):
            for k, p in enumerate(json.load(open(bj))["points"]):
                q = {"label": p["label"], "concurrency": p["concurrency"], "rate": p["rate"],
                     "requests_ok": p["requests_ok"], "requests_failed": p["requests_failed"],
                     "qps": p["request_throughput"], "out_tps": p["output_token_throughput"],
                     "output_tokens": p["output_tokens"]}
                for m in ("ttft", "tpot", "itl", "e2e"):
                    h = p.get(m) or {}
                    for pc in ("p50", "p95", "p99"):
                        q["%s_%s_ms" % (m, pc)] = h.get(pc + "_ms")
                q.update(gpu_stats(os.path.join(dd, "gpu_%d.jsonl" % k)))
                pts.append(q)
        x["points"] = pts
        if pts:
            ok = [p for p in pts if p["requests_failed"] == 0 and p["requests_ok"] > 0
                  and p["ttft_p99_ms"] is not None and p["ttft_p99_ms"] <= slo]
            best = max(ok, key=lambda p: p["qps"]) if ok else None
            at = best or max(pts, key=lambda p: p["qps"])
            x.update({"qps_at_slo": best["qps"] if best else None, "out_tps_at_slo": best["out_tps"] if best else None,
                      "slo_point": best["label"] if best else None, "latency_point": at["label"],
                      "max_qps": max(p["qps"] for p in pts), "max_out_tps": max(p["out_tps"] for p in pts)})
            for m in ("ttft", "tpot", "e2e"):
                for pc in ("p50", "p95", "p99"):
                    x["%s_%s_ms" % (m, pc)] = at["%s_%s_ms" % (m, pc)]
            for g in ("gpu_util_pct", "gpu_mem_gib", "model_gpu_mem_gib"):
                x[g] = max((p[g] for p in pts if p[g] is not None), default=None)
        engines.append(x)
    cfg.update({"slo_ttft_p99_ms": slo, "engines": engines})
    return cfg


def svg_plot(figs, slo, xkey="qps", ykey="p99_ms", xlabel="throughput (requests/s)", ylabel="p99 latency",
             cls="curve"):
    """Throughput (x) against p99 latency (y), one polyline per precision; the SLO dashed."""
    W, H, L, R, T, B = 640, 360, 60, 110, 20, 45
    xs = [p[xkey] for f in figs for p in f["points"] if p[xkey] is not None]
    ys = [p[ykey] for f in figs for p in f["points"] if p[ykey] is not None]
    xmax = max(xs + [1e-9]) * 1.05
    ymax = max(ys + [1e-9]) * 1.1
    if slo <= 2 * ymax:  # a far SLO would flatten the curves: then it is only named, at the top
        ymax = max(ymax, slo * 1.1)
    # latencies two decades apart (a slow precision beside fast ones): a log axis keeps both readable
    ymin = min(ys + [slo]) / 1.5 if ys else 1.0
    logy = ymin > 0 and ymax / ymin > 100
    sx = lambda v: L + (W - L - R) * v / xmax
    if logy:
        ly0, ly1 = math.log10(ymin), math.log10(ymax)
        sy = lambda v: H - B - (H - T - B) * (math.log10(max(v, ymin)) - ly0) / (ly1 - ly0)
    else:
        sy = lambda v: H - B - (H - T - B) * v / ymax
    colors = {"f32": "#1f77b4", "f16": "#ff7f0e", "int8": "#2ca02c", "int4": "#9467bd", "fp8": "#d62728"}
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
         'aria-label="%s against %s">' % (W, H, W, H, ylabel, xlabel),
         '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, T, W - L - R, H - T - B)]
    for k in range(6):
        xv = xmax * k / 5
        yv = 10 ** (ly0 + (ly1 - ly0) * k / 5) if logy else ymax * k / 5
        o.append('<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>' % (sx(xv), H - B + 15, fmt(xv, 0)))
        o.append('<text x="%d" y="%.1f" font-size="11" text-anchor="end">%s</text>' % (L - 5, sy(yv) + 4, ("%.0f" if yv >= 100 else "%.3g") % yv))
    o.append('<text x="%d" y="%d" font-size="12" text-anchor="middle">%s</text>' % ((L + W - R) // 2, H - 8, xlabel))
    o.append('<text x="14" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 14 %d)">%s (ms%s)</text>'
             % ((T + H - B) // 2, (T + H - B) // 2, ylabel, ", log scale" if logy else ""))
    if slo <= ymax:
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="5,4"/>' % (L, sy(slo), W - R, sy(slo)))
        o.append('<text x="%d" y="%.1f" font-size="11" fill="#c00">SLO %s ms</text>' % (W - R + 4, sy(slo) + 4, fmt(slo, 1)))
    else:
        o.append('<text x="%d" y="%d" font-size="11" fill="#c00">SLO %s ms (above)</text>' % (W - R + 4, T + 4, fmt(slo, 1)))
    # the legend in the right margin, at the top unless the SLO label is there
    legend_low = slo <= ymax and sy(slo) < T + 16 * len(figs) + 10
    for i, f in enumerate(figs):
        c = colors.get(f["dtype"], "#000")
        pts = sorted((p for p in f["points"] if p[ykey] is not None and p[xkey] is not None), key=lambda p: p[xkey])
        o.append('<polyline class="%s" data-dtype="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                 % (cls, f["dtype"], c, " ".join("%.1f,%.1f" % (sx(p[xkey]), sy(p[ykey])) for p in pts)))
        for p in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s: %s %s, %s %s ms</title></circle>'
                     % (sx(p[xkey]), sy(p[ykey]), c, f["dtype"], html.escape(p["label"]), fmt(p[xkey], 1), xlabel,
                        ylabel, fmt(p[ykey], 2)))
        ly = (H - B - 16 * (len(figs) - 1 - i)) if legend_low else (T + 14 + 16 * i)
        o.append('<text x="%d" y="%d" font-size="12" fill="%s">%s</text>' % (W - R + 4, ly, c, f["dtype"]))
    o.append("</svg>")
    return "\n".join(o)


def dlabel(f, cfg):
    """A precision as the summary names it: its device when the experiment
    ran on a GPU (ONNX int8 runs on the CPU there)."""
    if not str(cfg.get("device", "cpu")).startswith("cuda"):
        return html.escape(f["dtype"])
    return html.escape("%s (%s)" % (f["dtype"], "CPU: no int8 ONNX engine on the GPU" if f["device"] == "cpu" else f["device"]))


def report(d, slo, llm_slo=None):
    slo = float(slo)
    cfg = json.load(open(os.path.join(d, "config.json")))
    # a precision is in once its sweep and meta are written (a run cut short keeps those that finished)
    dts = [dt for dt in DTYPES if os.path.exists(os.path.join(d, dt, "bench.json"))
           and os.path.exists(os.path.join(d, dt, "meta.json"))]
    figs = [figures(d, dt, slo, "f32") for dt in dts]
    llm = None
    if os.path.exists(os.path.join(d, "llm", "config.json")):
        llm = llm_figures(d, float(llm_slo if llm_slo is not None else 1000))
        json.dump(llm, open(os.path.join(d, "llm.json"), "w"), indent=1)
    out = {"config": cfg, "slo_ms": slo, "precisions": figs, "llm": llm}
    json.dump(out, open(os.path.join(d, "report.json"), "w"), indent=1)
    e = html.escape
    rows = []
    for f in figs:
        a = f.get("accuracy") or {}
        rows.append("<tr data-dtype=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                    "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                        f["dtype"], dlabel(f, cfg), fmt(f["qps_at_slo"], 1), fmt(f["max_qps"], 1),
                        fmt(f["p50_ms"]), fmt(f["p95_ms"]), fmt(f["p99_ms"]), e(f["latency_point"]),
                        fmt(f["gpu_util_pct"], 0) + ("" if f["gpu_util_pct"] is None else " %"),
                        fmt(f["gpu_mem_gib"]) + ("" if f["gpu_mem_gib"] is None else " GiB"),
                        fmt(f["model_gpu_mem_gib"], 3) + ("" if f["model_gpu_mem_gib"] is None else " GiB"),
                        fmt(f["server_peak_rss_mib"], 1), fmt(f["engine_bytes"] / 2**20, 2), fmt(f["build_s"], 1),
                        ("%.1f %% of %d (max abs err %.3g)" % (100 * a["top1_agreement"], a["rows"], a["max_abs_err"])
                         if a.get("rows") else "n/a")))
    pts = []
    for f in figs:
        for p in f["points"]:
            pts.append("<tr><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                f["dtype"], e(p["label"]), p["requests_ok"], p["requests_failed"], fmt(p["qps"], 1),
                fmt(p["p50_ms"]), fmt(p["p95_ms"]), fmt(p["p99_ms"]), fmt(p["batch_mean"])))
    llm_html = ""
    if llm:
        # f32 is the reference: its perplexity is the "A" line of any compare
        ref_ppl = next((x["perplexity_f32"] for x in llm["engines"] if "perplexity_f32" in x), None)
        lr = "\n".join("<tr data-llm=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td><pre>%s</pre></td></tr>" % (
            e(x["dtype"]), e(x["dtype"]), fmt(x["engine_bytes"] / 2**20, 2), fmt(x.get("build_s"), 1),
            fmt(x.get("perplexity", ref_ppl), 4),
            fmt(x.get("kl_mean"), 6), fmt(x.get("top1_agreement"), 4), e(x.get("compare", "")))
            for x in llm["engines"])
        served = [x for x in llm["engines"] if x.get("points")]
        sr = "\n".join(
            "<tr data-llm-served=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
            "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                e(x["dtype"]), e("%s (%s)" % (x["dtype"], x["device"])), fmt(x["qps_at_slo"], 2), fmt(x["out_tps_at_slo"], 1),
                fmt(x["max_out_tps"], 1),
                "/".join(fmt(x["ttft_%s_ms" % q]) for q in ("p50", "p95", "p99")),
                "/".join(fmt(x["tpot_%s_ms" % q]) for q in ("p50", "p95", "p99")),
                "/".join(fmt(x["e2e_%s_ms" % q], 1) for q in ("p50", "p95", "p99")), e(x["latency_point"]),
                fmt(x["gpu_util_pct"], 0) + ("" if x["gpu_util_pct"] is None else " %"),
                fmt(x["gpu_mem_gib"]) + ("" if x["gpu_mem_gib"] is None else " GiB"),
                fmt(x["model_gpu_mem_gib"], 3) + ("" if x["model_gpu_mem_gib"] is None else " GiB"),
                fmt(x["server_peak_rss_mib"], 1), fmt(x["engine_bytes"] / 2**20, 2))
            for x in served)
        lp = []
        for x in served:
            for p in x["points"]:
                lp.append("<tr><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                    e(x["dtype"]), e(p["label"]), p["requests_ok"], p["requests_failed"], fmt(p["qps"], 2),
                    fmt(p["out_tps"], 1), fmt(p["ttft_p99_ms"]), fmt(p["tpot_p99_ms"]), fmt(p["e2e_p99_ms"], 1)))
        serve_html = ""
        if served:
            serve_html = ("<h3>Served under load</h3><p>Each engine served by <code>turbine serve</code> (OpenAI API, %s), "
                          "loaded by <code>turbine bench</code> (%s). SLO: TTFT p99 &le; %s ms with no failed request; "
                          "QPS and output tokens/s at the SLO are the highest-throughput sweep point that meets it (n/a: none does). "
                          "Latencies (P50/P95/P99) are that point's, else the highest-throughput point's. "
                          "Per-token latency: TPOT, the mean time between a request's output tokens.</p>"
                          "<table id=\"llm-summary\"><tr><th>precision</th><th>QPS at SLO</th><th>output tok/s at SLO</th>"
                          "<th>max output tok/s</th><th>TTFT ms P50/P95/P99</th><th>TPOT ms P50/P95/P99</th>"
                          "<th>E2E ms P50/P95/P99</th><th>at point</th><th>GPU util</th><th>GPU mem</th><th>model GPU mem</th>"
                          "<th>server peak RSS MiB</th><th>engine MiB</th></tr>%s</table>"
                          "<h3>Output tokens/s against TTFT p99</h3>%s"
                          "<table id=\"llm-points\"><tr><th>precision</th><th>point</th><th>ok</th><th>failed</th><th>req/s</th>"
                          "<th>output tok/s</th><th>TTFT p99 ms</th><th>TPOT p99 ms</th><th>E2E p99 ms</th></tr>%s</table>"
                          % (e(llm.get("serve_args", "")), e(llm.get("load", "")), fmt(llm["slo_ttft_p99_ms"], 1), sr,
                             svg_plot(served, llm["slo_ttft_p99_ms"], "out_tps", "ttft_p99_ms", "output tokens/s",
                                      "TTFT p99", "llm-curve"), "\n".join(lp)))
        llm_html = ("<h2>LLM: %s</h2>%s<h3>Accuracy</h3><p><code>turbine compare</code> of each engine against f32 on %s.</p>"
                    "<table><tr><th>dtype</th><th>engine MiB</th><th>build s</th><th>perplexity</th><th>KL mean (nats)</th>"
                    "<th>top-1 agreement with f32</th><th>turbine compare</th></tr>%s</table>"
                    % (e(llm["checkpoint"]), serve_html, e(llm["text"]), lr))
    onnx_html = "<p>No ONNX model in this run (<code>--no-onnx</code>).</p>"
    if figs:
        onnx_html = """<p>Model <code>%s</code>, served by <code>turbine serve</code> on 127.0.0.1 (%s), loaded by <code>turbine bench --endpoint kserve</code> (%s).
SLO: p99 end-to-end latency &le; %s ms. Started %s on %s.</p>
<h2>Summary</h2>
<table id="summary"><tr><th>precision</th><th>QPS at SLO</th><th>max QPS</th><th>P50 ms</th><th>P95 ms</th><th>P99 ms</th><th>at point</th>
<th>GPU util</th><th>GPU mem</th><th>model GPU mem</th><th>server peak RSS MiB</th><th>engine MiB</th><th>build s</th><th>top-1 agreement with f32</th></tr>
%s</table>
<p>QPS at SLO: the highest throughput of a sweep point whose p99 meets the SLO with no failed request (n/a: none does).
P50/P95/P99 are that point's (or, when none meets the SLO, the highest-throughput point's).
GPU util: the highest over the sweep of a point's mean <code>turbine_gpu_utilization_ratio</code>; GPU mem: the peak
<code>turbine_gpu_memory_used_bytes</code> (NVML, the whole machine); model GPU mem: <code>turbine_model_gpu_memory_bytes</code>
(what the model's load took on its device), all scraped from the server's <code>/metrics</code> during each point
(n/a: the server exports no GPU gauge, as on a machine without NVIDIA GPUs).</p>
<h2>Throughput against p99 latency</h2>
%s
<h2>Every point</h2>
<table id="points"><tr><th>precision</th><th>point</th><th>ok</th><th>failed</th><th>req/s</th><th>P50 ms</th><th>P95 ms</th><th>P99 ms</th><th>server batch mean</th></tr>
%s</table>""" % (e(cfg["model"]), e(cfg["serve_args"]), e(cfg["load"]), fmt(slo, 1), e(cfg["started_at"]), e(cfg["machine"]),
                 "\n".join(rows), svg_plot(figs, slo), "\n".join(pts))
    else:
        onnx_html += "<p>Started %s on %s.</p>" % (e(cfg["started_at"]), e(cfg["machine"]))
    page = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>turbine: precisions compared</title>
<style>body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}pre{text-align:left;margin:0}</style>
</head><body>
<h1>Engines of one model in each precision under the same load</h1>
%s
%s
<script>document.body.setAttribute("data-rendered", String(document.querySelectorAll("polyline.curve").length));
document.body.setAttribute("data-rendered-llm", String(document.querySelectorAll("polyline.llm-curve").length));</script>
</body></html>
""" % (onnx_html, llm_html)
    open(os.path.join(d, "report.html"), "w").write(page)
    for f in figs:
        a = f.get("accuracy") or {}
        print("%-5s QPS@SLO %8s  max QPS %8s  p50/p95/p99 %s/%s/%s ms  engine %s MiB  top-1 %s" % (
            f["dtype"], fmt(f["qps_at_slo"], 1), fmt(f["max_qps"], 1), fmt(f["p50_ms"]), fmt(f["p95_ms"]),
            fmt(f["p99_ms"]), fmt(f["engine_bytes"] / 2**20, 2),
            ("%.1f%%" % (100 * a["top1_agreement"])) if a.get("rows") else "n/a"))
    for x in (llm or {}).get("engines", []):
        if x.get("points"):
            print("llm %-5s QPS@SLO %6s  out tok/s@SLO %8s  TTFT p50/p99 %s/%s ms  TPOT p50/p99 %s/%s ms  engine %s MiB  "
                  "top-1 %s" % (x["dtype"], fmt(x["qps_at_slo"], 2), fmt(x["out_tps_at_slo"], 1), fmt(x["ttft_p50_ms"]),
                                fmt(x["ttft_p99_ms"]), fmt(x["tpot_p50_ms"]), fmt(x["tpot_p99_ms"]),
                                fmt(x["engine_bytes"] / 2**20, 2), fmt(x.get("top1_agreement"), 4)))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"shapes": shapes, "calib": calib, "port": port, "accuracy": accuracy, "scrape": scrape,
     "report": report}[cmd](*args)

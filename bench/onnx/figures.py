#!/usr/bin/python3
"""figures.py — bench/onnx/run.sh's helpers.

  figures.py inputs MODEL.onnx DIR NAME:D0xD1,...   random input_K.pb files for those shapes
  figures.py bench-json JSON TXT NAME BATCH [PEER]  a record from turbine bench's JSON (PEER: turbine)
  figures.py exec-mean TXT NAME BATCH               a record from `turbine exec --repeat`'s line
  figures.py table RESULTS.jsonl THREADS LOAD_BEFORE LOAD_AFTER
"""
import json
import os
import re
import sys

import numpy as np


def inputs(model, d, spec):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(model, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]
    shapes = {p.rsplit(":", 1)[0]: [int(x) for x in p.rsplit(":", 1)[1].split("x")] for p in spec.split(",")}
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for k, i in enumerate(ins):
        dt = onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[i.type.tensor_type.elem_type]
        shp = shapes[i.name]
        is_mask = i.name.endswith("mask")
        if np.issubdtype(dt, np.floating):
            x = (np.zeros(shp) if is_mask else rng.uniform(-1, 1, shp)).astype(dt)
        else:
            x = (np.ones(shp) if is_mask else rng.integers(0, 100, shp)).astype(dt)
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, i.name).SerializeToString())


def walk(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from walk(v, path + (str(k).lower(),))
    elif isinstance(o, list):
        for v in o:
            yield from walk(v, path)
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        yield path, o


def bench_json(jpath, tpath, name, batch, peer="turbine"):
    rec = {"peer": peer, "name": name, "batch": int(batch)}
    data = None
    try:
        with open(jpath) as f:
            data = json.load(f)
    except (OSError, ValueError):
        try:  # the JSON on stdout instead
            with open(tpath) as f:
                data = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            pass
    lat = {}
    if data is not None:
        names = {"min": ("min", "min_ms"), "mean": ("mean", "mean_ms", "avg"),
                 "median": ("median", "p50", "median_ms", "p50_ms"), "p99": ("p99", "p99_ms")}
        for path, v in walk(data):
            key = path[-1]
            in_lat = any("lat" in p or p.endswith("_ms") for p in path)
            flat = re.sub(r"^latency_", "", key) if key.startswith("latency_") else None
            for want, ks in names.items():
                if (flat in ks or (key in ks and in_lat)) and want not in lat:
                    lat[want] = v
            if (key.startswith("throughput") or key.endswith("per_s")) and "throughput_per_s" not in rec:
                rec["throughput_per_s"] = v
        rec["raw"] = data
    rec["latency_ms"] = lat
    print(json.dumps(rec))


def exec_mean(tpath, name, batch):
    with open(tpath) as f:
        txt = f.read()
    mo = re.search(r"mean ([0-9.]+) ms over (\d+)", txt)
    rec = {"peer": "turbine", "name": name, "batch": int(batch), "via": "exec --repeat",
           "latency_ms": {"mean": float(mo.group(1))} if mo else {}}
    if mo:
        rec["throughput_per_s"] = 1000.0 / float(mo.group(1))
        rec["iters"] = int(mo.group(2))
    print(json.dumps(rec))


def table(res, threads, load_before, load_after):
    with open(res) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(f"ONNX models, opset 17, random weights, {threads} threads "
          "(ResNet-18 224x224; BERT-base shape, 12 layers, 768 dim, seq 128)")
    print(f"load average before {load_before}, after {load_after} (figures from a busy machine mislead)")
    print(f"{'model':<9} {'batch':>5} {'runtime':<20} {'inf/s':>8} {'samples/s':>9} "
          f"{'min ms':>8} {'mean ms':>8} {'median ms':>9} {'p99 ms':>8}")

    def f(x):
        return f"{x:.2f}" if isinstance(x, (int, float)) else "-"
    for r in sorted(rows, key=lambda r: (r["name"], r["batch"], r["peer"] != "onnxruntime")):
        lat = r.get("latency_ms", {})
        thr = r.get("throughput_per_s")
        sps = r.get("samples_per_s", thr * r["batch"] if isinstance(thr, (int, float)) else None)
        label = r["peer"]
        if r.get("version") and r["peer"] == "onnxruntime":
            label += f" {r['version']}"
        if r.get("via"):
            label += " (exec)"
        print(f"{r['name']:<9} {r['batch']:>5} {label:<20} {f(thr):>8} {f(sps):>9} {f(lat.get('min')):>8} "
              f"{f(lat.get('mean')):>8} {f(lat.get('median')):>9} {f(lat.get('p99')):>8}")
    if any(r.get("via") for r in rows):
        print("(exec): turbine bench has no ONNX mode yet; the mean of `turbine exec --repeat` "
              "(after a first run), with file I/O around it")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "inputs":
        inputs(*args)
    elif cmd == "bench-json":
        bench_json(*args)
    elif cmd == "exec-mean":
        exec_mean(*args)
    elif cmd == "table":
        table(*args)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

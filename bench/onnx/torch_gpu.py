#!/usr/bin/env python3
"""torch_gpu.py — the GPU baseline for ONNX engines: PyTorch on CUDA, eager
and with the forward captured in a CUDA graph, on the same modules
tests/onnx/make_models.py exports (random weights, fixed seed).

    python3 bench/onnx/torch_gpu.py [--models bert,resnet18] [--batch 1,8]
        [--seq 128] [--dtype f16|f32] [--iters 200] [--channels-last] [--json FILE]

Prints one JSON object per line: model, batch, dtype, eager_ms, graph_ms
(mean per forward over --iters replays, CUDA events). --channels-last: the
CNNs' module and image input in torch.channels_last (cuDNN's NHWC kernels;
the exported ONNX model is NCHW either way); channels_last in the output.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "onnx"))
import make_models  # noqa: E402


def inputs_for(name, spec, batch, seq, device):
    gen = torch.Generator().manual_seed(1)
    ds = {"batch": batch, "seq": seq}
    return [t.to(device) for t in make_models.make_inputs(name, spec, ds, gen)]


def time_ms(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="bert,resnet18")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.float16 if a.dtype == "f16" else torch.float32
    rows = []
    for name in a.models.split(","):
        m, spec = make_models.build_model(name, False, torch.Generator().manual_seed(0))
        m = m.eval().to(dev).to(dt)
        cl = a.channels_last and name == "resnet18"
        if cl:
            m = m.to(memory_format=torch.channels_last)
        for b in [int(x) for x in a.batch.split(",")]:
            ins = inputs_for(name, spec, b, a.seq, dev)
            ins = [t.to(dt) if t.is_floating_point() else t for t in ins]
            if cl:
                ins = [t.to(memory_format=torch.channels_last) if t.dim() == 4 else t for t in ins]
            with torch.inference_mode():
                eager = time_ms(lambda: m(*ins), a.iters)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        m(*ins)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    m(*ins)
                graph = time_ms(g.replay, a.iters)
            r = {"model": name, "batch": b, "seq": a.seq if name != "resnet18" else None, "dtype": a.dtype,
                 "eager_ms": round(eager, 4), "graph_ms": round(graph, 4), "channels_last": cl,
                 "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name()}
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""make_models.py — exports the ONNX test and benchmark models with PyTorch.

    /usr/bin/python3 tests/onnx/make_models.py OUTDIR [--small]
        [--models resnet18,bert,gpt2] [--opsets 13,17] [--no-data] [--seed N]

For each model and opset it writes the ONNX backend-test layout:

    OUTDIR/NAME_opsetN/model.onnx
    OUTDIR/NAME_opsetN/test_data_set_0/input_K.pb, output_K.pb
    OUTDIR/NAME_opsetN/test_data_set_1/...      (another batch / sequence length)

K follows the graph's input and output order; the expected outputs are
PyTorch's own. Weights are random (fixed seed), the batch axis (and the
sequence axis of the text models) is dynamic. OUTDIR/manifest.json lists the
models with their inputs, dynamic axes, data-set shapes and op types.

--small (the test configuration, a few seconds on 2 cores):
    resnet18  torchvision ResNet-18, 64x64 input, 100 classes
    bert      encoder, 2 layers, dim 64, 4 heads, FFN 256, vocab 1000
    gpt2      decoder, 2 layers, dim 64, 4 heads, vocab 512, context 64
default (the benchmark shapes):
    resnet18  ResNet-18, 224x224 input, 1000 classes
    bert      BERT-base shape: 12 layers, dim 768, 12 heads, FFN 3072, vocab 30522
    gpt2      GPT-2 small shape: 12 layers, dim 768, 12 heads, vocab 50257, context 1024
"""
import argparse
import inspect
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn as nn

import onnx
from onnx import numpy_helper


# ---------------------------------------------------------------------------
# BERT-style encoder

class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, ffn, eps):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.ff1 = nn.Linear(dim, ffn)
        self.ff2 = nn.Linear(ffn, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, Dh]

    def forward(self, x, add_mask):
        b, s, d = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + add_mask  # [B, 1, 1, S] broadcast over heads and queries
        p = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(p, v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(ctx))
        h = self.ff1(x)
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))  # GELU, erf form
        return self.ln2(x + self.ff2(h))


class BertEncoder(nn.Module):
    """Inputs: input_ids int64 [B, S]; attention_mask float32 [B, S], additive
    (0 for tokens attended to, a large negative value such as -10000 for padding).
    Outputs: last_hidden_state [B, S, D]; pooled [B, D] (tanh dense on token 0)."""

    def __init__(self, vocab, max_pos, dim, layers, heads, ffn, eps=1e-12):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_pos, dim)
        self.ln = nn.LayerNorm(dim, eps=eps)
        self.layers = nn.ModuleList([EncoderLayer(dim, heads, ffn, eps) for _ in range(layers)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        m = attention_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, m)
        pooled = torch.tanh(self.pool(x[:, 0]))
        return x, pooled


# ---------------------------------------------------------------------------
# GPT-2-style decoder

class DecoderBlock(nn.Module):
    def __init__(self, dim, heads, eps):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x, causal):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = torch.where(causal, scores, torch.tensor(torch.finfo(scores.dtype).min))
        p = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(p, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(ctx)
        h = self.fc(self.ln2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.fc_out(h)


class Gpt2Decoder(nn.Module):
    """Input: input_ids int64 [B, S]. Output: logits [B, S, vocab]. The causal mask
    is built in the graph from the sequence length; the LM head is the token
    embedding (tied)."""

    def __init__(self, vocab, ctx, dim, layers, heads, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList([DecoderBlock(dim, heads, eps) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim, eps=eps)

    def forward(self, input_ids):
        s = input_ids.shape[1]
        pos = torch.arange(s, dtype=torch.long, device=input_ids.device)
        causal = (pos[None, :] <= pos[:, None])[None, None]  # [1, 1, S, S], True = attend
        x = self.wte(input_ids) + self.wpe(pos)[None]
        for blk in self.blocks:
            x = blk(x, causal)
        x = self.ln_f(x)
        return torch.matmul(x, self.wte.weight.t())


# ---------------------------------------------------------------------------

def randomize_norms(model, gen):
    """Random affine and running statistics for the norm layers, so that a
    runtime that ignored them would fail."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def build_model(name, small, gen):
    if name == "resnet18":
        import torchvision
        nc = 100 if small else 1000
        m = torchvision.models.resnet18(weights=None, num_classes=nc)
        hw = 64 if small else 224
        spec = dict(inputs=[("input", "f32", ["batch", 3, hw, hw])],
                    outputs=["logits"],
                    dynamic={"input": {0: "batch"}, "logits": {0: "batch"}},
                    data_sets=[{"batch": 1}, {"batch": 3}] if small else [{"batch": 1}, {"batch": 2}],
                    config={"image": hw, "classes": nc})
    elif name == "bert":
        cfg = (dict(vocab=1000, max_pos=128, dim=64, layers=2, heads=4, ffn=256) if small else
               dict(vocab=30522, max_pos=512, dim=768, layers=12, heads=12, ffn=3072))
        m = BertEncoder(**cfg)
        spec = dict(inputs=[("input_ids", "i64", ["batch", "seq"]),
                            ("attention_mask", "f32", ["batch", "seq"])],
                    outputs=["last_hidden_state", "pooled"],
                    dynamic={"input_ids": {0: "batch", 1: "seq"},
                             "attention_mask": {0: "batch", 1: "seq"},
                             "last_hidden_state": {0: "batch", 1: "seq"},
                             "pooled": {0: "batch"}},
                    data_sets=([{"batch": 2, "seq": 16}, {"batch": 3, "seq": 7}] if small else
                               [{"batch": 1, "seq": 128}, {"batch": 2, "seq": 37}]),
                    config=cfg)
    elif name == "gpt2":
        cfg = (dict(vocab=512, ctx=64, dim=64, layers=2, heads=4) if small else
               dict(vocab=50257, ctx=1024, dim=768, layers=12, heads=12))
        m = Gpt2Decoder(**cfg)
        spec = dict(inputs=[("input_ids", "i64", ["batch", "seq"])],
                    outputs=["logits"],
                    dynamic={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                    data_sets=([{"batch": 2, "seq": 12}, {"batch": 1, "seq": 5}] if small else
                               [{"batch": 1, "seq": 128}, {"batch": 2, "seq": 37}]),
                    config=cfg)
    else:
        raise SystemExit(f"make_models: unknown model {name}")
    randomize_norms(m, gen)
    m.eval()
    return m, spec


def make_inputs(name, spec, ds, gen):
    arrs = []
    for iname, dt, dims in spec["inputs"]:
        shape = [ds[d] if isinstance(d, str) else d for d in dims]
        if iname == "input_ids":
            vocab = spec["config"]["vocab"]
            arrs.append(torch.randint(0, vocab, shape, generator=gen, dtype=torch.long))
        elif iname == "attention_mask":
            # additive: the last rows get trailing padding, one row is unpadded
            m = torch.zeros(shape, dtype=torch.float32)
            b, s = shape
            for r in range(1, b):
                keep = max(1, s - 3 * r)
                m[r, keep:] = -10000.0
            arrs.append(m)
        else:
            arrs.append(torch.randn(shape, generator=gen, dtype=torch.float32))
    return arrs


def op_types(model):
    ops = set()

    def walk(g):
        for n in g.node:
            ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)
    walk(model.graph)
    return sorted(ops)


def write_tensor(path, arr):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(arr).SerializeToString())


def export_one(name, m, spec, opset, outdir, with_data, seed):
    d = os.path.join(outdir, f"{name}_opset{opset}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    gen = torch.Generator().manual_seed(seed + 1)
    sets = spec["data_sets"]
    example = make_inputs(name, spec, sets[0], gen)
    in_names = [i[0] for i in spec["inputs"]]
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the TorchScript exporter (opsets 13 and 17); newer PyTorch defaults to dynamo
        kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
        torch.onnx.export(m, tuple(example), path, opset_version=opset,
                          input_names=in_names, output_names=spec["outputs"],
                          dynamic_axes=spec["dynamic"], do_constant_folding=True, **kw)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    graph_inputs = [i.name for i in model.graph.input
                    if i.name not in {t.name for t in model.graph.initializer}]
    graph_outputs = [o.name for o in model.graph.output]
    assert graph_inputs == in_names, (graph_inputs, in_names)
    assert graph_outputs == spec["outputs"], (graph_outputs, spec["outputs"])
    entry = {"name": f"{name}_opset{opset}", "model": name, "opset": opset,
             "dir": os.path.basename(d), "config": spec["config"],
             "inputs": [{"name": n, "dtype": dt, "dims": dims} for n, dt, dims in spec["inputs"]],
             "outputs": spec["outputs"], "op_types": op_types(model),
             "bytes": os.path.getsize(path), "data_sets": []}
    if with_data:
        gen = torch.Generator().manual_seed(seed + 1)
        for k, ds in enumerate(sets):
            ins = make_inputs(name, spec, ds, gen)
            with torch.no_grad():
                outs = m(*ins)
            if not isinstance(outs, (tuple, list)):
                outs = (outs,)
            sd = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(sd, exist_ok=True)
            for i, t in enumerate(ins):
                write_tensor(os.path.join(sd, f"input_{i}.pb"), t.numpy())
            for i, t in enumerate(outs):
                write_tensor(os.path.join(sd, f"output_{i}.pb"), t.numpy())
            entry["data_sets"].append({"dir": f"test_data_set_{k}",
                                       "inputs": {n: list(t.shape) for n, t in zip(in_names, ins)},
                                       "outputs": {n: list(t.shape) for n, t in zip(spec["outputs"], outs)}})
    print(f"{entry['name']}: {entry['bytes'] / 1e6:.1f} MB, {len(entry['op_types'])} op types, "
          f"{time.time() - t0:.1f}s", flush=True)
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--small", action="store_true", help="the small test configurations")
    ap.add_argument("--models", default="resnet18,bert,gpt2")
    ap.add_argument("--opsets", default="13,17")
    ap.add_argument("--no-data", action="store_true", help="model.onnx only, no test data sets")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.makedirs(a.outdir, exist_ok=True)
    mpath = os.path.join(a.outdir, "manifest.json")
    manifest = {"models": []}
    if os.path.exists(mpath):
        try:
            with open(mpath) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            pass
    entries = {e["name"]: e for e in manifest.get("models", [])}
    opsets = [int(x) for x in a.opsets.split(",") if x]
    for name in [x for x in a.models.split(",") if x]:
        gen = torch.Generator().manual_seed(a.seed)
        torch.manual_seed(a.seed)
        m, spec = build_model(name, a.small, gen)
        for opset in opsets:
            e = export_one(name, m, spec, opset, a.outdir, not a.no_data, a.seed)
            e["small"] = a.small
            entries[e["name"]] = e
    manifest = {"torch": torch.__version__, "onnx": onnx.__version__,
                "models": [entries[k] for k in sorted(entries)]}
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

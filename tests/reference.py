#!/usr/bin/python3
"""reference.py — an independent float64 forward pass for Turbine's tests.

Reads a Hugging Face folder (config.json + model.safetensors or an index and
shards; F32/F16/BF16) with its own safetensors reader, or a llama2.c .bin
checkpoint, and computes logits for every position of a token sequence:
embeddings, RMSNorm, q/k/v (+bias), RoPE (HF rotate_half layout, or the Meta
pair layout for llama2.c files; llama3/linear inv_freq scaling), GQA causal
attention, SiLU-gated MLP, final norm, lm_head (tied or not).

    reference.py --model DIR_OR_BIN --ids 1,2,3 [--out logits.npy] [--top 3]

Without --out it prints the top logits of the last position.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- readers

ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


def read_safetensors(path):
    """Returns {name: float32 array}."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n + 8 > len(buf):
        raise ValueError("%s: header length %d beyond the file" % (path, n))
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in ST_DTYPES:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, e["dtype"]))
        b, en = e["data_offsets"]
        if en > len(data):
            raise ValueError("%s: tensor %s data past the end" % (path, name))
        raw = np.frombuffer(data[b:en], dtype=ST_DTYPES[e["dtype"]])
        if e["dtype"] == "BF16":
            a = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            a = raw.astype(np.float32)
        out[name] = a.reshape(e["shape"])
    return out


def load_hf(d):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    arch = c["architectures"][0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        raise ValueError("unsupported architecture " + arch)
    idx = os.path.join(d, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            w.update(read_safetensors(os.path.join(d, fn)))
    else:
        w = read_safetensors(os.path.join(d, "model.safetensors"))
    H = c["num_attention_heads"]
    cfg = dict(
        dim=c["hidden_size"], hidden=c["intermediate_size"], layers=c["num_hidden_layers"],
        heads=H, kv_heads=c.get("num_key_value_heads") or H,
        head_dim=c.get("head_dim") or c["hidden_size"] // H, vocab=c["vocab_size"],
        eps=c.get("rms_norm_eps", 1e-6), theta=c.get("rope_theta", 10000.0),
        scaling=c.get("rope_scaling"), interleaved=False,
        tie=c.get("tie_word_embeddings", False) or "lm_head.weight" not in w)
    return cfg, w


def load_llama2c(path):
    with open(path, "rb") as f:
        buf = f.read()
    dim, hidden, L, H, KV, V, seq = struct.unpack_from("<7i", buf, 0)
    shared = V > 0
    V = abs(V)
    hd = dim // H
    kv = KV * hd
    a = np.frombuffer(buf, dtype="<f4", offset=28)
    pos = [0]

    def take(*shape):
        n = int(np.prod(shape))
        t = a[pos[0]:pos[0] + n].reshape(shape)
        pos[0] += n
        return t

    emb = take(V, dim)
    att, wq, wk, wv = take(L, dim), take(L, dim, dim), take(L, kv, dim), take(L, kv, dim)
    wo, ffn = take(L, dim, dim), take(L, dim)
    w1, w2, w3 = take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    fin = take(dim)
    take(seq, hd // 2)
    take(seq, hd // 2)
    w = {"model.embed_tokens.weight": emb, "model.norm.weight": fin}
    if not shared:
        w["lm_head.weight"] = take(V, dim)
    if pos[0] != a.size:
        raise ValueError("%s: size does not match its header" % path)
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = att[i]
        w[p + "self_attn.q_proj.weight"] = wq[i]
        w[p + "self_attn.k_proj.weight"] = wk[i]
        w[p + "self_attn.v_proj.weight"] = wv[i]
        w[p + "self_attn.o_proj.weight"] = wo[i]
        w[p + "post_attention_layernorm.weight"] = ffn[i]
        w[p + "mlp.gate_proj.weight"] = w1[i]
        w[p + "mlp.down_proj.weight"] = w2[i]
        w[p + "mlp.up_proj.weight"] = w3[i]
    cfg = dict(dim=dim, hidden=hidden, layers=L, heads=H, kv_heads=KV, head_dim=hd,
               vocab=V, eps=1e-5, theta=10000.0, scaling=None, interleaved=True,
               tie=shared)
    return cfg, w


def load_model(path):
    return load_hf(path) if os.path.isdir(path) else load_llama2c(path)


# ---------------------------------------------------------------- model


def inv_freq(cfg):
    hd = cfg["head_dim"]
    f = 1.0 / (cfg["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    s = cfg["scaling"]
    if not s:
        return f
    kind = s.get("rope_type", s.get("type"))
    if kind == "default":
        return f
    if kind == "linear":
        return f / s["factor"]
    if kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        out = np.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        return np.where(medium, smoothed, out)
    raise ValueError("unsupported rope scaling %s" % kind)


def rope(x, freqs, interleaved):
    """x: (T, heads, hd); freqs: (T, hd/2) angles."""
    c, s = np.cos(freqs)[:, None, :], np.sin(freqs)[:, None, :]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def linear(x, w, b=None):
    y = x @ w.astype(np.float64).T
    return y if b is None else y + b.astype(np.float64)


def forward(cfg, w, ids):
    """Logits (T, vocab) float64 for every position of `ids`."""
    ids = np.asarray(ids, dtype=np.int64)
    T, H, KV, hd = len(ids), cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    if ids.min() < 0 or ids.max() >= cfg["vocab"]:
        raise ValueError("token id out of range [0, %d)" % cfg["vocab"])
    emb = w["model.embed_tokens.weight"]
    x = emb[ids].astype(np.float64)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq(cfg)[None, :]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        h = rmsnorm(x, w[p + "input_layernorm.weight"], cfg["eps"])
        q = linear(h, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias"))
        k = linear(h, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias"))
        v = linear(h, w[p + "self_attn.v_proj.weight"], w.get(p + "self_attn.v_proj.bias"))
        q = rope(q.reshape(T, H, hd), ang, cfg["interleaved"])
        k = rope(k.reshape(T, KV, hd), ang, cfg["interleaved"])
        v = v.reshape(T, KV, hd)
        att = np.empty((T, H, hd))
        g = H // KV
        for hh in range(H):
            kh = hh // g
            sc = q[:, hh, :] @ k[:, kh, :].T / math.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            sc /= sc.sum(axis=-1, keepdims=True)
            att[:, hh, :] = sc @ v[:, kh, :]
        x = x + linear(att.reshape(T, H * hd), w[p + "self_attn.o_proj.weight"])
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], cfg["eps"])
        gt = linear(h, w[p + "mlp.gate_proj.weight"])
        up = linear(h, w[p + "mlp.up_proj.weight"])
        x = x + linear(gt / (1.0 + np.exp(-gt)) * up, w[p + "mlp.down_proj.weight"])
    x = rmsnorm(x, w["model.norm.weight"], cfg["eps"])
    head = emb if cfg["tie"] else w["lm_head.weight"]
    return linear(x, head)


def parse_ids(s):
    return [int(t) for t in s.replace(",", " ").split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF folder or llama2.c .bin")
    ap.add_argument("--ids", required=True, help="token ids, comma or space separated")
    ap.add_argument("--out", help="write float32 logits (T, vocab) as .npy")
    ap.add_argument("--top", type=int, default=3, help="top logits to print")
    a = ap.parse_args()
    cfg, w = load_model(a.model)
    logits = forward(cfg, w, parse_ids(a.ids))
    if a.out:
        np.save(a.out, logits.astype(np.float32))
    last = logits[-1]
    top = np.argsort(-last)[:a.top]
    print(" ".join("%d:%.6f" % (t, last[t]) for t in top))
    return 0


# ---------------------------------------------------------------- calibration
# TensorRT's entropy calibration (IInt8EntropyCalibrator2), written apart from
# src/tune/calib.c to check it: for each cut-off i in [levels, n], P = the
# first i bins with the mass beyond folded into bin i - 1; Q = the first i
# bins before the fold, merged into `levels` groups of i // levels bins (the
# last takes the remainder), each group's mass spread evenly over the bins
# where P is non-zero; KL(P || Q) of the normalised pair (infinite where Q is
# 0 and P is not); the least KL (first on ties) gives threshold (i + 0.5) * w.

def calib_entropy(hist, amax, levels=128):
    h = np.asarray(hist, dtype=np.float64)
    n = len(h)
    tail = np.concatenate([np.cumsum(h[::-1])[::-1], [0.0]])  # tail[i] = sum(h[i:])
    best_kl, best_i = math.inf, n
    for i in range(levels, n + 1):
        p = h[:i].copy()
        p[-1] += tail[i]
        group = np.minimum(np.arange(i) // (i // levels), levels - 1)
        nonzero = p != 0
        mass = np.bincount(group, weights=h[:i], minlength=levels)
        count = np.bincount(group, weights=nonzero.astype(np.float64), minlength=levels)
        q = np.where(nonzero, mass[group] / np.maximum(count[group], 1.0), 0.0)
        keep = p > 0
        if q.sum() <= 0 or np.any(q[keep] <= 0):
            continue  # infinite divergence
        pn, qn = p / p.sum(), q / q.sum()
        kl = float(np.sum(pn[keep] * np.log(pn[keep] / qn[keep])))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i, (best_i + 0.5) * amax / n


def calib_main(argv):
    """reference.py calib-entropy FILE: FILE holds amax, then the bin counts
    (white space separated); prints "i threshold" of the entropy calibrator."""
    with open(argv[0]) as f:
        vals = [float(t) for t in f.read().split()]
    i, t = calib_entropy(vals[1:], vals[0])
    print("%d %.17g" % (i, t))
    return 0


if __name__ == "__main__":
    sys.exit(calib_main(sys.argv[2:]) if sys.argv[1:2] == ["calib-entropy"] else main())

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

    reference.py --quant-check DIR

checks the weight quantisers (core/quant.h) against the functions below:
DIR holds cases written by test_quant_ref (case_N.json naming dtype, shape,
group and asym; case_N.w the f32 weight; case_N.codes/.scales/.zeros what
the C quantiser made). Codes and scales must be equal bit for bit, the
dequantised values within half a step of the weight (float64). Prints one
line per case and exits 1 on the first mismatch.
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


# ---------------------------------------------------------------- quantisers
# The encodings of core/quant.h. Scales, zeros and the division by the scale
# are f32 operations as the encoding defines them (IEEE division rounds once
# in numpy as in C); rounding is to nearest, ties to even (np.rint);
# dequantisation and the error bounds are float64.

def _f32(x):
    return np.float32(x)


def fp8_e4m3_values():
    """The 127 non-negative finite e4m3fn values, indexed by code 0..0x7e."""
    v = []
    for c in range(0x7f):
        e, m = c >> 3, c & 7
        v.append(m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(v)


def fp8_e4m3_encode(x):
    """Nearest e4m3fn code (ties to the even code), saturating at 448."""
    vals = fp8_e4m3_values()
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    idx = np.searchsorted(vals, a)            # vals[idx-1] < a <= vals[idx]
    hi = np.minimum(idx, len(vals) - 1)
    lo = np.maximum(idx - 1, 0)
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def fp8_e4m3_decode(c):
    vals = fp8_e4m3_values()
    c = np.asarray(c, dtype=np.int64)
    v = vals[np.minimum(c & 0x7f, 0x7e)]
    return np.where(c & 0x80, -v, v)


def quantize_rows(dt, w, group, asym):
    """w (N, K) float32 -> codes (uint8 bytes as stored), scales (N, K/group)
    float32, zeros or None, following core/quant.h."""
    N, K = w.shape
    G = K // group
    wg = w.reshape(N, G, group).astype(np.float32)
    amax = np.abs(wg).max(axis=2)
    if dt == "i8":
        s = np.where(amax > 0, amax / _f32(127), _f32(1)).astype(np.float32)
        c = np.clip(np.rint(wg / s[..., None]), -127, 127).astype(np.int8)
        return c.reshape(N, K).view(np.uint8), s, None
    if dt == "fp8_e4m3":
        s = np.where(amax > 0, amax / _f32(448), _f32(1)).astype(np.float32)
        c = fp8_e4m3_encode((wg / s[..., None]).astype(np.float32))
        return c.reshape(N, K), s, None
    assert dt == "i4"
    if asym:
        mn, mx = wg.min(axis=2), wg.max(axis=2)
        s = np.where(mx > mn, (mx - mn) / _f32(15), _f32(1)).astype(np.float32)
        z = (mn + _f32(8) * s).astype(np.float32)
        c = np.clip(np.rint((wg - z[..., None]) / s[..., None]), -8, 7)
    else:
        s = np.where(amax > 0, amax / _f32(7), _f32(1)).astype(np.float32)
        z = None
        c = np.clip(np.rint(wg / s[..., None]), -7, 7)
    nib = (c.astype(np.int64).reshape(N, K) & 0xF).astype(np.uint8)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return packed, s, z


def dequantize_rows(dt, codes, s, z, K, group):
    N = s.shape[0]
    if dt == "i8":
        c = codes.view(np.int8).astype(np.float64).reshape(N, K)
    elif dt == "fp8_e4m3":
        c = fp8_e4m3_decode(codes).reshape(N, K)
    else:
        lo, hi = (codes & 0xF).astype(np.int64), (codes >> 4).astype(np.int64)
        c = np.empty((N, K), dtype=np.int64)
        c[:, 0::2], c[:, 1::2] = lo, hi
        c = np.where(c >= 8, c - 16, c).astype(np.float64)
    sg = np.repeat(s.astype(np.float64), group, axis=1)
    out = c * sg
    if z is not None:
        out += np.repeat(z.astype(np.float64), group, axis=1)
    return out


def dequant_bound(dt, w, s, group):
    """Largest error round-to-nearest allows per element (float64), with
    slack for the f32 operations: half a step (int8/int4: s/2; fp8: half the
    e4m3 spacing at the value, relative 2^-4, or 2^-10 s in the subnormals)."""
    N, K = w.shape
    sg = np.repeat(s.astype(np.float64), group, axis=1)
    if dt == "fp8_e4m3":
        b = np.maximum(np.abs(w.astype(np.float64)) * 2.0 ** -4, sg * 2.0 ** -10)
    else:
        b = sg / 2
    return b * (1 + 1e-5) + np.abs(w.astype(np.float64)) * 1e-6


def quant_check(d):
    cases = sorted(f for f in os.listdir(d) if f.endswith(".json"))
    if not cases:
        print("no cases in %s" % d)
        return 1
    for f in cases:
        meta = json.load(open(os.path.join(d, f)))
        base = os.path.join(d, f[:-5])
        N, K, group, asym, dt = meta["N"], meta["K"], meta["group"], meta["asym"], meta["dtype"]
        w = np.fromfile(base + ".w", dtype="<f4").reshape(N, K)
        codes = np.fromfile(base + ".codes", dtype=np.uint8)
        s = np.fromfile(base + ".scales", dtype="<f4").reshape(N, K // group)
        z = np.fromfile(base + ".zeros", dtype="<f4").reshape(N, K // group) if asym else None
        rc, rs, rz = quantize_rows(dt, w, group, asym)
        what = "%s %s N=%d K=%d group=%d%s" % (f[:-5], dt, N, K, group, " asym" if asym else "")
        if not np.array_equal(rs.view(np.uint32), s.view(np.uint32)):
            i = np.argwhere(rs.view(np.uint32) != s.view(np.uint32))[0]
            print("FAIL %s: scale %s is %r, reference %r" % (what, tuple(i), s[tuple(i)], rs[tuple(i)]))
            return 1
        if asym and not np.array_equal(rz.view(np.uint32), z.view(np.uint32)):
            print("FAIL %s: zeros differ" % what)
            return 1
        rc = rc.reshape(-1)
        if not np.array_equal(rc, codes):
            i = int(np.argwhere(rc != codes)[0][0])
            print("FAIL %s: code byte %d is 0x%02x, reference 0x%02x" % (what, i, codes[i], rc[i]))
            return 1
        dq = dequantize_rows(dt, codes.reshape(N, -1), s, z, K, group)
        err = np.abs(dq - w.astype(np.float64))
        bound = dequant_bound(dt, w, s, group)
        if np.any(err > bound):
            i = tuple(np.argwhere(err > bound)[0])
            print("FAIL %s: element %s dequantises to %r, weight %r (bound %g)" % (what, i, dq[i], w[i], bound[i]))
            return 1
        print("ok %s: codes and scales equal, worst error %.3g of its bound" % (what, float((err / bound).max())))
    return 0


def parse_ids(s):
    return [int(t) for t in s.replace(",", " ").split()]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--quant-check":
        return quant_check(sys.argv[2])
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

#!/usr/bin/python3
"""torch_baseline.py — the PyTorch (CPU, f32) baseline for Turbine's benchmarks.

Loads a Llama checkpoint, either a Hugging Face folder (config.json +
model.safetensors, read here without the safetensors or transformers
packages) or a llama2.c .bin, and runs a compact Llama forward pass with a KV
cache written directly in torch.

Modes:
  measure (default)  batch-1 greedy decode tok/s and prefill tok/s at each
                     thread count; prints one line "RESULT {json}".
  --greedy N         prints the N greedy token ids after --prompt-ids and the
                     top-3 logits at the last prompt position.
  --export-llama2c OUT  writes the checkpoint in llama2.c format (f32) for the
                     C peer, undoing the Hugging Face rotary permutation of
                     wq/wk so both programs compute the same function.

Run with Debian's interpreter: /usr/bin/python3 bench/torch_baseline.py DIR ...
Debian's torch and numpy call OpenBLAS, which starts its own threads when it
is loaded and ignores torch.set_num_threads; so a single --threads value also
fixes the BLAS thread count before the import, and a list of values is only
correct when the BLAS thread count is fixed from outside.
"""
import argparse
import json
import math
import os
import struct
import sys
import time


def _pin_blas_threads(argv):
    """Sets the BLAS/OpenMP thread count from a single --threads value."""
    for i, a in enumerate(argv):
        v = None
        if a.startswith("--threads="):
            v = a.split("=", 1)[1]
        elif a == "--threads" and i + 1 < len(argv):
            v = argv[i + 1]
        if v is not None and v.strip().isdigit():
            for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ[k] = v.strip()


_pin_blas_threads(sys.argv)

import numpy as np  # noqa: E402  (after the thread count is fixed)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ------------------------------------------------------------------ loading

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16,
             "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """Returns {name: float32 numpy array} from one .safetensors file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    (hlen,) = struct.unpack("<Q", bytes(raw[:8]))
    if hlen > 100 * 1024 * 1024 or 8 + hlen > raw.size:
        raise ValueError(f"{path}: bad header length {hlen}")
    header = json.loads(bytes(raw[8:8 + hlen]).decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        if base + e > raw.size or b > e:
            raise ValueError(f"{path}: {name}: data out of range")
        a = np.frombuffer(raw[base + b:base + e], dtype=dt).reshape(info["shape"])
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = np.array(a, dtype=np.float32)  # a writable copy
    return out


def permute_to_rotate_half(w, n_heads):
    """(n_heads*hd, dim) rows in adjacent-pair RoPE order -> rotate-half order."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, dim).transpose(0, 2, 1, 3).reshape(rows, dim)


def permute_to_adjacent_pairs(w, n_heads):
    """Inverse of permute_to_rotate_half."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, dim).transpose(0, 2, 1, 3).reshape(rows, dim)


def load_hf(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{folder}: no .safetensors file")
    t = {}
    for n in files:
        t.update(read_safetensors(os.path.join(folder, n)))
    c = {
        "dim": cfg["hidden_size"],
        "hidden": cfg["intermediate_size"],
        "n_layers": cfg["num_hidden_layers"],
        "n_heads": cfg["num_attention_heads"],
        "n_kv_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        "vocab": cfg["vocab_size"],
        "seq_len": cfg.get("max_position_embeddings", 2048),
        "eps": cfg.get("rms_norm_eps", 1e-5),
        "theta": cfg.get("rope_theta", 10000.0),
    }
    w = {"emb": t["model.embed_tokens.weight"], "norm": t["model.norm.weight"]}
    tied = "lm_head.weight" not in t
    w["lm_head"] = w["emb"] if tied else t["lm_head.weight"]
    c["tied"] = tied
    for l in range(c["n_layers"]):
        p = f"model.layers.{l}."
        w[f"{l}.attn_norm"] = t[p + "input_layernorm.weight"]
        w[f"{l}.ffn_norm"] = t[p + "post_attention_layernorm.weight"]
        for k in ("q", "k", "v", "o"):
            w[f"{l}.w{k}"] = t[p + f"self_attn.{k}_proj.weight"]
        w[f"{l}.gate"] = t[p + "mlp.gate_proj.weight"]
        w[f"{l}.up"] = t[p + "mlp.up_proj.weight"]
        w[f"{l}.down"] = t[p + "mlp.down_proj.weight"]
    return c, w


def load_llama2c(path):
    """A llama2.c checkpoint, converted to the Hugging Face RoPE layout."""
    raw = np.fromfile(path, dtype=np.uint8)
    dim, hidden, L, nh, nkv, vocab, seq = struct.unpack("<7i", bytes(raw[:28]))
    tied = vocab > 0
    vocab = abs(vocab)
    f = raw[28:28 + (raw.size - 28) // 4 * 4].view(np.float32)
    hd = dim // nh
    kv = hd * nkv
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        if off + n > f.size:
            raise ValueError(f"{path}: truncated")
        a = f[off:off + n].reshape(shape).copy()
        off += n
        return a

    w = {"emb": take(vocab, dim)}
    att_norm, wq, wk, wv, wo = take(L, dim), take(L, dim, dim), take(L, kv, dim), take(L, kv, dim), take(L, dim, dim)
    ffn_norm, w1, w2, w3 = take(L, dim), take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    w["norm"] = take(dim)
    take(seq, hd)  # legacy RoPE tables
    w["lm_head"] = w["emb"] if tied else take(vocab, dim)
    for l in range(L):
        w[f"{l}.attn_norm"], w[f"{l}.ffn_norm"] = att_norm[l], ffn_norm[l]
        w[f"{l}.wq"] = permute_to_rotate_half(wq[l], nh)
        w[f"{l}.wk"] = permute_to_rotate_half(wk[l], nkv)
        w[f"{l}.wv"], w[f"{l}.wo"] = wv[l], wo[l]
        w[f"{l}.gate"], w[f"{l}.down"], w[f"{l}.up"] = w1[l], w2[l], w3[l]
    c = {"dim": dim, "hidden": hidden, "n_layers": L, "n_heads": nh, "n_kv_heads": nkv,
         "vocab": vocab, "seq_len": seq, "eps": 1e-5, "theta": 10000.0, "tied": tied}
    return c, w


def load(path):
    return load_hf(path) if os.path.isdir(path) else load_llama2c(path)


def export_llama2c(c, w, out):
    """Writes the legacy (version 0) llama2.c format; RoPE tables are zeros."""
    if c["theta"] != 10000.0 or abs(c["eps"] - 1e-5) > 1e-12:
        print(f"warning: rope_theta={c['theta']} rms_norm_eps={c['eps']}; the llama2.c "
              "format assumes 10000 and 1e-5", file=sys.stderr)
    L, nh, nkv = c["n_layers"], c["n_heads"], c["n_kv_heads"]
    seq = min(c["seq_len"], 4096)
    hd = c["dim"] // nh
    with open(out, "wb") as f:
        f.write(struct.pack("<7i", c["dim"], c["hidden"], L, nh, nkv,
                            c["vocab"] if c["tied"] else -c["vocab"], seq))

        def put(a):
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())

        put(w["emb"])
        for l in range(L): put(w[f"{l}.attn_norm"])
        for l in range(L): put(permute_to_adjacent_pairs(w[f"{l}.wq"], nh))
        for l in range(L): put(permute_to_adjacent_pairs(w[f"{l}.wk"], nkv))
        for l in range(L): put(w[f"{l}.wv"])
        for l in range(L): put(w[f"{l}.wo"])
        for l in range(L): put(w[f"{l}.ffn_norm"])
        for l in range(L): put(w[f"{l}.gate"])
        for l in range(L): put(w[f"{l}.down"])
        for l in range(L): put(w[f"{l}.up"])
        put(w["norm"])
        put(np.zeros((seq, hd), np.float32))
        if not c["tied"]:
            put(w["lm_head"])

# ------------------------------------------------------------------ model


class Llama:
    """Batch-1 Llama forward with a preallocated KV cache."""

    def __init__(self, c, w):
        self.c = c
        T = lambda a: torch.from_numpy(np.ascontiguousarray(a))
        self.emb, self.norm, self.lm_head = T(w["emb"]), T(w["norm"]), T(w["lm_head"])
        self.layers = []
        for l in range(c["n_layers"]):
            self.layers.append({k: T(w[f"{l}.{k}"]) for k in
                                ("attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "gate", "up", "down")})
        self.hd = c["dim"] // c["n_heads"]
        self.kv_mul = c["n_heads"] // c["n_kv_heads"]
        self.inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.cache_len = 0

    def reset(self, max_len):
        c = self.c
        shape = (c["n_layers"], max_len, c["n_kv_heads"], self.hd)
        if self.cache_len < max_len:
            self.k_cache = torch.zeros(shape)  # (layer, pos, kv_head, hd)
            self.v_cache = torch.zeros(shape)
            self.cache_len = max_len

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["eps"]) * w

    def rope(self, x, cos, sin):
        # x: (T, heads, hd); cos, sin: (T, 1, hd)
        h = self.hd // 2
        rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        return x * cos + rot * sin

    def forward(self, tokens, pos0):
        """tokens: (T,) int64 -> logits of the last position, (vocab,)."""
        c = self.c
        T = tokens.shape[0]
        S = pos0 + T
        nh, nkv, hd = c["n_heads"], c["n_kv_heads"], self.hd
        pos = torch.arange(pos0, S, dtype=torch.float32)
        fr = torch.outer(pos, self.inv_freq)
        fr = torch.cat((fr, fr), dim=-1)
        cos, sin = fr.cos()[:, None, :], fr.sin()[:, None, :]
        mask = None
        if T > 1:
            mask = torch.full((T, S), float("-inf")).triu(pos0 + 1)  # (T, S)
        x = self.emb[tokens]  # (T, dim)
        for l, p in enumerate(self.layers):
            h = self.rmsnorm(x, p["attn_norm"])
            q = self.rope(F.linear(h, p["wq"]).view(T, nh, hd), cos, sin)
            k = self.rope(F.linear(h, p["wk"]).view(T, nkv, hd), cos, sin)
            v = F.linear(h, p["wv"]).view(T, nkv, hd)
            self.k_cache[l, pos0:S] = k
            self.v_cache[l, pos0:S] = v
            keys, vals = self.k_cache[l, :S], self.v_cache[l, :S]  # (S, nkv, hd)
            if self.kv_mul > 1:
                keys = keys.repeat_interleave(self.kv_mul, dim=1)
                vals = vals.repeat_interleave(self.kv_mul, dim=1)
            scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(hd)  # (nh, T, S)
            if mask is not None:
                scores = scores + mask
            att = torch.softmax(scores, dim=-1)
            o = torch.einsum("hts,shd->thd", att, vals).reshape(T, c["dim"])
            x = x + F.linear(o, p["wo"])
            h = self.rmsnorm(x, p["ffn_norm"])
            x = x + F.linear(F.silu(F.linear(h, p["gate"])) * F.linear(h, p["up"]), p["down"])
        x = self.rmsnorm(x[-1:], self.norm)
        return F.linear(x, self.lm_head)[0]

# ------------------------------------------------------------------ measurements


def greedy(m, prompt, n_gen):
    """Returns (ids, prompt_s, decode_s, top3 at the last prompt position)."""
    m.reset(len(prompt) + n_gen)
    t0 = time.perf_counter()
    logits = m.forward(torch.tensor(prompt, dtype=torch.long), 0)
    t1 = time.perf_counter()
    top = torch.topk(logits, 3)
    top3 = [(int(i), float(v)) for v, i in zip(top.values, top.indices)]
    ids = [int(torch.argmax(logits))]
    pos = len(prompt)
    for _ in range(n_gen - 1):
        logits = m.forward(torch.tensor(ids[-1:], dtype=torch.long), pos)
        ids.append(int(torch.argmax(logits)))
        pos += 1
    t2 = time.perf_counter()
    return ids, t1 - t0, t2 - t1, top3


def parse_ids(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="Hugging Face folder or llama2.c .bin")
    ap.add_argument("--threads", default="1", help="one count, or a list (see above)")
    ap.add_argument("--prompt-ids", default="1,9038,2501,263,931")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-ids", default="", help="comma-separated ids for the prefill measurement")
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--export-llama2c", default="")
    a = ap.parse_args()

    t0 = time.perf_counter()
    c, w = load(a.model)
    if a.export_llama2c:
        export_llama2c(c, w, a.export_llama2c)
        print(f"wrote {a.export_llama2c}", file=sys.stderr)
        return
    torch.set_grad_enabled(False)
    m = Llama(c, w)
    del w
    load_ms = (time.perf_counter() - t0) * 1e3
    prompt = parse_ids(a.prompt_ids)

    if a.greedy:
        ids, _, _, top3 = greedy(m, prompt, a.greedy)
        print("GREEDY " + " ".join(map(str, ids)))
        print("TOP3 " + " ".join(f"{i}:{v:.6f}" for i, v in top3))
        return

    prefill = parse_ids(a.prefill_ids)
    if len(parse_ids(a.threads)) > 1 and "OPENBLAS_NUM_THREADS" not in os.environ:
        print("warning: OpenBLAS keeps its default thread count for every --threads value",
              file=sys.stderr)
    res = {"torch": torch.__version__, "load_ms": round(load_ms, 1), "runs": []}
    for th in parse_ids(a.threads):
        torch.set_num_threads(th)
        greedy(m, prompt, 4)  # warm-up
        _, ps, ds, _ = greedy(m, prompt, a.decode_tokens)
        run = {"threads": th, "prompt_tokens": len(prompt), "gen_tokens": a.decode_tokens,
               "gen_tok_s": (a.decode_tokens - 1) / ds}
        if prefill:
            greedy(m, prefill[:32], 1)  # warm-up
            _, ps, _, _ = greedy(m, prefill, 1)
            run["prefill_tokens"] = len(prefill)
            run["prefill_tok_s"] = len(prefill) / ps
        res["runs"].append(run)
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in run.items()), file=sys.stderr)
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()

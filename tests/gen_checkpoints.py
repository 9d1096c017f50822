#!/usr/bin/python3
"""gen_checkpoints.py — random-weight Hugging Face checkpoints for tests.

Writes config.json and model.safetensors (or, for llama-sharded, an index and
two shards) with numpy only; the safetensors writer is hand-written here so
the tests do not depend on the safetensors package.

    gen_checkpoints.py --preset llama-gqa --dtype f32 --out DIR [--seed S] [--layers N]
    gen_checkpoints.py --list

--layers N replaces the preset's layer count and keeps every tensor's shape:
`--preset llama2-7b --dtype f16 --layers 2` is the 7B shape with 2 layers,
for measuring a builder's memory per layer on a machine that could not hold
the whole model.

Small presets draw Linear weights from N(0, 1/fan_in), embeddings from
N(0, 1) and biases from N(0, 0.25): activations stay O(1) and attention is far
from uniform, so a wrong RoPE layout, scaling, bias or GQA mapping moves the
logits by tens of percent, while rounding the weights to bf16 moves them by
under 1% (the bf16 tolerance is 2%). llama134m uses N(0, 0.02) like the
trained models it stands in for.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

BASE = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
    hidden_size=64, intermediate_size=172, num_hidden_layers=3,
    num_attention_heads=8, num_key_value_heads=2, vocab_size=512,
    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    rope_scaling=None, tie_word_embeddings=False, attention_bias=False,
    bos_token_id=1, eos_token_id=2,
)

PRESETS = {
    "llama-gqa": dict(),
    "llama-sharded": dict(_shards=2),
    "llama3-rope": dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, rope_theta=500000.0, tie_word_embeddings=True,
        # head_dim 16: wavelengths 6 and 33 stay, 174 is smoothed, the rest scaled.
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=256),
        eos_token_id=[2, 3]),
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2",
        intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=4096,
        max_window_layers=2, attention_bias=None),
    "mistral": dict(
        architectures=["MistralForCausalLM"], model_type="mistral",
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=512, sliding_window=None, attention_bias=None),
    "llama-wide": dict(  # a vocabulary wider than a GPU block's threads
        num_hidden_layers=1, vocab_size=40000),
    "llama134m": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=12, vocab_size=32000,
        max_position_embeddings=1024, _std=0.02),
}

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def preset_config(name, dtype):
    cfg = dict(BASE)
    cfg.update(PRESETS[name])
    cfg = {k: v for k, v in cfg.items()
           if v is not None or k in ("rope_scaling", "sliding_window")}
    cfg["torch_dtype"] = DTYPES[dtype]
    return cfg


def make_weights(cfg, rng):
    """Returns an ordered list of (name, float32 array)."""
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, KV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    hd = cfg.get("head_dim", D // H)
    fixed = cfg.get("_std")
    qwen = cfg["architectures"][0] == "Qwen2ForCausalLM"

    def lin(out, inp):
        std = fixed if fixed else 1.0 / np.sqrt(inp)
        return (rng.standard_normal((out, inp)) * std).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * (0.02 if fixed else 0.1)).astype(np.float32)

    def bias(n):
        return (rng.standard_normal(n) * (0.02 if fixed else 0.5)).astype(np.float32)

    w = [("model.embed_tokens.weight",
          (rng.standard_normal((V, D)) * (fixed if fixed else 1.0)).astype(np.float32))]
    for i in range(L):
        p = "model.layers.%d." % i
        w.append((p + "input_layernorm.weight", norm(D)))
        w.append((p + "self_attn.q_proj.weight", lin(H * hd, D)))
        w.append((p + "self_attn.k_proj.weight", lin(KV * hd, D)))
        w.append((p + "self_attn.v_proj.weight", lin(KV * hd, D)))
        if qwen:
            w.append((p + "self_attn.q_proj.bias", bias(H * hd)))
            w.append((p + "self_attn.k_proj.bias", bias(KV * hd)))
            w.append((p + "self_attn.v_proj.bias", bias(KV * hd)))
        w.append((p + "self_attn.o_proj.weight", lin(D, H * hd)))
        w.append((p + "post_attention_layernorm.weight", norm(D)))
        w.append((p + "mlp.gate_proj.weight", lin(F, D)))
        w.append((p + "mlp.up_proj.weight", lin(F, D)))
        w.append((p + "mlp.down_proj.weight", lin(D, F)))
    w.append(("model.norm.weight", norm(D)))
    if not cfg["tie_word_embeddings"]:
        w.append(("lm_head.weight", lin(V, D)))
    return w


def f32_to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(a)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    return r


def encode(a, dtype):
    """Returns (safetensors dtype name, little-endian bytes)."""
    if dtype == "f32":
        return "F32", np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "f16":
        return "F16", np.ascontiguousarray(a.astype("<f2")).tobytes()
    if dtype == "bf16":
        return "BF16", f32_to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, st_dtype, shape, bytes). Header padded to 8."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, st, shape, data in tensors:
        header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, data in tensors:
            f.write(data)


def generate(preset, dtype, out, seed=0, layers=None):
    cfg = preset_config(preset, dtype)
    if layers:
        cfg["num_hidden_layers"] = layers
    rng = np.random.default_rng(seed)
    weights = make_weights(cfg, rng)
    os.makedirs(out, exist_ok=True)
    for stale in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(out, stale)):
            os.remove(os.path.join(out, stale))
    shards = cfg.pop("_shards", 1)
    cfg.pop("_std", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    enc = [(n,) + encode(a, dtype) for n, a in weights]
    enc = [(n, st, a.shape, b) for (n, st, b), (_, a) in zip(enc, weights)]
    meta = {"format": "pt", "generator": "turbine gen_checkpoints.py",
            "preset": preset, "seed": str(seed)}
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), enc, meta)
    else:
        per = (len(enc) + shards - 1) // shards
        weight_map, total = {}, 0
        for s in range(shards):
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            part = enc[s * per:(s + 1) * per]
            write_safetensors(os.path.join(out, fname), part, meta)
            for n, _, _, b in part:
                weight_map[n] = fname
                total += len(b)
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return cfg


# ---------------------------------------------------------------- big shapes
# A Llama-2-7B-shaped checkpoint is 13.5 GB in f16: more than a test machine
# holds as float32 arrays. These are written tensor by tensor from a pool of
# N(0, 0.02) values (each tensor a window of it at a random offset): right
# shapes, sizes and magnitudes for build-size and memory measurements, not a
# model anyone would sample from.
BIG = {
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                      max_position_embeddings=4096, tie_word_embeddings=False, _shards=3),
    "llama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                     max_position_embeddings=2048, tie_word_embeddings=False, _shards=2),
}


def big_shapes(cfg):
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, KV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    hd = D // H
    t = [("model.embed_tokens.weight", (V, D))]
    for i in range(L):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", (D,)), (p + "self_attn.q_proj.weight", (H * hd, D)),
              (p + "self_attn.k_proj.weight", (KV * hd, D)), (p + "self_attn.v_proj.weight", (KV * hd, D)),
              (p + "self_attn.o_proj.weight", (D, H * hd)), (p + "post_attention_layernorm.weight", (D,)),
              (p + "mlp.gate_proj.weight", (F, D)), (p + "mlp.up_proj.weight", (F, D)),
              (p + "mlp.down_proj.weight", (D, F))]
    t += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    return t


def generate_big(preset, out, seed=0, layers=None):
    """f16 only, sharded; never more than the pool (128 MiB) in memory."""
    cfg = dict(BASE)
    cfg.update(BIG[preset])
    if layers:
        cfg["num_hidden_layers"] = layers
    cfg["torch_dtype"] = "float16"
    shards = cfg.pop("_shards")
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 26) * 0.02).astype("<f2")
    ones = np.ones(1 << 16, dtype="<f2")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shapes = big_shapes(cfg)
    per = (len(shapes) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = shapes[s * per:(s + 1) * per]
        header, off = {"__metadata__": {"format": "pt", "generator": "turbine gen_checkpoints.py " + preset}}, 0
        for name, shape in part:
            n = int(np.prod(shape)) * 2
            header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
            total += n
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for name, shape in part:
                n = int(np.prod(shape))
                if len(shape) == 1:  # norms: ones
                    f.write(ones[:n].tobytes())
                    continue
                at = int(rng.integers(len(pool)))
                while n > 0:
                    k = min(n, len(pool) - at)
                    f.write(pool[at:at + k].tobytes())
                    n -= k
                    at = 0
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS) + sorted(BIG))
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="layers instead of the preset's (tensor shapes unchanged)")
    ap.add_argument("--list", action="store_true", help="print the preset names")
    a = ap.parse_args()
    if a.list:
        print("\n".join(sorted(PRESETS) + sorted(BIG)))
        return 0
    if not a.preset or not a.out:
        ap.error("--preset and --out are required")
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be at least 1")
    if a.preset in BIG:
        if a.dtype != "f16":
            ap.error("%s is written in f16 only" % a.preset)
        generate_big(a.preset, a.out, a.seed, a.layers)
    else:
        generate(a.preset, a.dtype, a.out, a.seed, a.layers)
    print("wrote %s (%s, %s)" % (a.out, a.preset, a.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())

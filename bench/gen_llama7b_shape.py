#!/usr/bin/env python3
"""gen_llama7b_shape.py — a random Llama-2-7B-shape checkpoint (hidden 4096,
FFN 11008, 32 heads = kv heads, vocab 32000) in f16, as sharded safetensors
(one shard per layer group plus one for the embedding, norm and LM head, and
model.safetensors.index.json), written one tensor at a time so that making it
never holds more than one tensor in memory.

    gen_llama7b_shape.py --out DIR [--layers 32] [--layers-per-shard 4]

--layers below 32 keeps every tensor's shape and drops layers: the builder's
peak memory per layer can be measured on a machine that could not hold the
whole model, and extrapolated (bench/build_mem.sh). Values: a fixed 4 MiB
block of N(0, 0.02) f16 repeated (weights' values do not matter for memory or
time; norms are 1).
"""
import argparse
import json
import os
import struct

import numpy as np

D, F, H, V = 4096, 11008, 32, 32000


def tensors(layers):
    """(name, shape) in file order."""
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(layers):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (D,)), (p + "self_attn.q_proj.weight", (D, D)),
                (p + "self_attn.k_proj.weight", (D, D)), (p + "self_attn.v_proj.weight", (D, D)),
                (p + "self_attn.o_proj.weight", (D, D)), (p + "post_attention_layernorm.weight", (D,)),
                (p + "mlp.gate_proj.weight", (F, D)), (p + "mlp.up_proj.weight", (F, D)),
                (p + "mlp.down_proj.weight", (D, F))]
    out += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    return out


def write_shard(path, items, block):
    header, off = {}, 0
    for name, shape in items:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    ones = np.ones(D, dtype=np.float16).tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in items:
            n = int(np.prod(shape)) * 2
            if len(shape) == 1:
                f.write(ones[:n])
                continue
            while n > 0:
                k = min(n, len(block))
                f.write(block[:k])
                n -= k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--layers-per-shard", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    block = (np.random.default_rng(7).standard_normal(2 << 20) * 0.02).astype(np.float16).tobytes()
    ts = tensors(a.layers)
    groups = [[t for t in ts if not t[0].startswith("model.layers.")]]
    for l0 in range(0, a.layers, a.layers_per_shard):
        groups.append([t for t in ts if t[0].startswith("model.layers.") and
                       l0 <= int(t[0].split(".")[2]) < l0 + a.layers_per_shard])
    n = len(groups)
    wmap, total = {}, 0
    for i, g in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        write_shard(os.path.join(a.out, fname), g, block)
        for name, shape in g:
            wmap[name] = fname
            total += int(np.prod(shape)) * 2
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=1)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", hidden_size=D,
               intermediate_size=F, num_hidden_layers=a.layers, num_attention_heads=H, num_key_value_heads=H,
               vocab_size=V, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
               rope_scaling=None, tie_word_embeddings=False, attention_bias=False, bos_token_id=1,
               eos_token_id=2, torch_dtype="float16")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %d layers, %.2f GB of f16 weights in %d shards" % (a.out, a.layers, total / 1e9, n))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""torch_ckpt.py — random-weight Llama checkpoints of real model shapes, made
on the GPU, and the transformers eager FP16 baseline on the same weights.

    torch_ckpt.py --shape tinyllama|llama7b|llama3_8b_v32k|llama70b --out DIR [--layers N] [--hf-bench] [--copy-bw]
    torch_ckpt.py --shape llama70b --out DIR --empty

Writes DIR/config.json and DIR/model.safetensors (f16; Linear and embedding
weights N(0, 0.02) as transformers initialises them, norms 1). With
--hf-bench, times batch-1 greedy decode (ms/token, median, after a 16-token
prompt) and a 512-token prefill with LlamaForCausalLM in eager attention.
With --copy-bw, measures the device-to-device copy bandwidth (bytes read +
written). --layers N keeps the shape's widths with N layers (a quick check
of one layer's arithmetic without the depth's amplification). With --empty
(no torch needed), the weights are all zero and model.safetensors is a
sparse file: its header, then a hole as long as the tensors (no disk blocks),
so a shape larger than the disk (llama70b: ~138 GB of f16) can be built and
timed; `turbine build` skips its zero chunks and writes the engine's weights
as holes too. Zero weights give zero logits: use it for timing only. Results
are printed as 'key: value' lines.
"""
import argparse
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from gen_checkpoints import big_shapes  # noqa: E402  (name, shape) of a Llama checkpoint's tensors, in order

SHAPES = {
    "tinyllama": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=2048),
    "llama7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                    max_position_embeddings=4096),
    # Llama-3-8B's layers (8 KV heads: GQA groups of 4) with Llama 2's 32,000-token vocabulary, so that the
    # llama2 tokenizer serves it
    "llama3_8b_v32k": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                           max_position_embeddings=8192),
    # Llama-2-70B (GQA, 8 KV heads): 68.7 G parameters, ~138 GB in f16: more than one H200 holds beside a KV
    # cache (issue 18's two-GPU shape; --empty, the device disk cannot hold it either)
    "llama70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                     num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                     max_position_embeddings=4096),
}


def config_for(shape):
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
               tie_word_embeddings=False, attention_bias=False, bos_token_id=1,
               eos_token_id=2, torch_dtype="float16")
    cfg.update(SHAPES[shape])
    return cfg


def write_empty(cfg, path):
    """model.safetensors of zero f16 tensors: the header, then a hole to the end (ftruncate)."""
    hdr, off = {}, 0
    for name, shape in big_shapes(cfg):
        n = 2
        for d in shape:
            n *= d
        hdr[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return off


def make_weights(cfg, gen):
    """Linear and embedding weights N(0, 0.02) drawn in big_shapes' order, norms 1."""
    import torch
    dev, dt = "cuda", torch.float16
    w = {}
    for name, shape in big_shapes(cfg):
        if len(shape) == 1:
            w[name] = torch.ones(*shape, device=dev, dtype=dt)
        else:
            w[name] = (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(dt)
    return w


def copy_bw():
    import torch
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(10):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    print("copy_bw_TBps: %.3f" % (2 * n / (ts[len(ts) // 2] * 1e-3) / 1e12))
    del a, b
    torch.cuda.empty_cache()


def hf_bench(cfg, weights):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    c = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    hc = LlamaConfig(**c)
    hc._attn_implementation = "eager"
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(hc)
    torch.set_default_dtype(torch.float32)
    model.load_state_dict(weights, strict=False)
    model.eval()
    V = cfg["vocab_size"]
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        # prefill 512
        ids = torch.randint(3, V, (1, 512), device="cuda", generator=g)
        ts = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts = sorted(ts[1:])
        print("hf_prefill512_ms: %.3f" % ts[len(ts) // 2])
        # decode after a 16-token prompt
        ids = torch.randint(3, V, (1, 16), device="cuda", generator=g)
        out = model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        ts = []
        for _ in range(128):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            tok.item()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts = sorted(ts[8:])
        print("hf_decode_ms: %.3f" % ts[len(ts) // 2])
    del model
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hf-bench", action="store_true")
    ap.add_argument("--copy-bw", action="store_true")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--empty", action="store_true", help="zero weights in a sparse file (timing only)")
    a = ap.parse_args()
    if a.empty and a.hf_bench:
        ap.error("--hf-bench needs real weights (not --empty)")
    if a.copy_bw:
        copy_bw()
    cfg = config_for(a.shape)
    if a.layers > 0:
        cfg["num_hidden_layers"] = a.layers
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if a.empty:
        n = write_empty(cfg, os.path.join(a.out, "model.safetensors"))
        print("ckpt_bytes: %d (zero, sparse)" % n)
        print("ckpt_seconds: %.1f" % (time.time() - t0))
        return
    import torch
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = make_weights(cfg, gen)
    from safetensors.torch import save_file
    save_file({k: v.cpu() for k, v in w.items()}, os.path.join(a.out, "model.safetensors"))
    print("ckpt_seconds: %.1f" % (time.time() - t0))
    if a.hf_bench:
        hf_bench(cfg, w)


if __name__ == "__main__":
    main()

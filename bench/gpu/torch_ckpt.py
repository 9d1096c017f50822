#!/usr/bin/env python3
"""torch_ckpt.py — random-weight Llama checkpoints of real model shapes, made
on the GPU, and the transformers eager FP16 baseline on the same weights.

    torch_ckpt.py --shape tinyllama|llama7b|llama3_8b_v32k --out DIR [--layers N] [--hf-bench] [--copy-bw]

Writes DIR/config.json and DIR/model.safetensors (f16; Linear and embedding
weights N(0, 0.02) as transformers initialises them, norms 1). With
--hf-bench, times batch-1 greedy decode (ms/token, median, after a 16-token
prompt) and a 512-token prefill with LlamaForCausalLM in eager attention.
With --copy-bw, measures the device-to-device copy bandwidth (bytes read +
written). --layers N keeps the shape's widths with N layers (a quick check
of one layer's arithmetic without the depth's amplification). Results are
printed as 'key: value' lines.
"""
import argparse
import json
import os
import time

import torch

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
}


def config_for(shape):
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
               tie_word_embeddings=False, attention_bias=False, bos_token_id=1,
               eos_token_id=2, torch_dtype="float16")
    cfg.update(SHAPES[shape])
    return cfg


def make_weights(cfg, gen):
    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, KV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    hd = D // H
    dev, dt = "cuda", torch.float16

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(dt)

    w = {"model.embed_tokens.weight": rnd(V, D)}
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = torch.ones(D, device=dev, dtype=dt)
        w[p + "self_attn.q_proj.weight"] = rnd(H * hd, D)
        w[p + "self_attn.k_proj.weight"] = rnd(KV * hd, D)
        w[p + "self_attn.v_proj.weight"] = rnd(KV * hd, D)
        w[p + "self_attn.o_proj.weight"] = rnd(D, H * hd)
        w[p + "post_attention_layernorm.weight"] = torch.ones(D, device=dev, dtype=dt)
        w[p + "mlp.gate_proj.weight"] = rnd(F, D)
        w[p + "mlp.up_proj.weight"] = rnd(F, D)
        w[p + "mlp.down_proj.weight"] = rnd(D, F)
    w["model.norm.weight"] = torch.ones(D, device=dev, dtype=dt)
    w["lm_head.weight"] = rnd(V, D)
    return w


def copy_bw():
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
    a = ap.parse_args()
    if a.copy_bw:
        copy_bw()
    cfg = config_for(a.shape)
    if a.layers > 0:
        cfg["num_hidden_layers"] = a.layers
    gen = torch.Generator(device="cuda").manual_seed(0)
    t0 = time.time()
    w = make_weights(cfg, gen)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    from safetensors.torch import save_file
    save_file({k: v.cpu() for k, v in w.items()}, os.path.join(a.out, "model.safetensors"))
    print("ckpt_seconds: %.1f" % (time.time() - t0))
    if a.hf_bench:
        hf_bench(cfg, w)


if __name__ == "__main__":
    main()

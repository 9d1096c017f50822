#!/usr/bin/python3
"""quant_dequant.py — the f32 twin of a quantized engine, for test_quant_engines.sh.

    quant_dequant.py SRC_DIR OUT_DIR DTYPE [GROUP [asym]]

Reads a Hugging Face checkpoint (reference.py's reader), replaces every
projection weight (q, k, v, o, gate, up, down) by dequantize(quantize(W))
with reference.py's quantisers (the same encodings the builder uses,
checked bit for bit against core/quant.c by test_quant_ref), rounds the
embedding to f16 as a quantized build keeps it, gives the LM head the
dtype a quantized build gives it (f16 in int8 and fp8 engines, int8 with a
scale per row in int4 engines; a tied head becomes an untied copy), and writes an f32 checkpoint to OUT_DIR (config and tokenizer copied).
An engine built from it with --dtype f32 computes what the quantized engine
computes up to the order of float operations. Quantising q, k and v (gate
and up) apart equals quantising them stacked, as the build does: every
scale belongs to one output row. An int4 weight whose K is not a multiple
of GROUP is int8, as the build makes it.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402

PROJ = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
        "up_proj.weight", "down_proj.weight")


def read_all(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        w = {}
        for fn in sorted(set(json.load(open(idx))["weight_map"].values())):
            w.update(R.read_safetensors(os.path.join(d, fn)))
        return w
    return R.read_safetensors(os.path.join(d, "model.safetensors"))


def write_f32(path, tensors):
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def dq(w, dt, group, asym):
    K = w.shape[1]
    if dt == "i4" and K % group:
        dt = "i8"
    g = K if dt != "i4" else group
    codes, s, z = R.quantize_rows(dt, w.astype(np.float32), g, asym and dt == "i4")
    return R.dequantize_rows(dt, codes, s, z, K, g).astype(np.float32)


def main():
    src, out, dt = sys.argv[1], sys.argv[2], sys.argv[3]
    group = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    asym = len(sys.argv) > 5 and sys.argv[5] == "asym"
    w = read_all(src)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        if not f.endswith(".safetensors") and not f.endswith(".index.json"):
            shutil.copy(os.path.join(src, f), out)
    res = {}
    for name, a in w.items():
        if name.endswith(PROJ):
            res[name] = dq(a, dt, group, asym)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            res[name] = a.astype(np.float16).astype(np.float32)
        else:
            res[name] = a
    if dt == "i4":  # the head int8 (quantised from the source), untied
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        res["lm_head.weight"] = dq(head, "i8", 0, False)
        cfg_path = os.path.join(out, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["tie_word_embeddings"] = False
        json.dump(cfg, open(cfg_path, "w"), indent=2)
    write_f32(os.path.join(out, "model.safetensors"), res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

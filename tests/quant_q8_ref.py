#!/usr/bin/python3
"""quant_q8_ref.py — the logits a Q8 quantized engine should compute, for test_quant_engines.sh.

    quant_q8_ref.py TWIN_DIR IDS OUT.bin [--each] [--head-q8]

TWIN_DIR is the f32 twin of a quantized engine (quant_dequant.py: every
projection weight replaced by its dequantised values). This runs
reference.py's float64 forward over the token ids IDS (comma separated) with
the input of every projection (q, k, v, o, gate, up, down: the engine's
qmatmul nodes) rounded as the Q8 tactic rounds it (tb_ref_qmatmul_q8 in
src/backend/cpu/qgemm.c): the row taken to f32, per block of 32 along K (the
last block may be shorter) amax in f32, q = rint(f32(x * f32(127 / amax))),
d = f32(amax / 127), x replaced by q * d. The head's input is rounded too
with --head-q8 (an int4 engine's int8 head is a qmatmul); without it the
head is f16, not a qmatmul, and is not rounded. Writes the logits of every position,
(T, vocab) float32, to OUT.bin: what an engine built with --qmm-tactics q8
from the quantized checkpoint computes, up to the order of float operations
(f32 there, float64 here) and the few activations that the two land on
either side of a rounding half-step (about one in 40,000 here: one such
element moves the logits of its position, and through attention of every
later one, by as much as the whole rounding does). With --each every id is
a one-token sequence of its own (row i: the logits of id i alone), so a
rounding flip spoils one row only.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402


def q8_round(x):
    """x (T, K) -> the values the Q8 tactic multiplies (float64)."""
    x = np.asarray(x, dtype=np.float32)
    T, K = x.shape
    out = np.empty((T, K), dtype=np.float64)
    for k0 in range(0, K, 32):
        b = x[:, k0:k0 + 32]
        amax = np.abs(b).max(axis=1)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        q = np.clip(np.rint((b * inv[:, None]).astype(np.float32)), -127, 127)
        d = (amax / np.float32(127.0)).astype(np.float32)
        out[:, k0:k0 + 32] = q.astype(np.float64) * d.astype(np.float64)[:, None]
    return out


def main():
    flags = sys.argv[4:]
    each, head_q8 = "--each" in flags, "--head-q8" in flags
    if len(sys.argv) < 4 or any(f not in ("--each", "--head-q8") for f in flags):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    cfg, w = R.load_model(sys.argv[1])
    ids = R.parse_ids(sys.argv[2])
    proj = {id(v) for k, v in w.items() if k.endswith(("_proj.weight",))}
    if head_q8:
        proj.add(id(w["model.embed_tokens.weight"] if cfg["tie"] else w["lm_head.weight"]))
    exact = R.linear

    def linear(x, wt, b=None):
        return exact(q8_round(x) if id(wt) in proj else x, wt, b)

    R.linear = linear
    logits = np.concatenate([R.forward(cfg, w, [i]) for i in ids]) if each else R.forward(cfg, w, ids)
    logits.astype("<f4").tofile(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())

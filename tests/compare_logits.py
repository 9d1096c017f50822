#!/usr/bin/python3
"""compare_logits.py — checks Turbine's logits against reference.py.

The logits file holds raw little-endian f32 rows of `vocab` floats, one per
evaluated position: the prompt positions first, then each generated token
that was fed back. Generated tokens are rebuilt as the argmax of the rows from
the last prompt row on, so the reference runs the same token path Turbine
took even where near-ties could flip a greedy choice.

    compare_logits.py --model DIR_OR_BIN --logits L.bin --prompt-ids 5,6,7 \
        [--tol 1e-4] [--vocab V] [--quiet]

Prints max|a-b| / max|b| per row and overall; exits 1 above --tol, 2 when the
inputs are unusable.

Against another engine instead of reference.py (a GPU engine against the
CPU engine of the same checkpoint and dtype, say), with the same token path:

    compare_logits.py --logits A.bin --prompt-ids IDS --vocab V --print-ids
        prints the path A took (the prompt, then its greedy tokens) as ids;
    run the reference engine on that path as its prompt (--logits-out B.bin),
    then
    compare_logits.py --logits A.bin --prompt-ids IDS --vocab V --ref-logits B.bin
        compares A's rows with B's first rows (B may hold more: the row of the
        token it generated after the path); --model is not needed then.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="the checkpoint reference.py runs (not with --ref-logits)")
    ap.add_argument("--logits", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--vocab", type=int, help="row length (default: the model's)")
    ap.add_argument("--quiet", action="store_true", help="only the summary line")
    ap.add_argument("--ref-logits", help="the reference rows: another engine's logits over the same token path")
    ap.add_argument("--print-ids", action="store_true", help="print the token path of --logits and exit")
    a = ap.parse_args()

    cfg, w = None, None
    if a.model and not a.ref_logits and not a.print_ids:
        cfg, w = reference.load_model(a.model)
    elif a.model and not a.vocab:
        cfg, _ = reference.load_model(a.model)
    elif not a.vocab or not (a.ref_logits or a.print_ids):
        ap.error("--model, or --vocab with --ref-logits or --print-ids")
    V = a.vocab or cfg["vocab"]
    prompt = reference.parse_ids(a.prompt_ids)
    P = len(prompt)
    raw = np.fromfile(a.logits, dtype="<f4")
    if P == 0 or raw.size == 0 or raw.size % V:
        print("FAIL: %s holds %d floats, not a whole number of %d-float rows (or no prompt)"
              % (a.logits, raw.size, V))
        return 2
    got = raw.reshape(-1, V).astype(np.float64)
    R = got.shape[0]
    if R < P:
        print("FAIL: %d logit rows for a %d-token prompt (expected one row per prompt "
              "position, then one per fed-back token)" % (R, P))
        return 2
    if not np.all(np.isfinite(got)):
        bad = int(np.argmax(~np.isfinite(got).all(axis=1)))
        print("FAIL: row %d holds NaN or Inf" % bad)
        return 1
    gen = [int(t) for t in np.argmax(got[P - 1:], axis=1)]
    seq = prompt + gen[:R - P]
    if a.print_ids:
        print(",".join(str(t) for t in seq))
        return 0
    if a.ref_logits:
        rraw = np.fromfile(a.ref_logits, dtype="<f4")
        if rraw.size % V or rraw.size // V < R:
            print("FAIL: %s holds %d floats, not %d or more rows of %d (run the reference on the "
                  "%d-token path of --print-ids)" % (a.ref_logits, rraw.size, R, V, R))
            return 2
        ref = rraw.reshape(-1, V)[:R].astype(np.float64)
        if not np.all(np.isfinite(ref)):
            print("FAIL: the reference rows hold NaN or Inf")
            return 2
    else:
        ref = reference.forward(cfg, w, seq)

    worst, worst_row, flips = 0.0, 0, 0
    for r in range(R):
        err = np.abs(got[r] - ref[r]).max() / max(np.abs(ref[r]).max(), 1e-30)
        if int(np.argmax(ref[r])) != int(np.argmax(got[r])):
            flips += 1
        if err > worst:
            worst, worst_row = err, r
        if not a.quiet:
            kind = "prompt" if r < P else "gen"
            print("row %3d (%s, token %5d): rel err %.3e" % (r, kind, seq[r], err))
    status = "ok" if worst <= a.tol else "FAIL"
    print("%s: %d rows (%d prompt + %d generated), max rel err %.3e at row %d (tol %.1e), "
          "%d argmax differences" % (status, R, P, R - P, worst, worst_row, a.tol, flips))
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())

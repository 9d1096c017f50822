#!/usr/bin/python3
"""hf_logits.py — checks Turbine's logits against transformers' own model.

For each case (a line of the --cases file: NAME MODEL_DIR LOGITS_FILE
PROMPT_IDS TOL), loads the Hugging Face checkpoint MODEL_DIR with
transformers (AutoModelForCausalLM, float32, on the GPU when there is one,
TF32 off), rebuilds the token path Turbine took (the prompt, then the argmax
of each logits row from the last prompt row on, as tests/compare_logits.py
does), runs it in one causal forward pass and compares every row:
max|turbine - hf| / max|hf| per row, against TOL.

Prints a line per case and a last line "hf: P passed, F failed"; exits 1 when
any case fails, 2 when transformers is missing.
"""
import argparse
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", required=True, help="file of NAME MODEL_DIR LOGITS PROMPT_IDS TOL lines")
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("hf: transformers not available (%s)" % e)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    passed = failed = 0
    for line in open(a.cases):
        f = line.split()
        if len(f) != 5:
            continue
        name, model_dir, logits, ids, tol = f[0], f[1], f[2], f[3], float(f[4])
        try:
            try:  # `dtype` since transformers 4.56, `torch_dtype` before
                m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            except TypeError:
                m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
            m = m.float().to(dev).eval()
            V = m.config.vocab_size
            got = np.fromfile(logits, dtype="<f4")
            if got.size == 0 or got.size % V:
                raise ValueError("%s: %d floats, not whole rows of %d" % (logits, got.size, V))
            got = got.reshape(-1, V).astype(np.float64)
            prompt = [int(t) for t in ids.split(",") if t]
            P, R = len(prompt), got.shape[0]
            gen = [int(t) for t in np.argmax(got[P - 1:], axis=1)]
            seq = prompt + gen[:R - P]
            with torch.no_grad():
                out = m(torch.tensor([seq], device=dev)).logits[0].double().cpu().numpy()
            worst, flips = 0.0, 0
            for r in range(R):
                err = np.abs(got[r] - out[r]).max() / max(np.abs(out[r]).max(), 1e-30)
                worst = max(worst, err)
                flips += int(np.argmax(out[r]) != np.argmax(got[r]))
            ok = worst <= tol
            passed += ok
            failed += not ok
            print("%s %s: %d rows, max rel err %.3e (tol %.0e), %d argmax differences (transformers %s, %s)"
                  % ("PASS" if ok else "FAIL", name, R, worst, tol, flips, transformers.__version__, dev))
        except Exception as e:  # a case that cannot run is a failure, the others still run
            failed += 1
            print("FAIL %s: %s" % (name, str(e).splitlines()[0] if str(e) else type(e).__name__))
        sys.stdout.flush()
    print("hf: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

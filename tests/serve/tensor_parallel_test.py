"""Tensor parallelism on the CPU (ranks as threads; docs/ARCHITECTURE.md, "Tensor parallelism"):
an engine built with --tp N gives the logits of the --tp 1 engine of the same
model within 1e-5 of their scale, the same greedy text (stories260K: the
reference text byte for byte), and works unchanged behind `turbine serve`
and `turbine bench --engine`; sizes that do not split and devices without
the path are refused with a message naming why. Run by
tests/test_tensor_parallel.sh."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import BIN, SHARED, SRC, Server, check, ok, run_tests, workdir  # noqa: E402

STORIES = os.path.join(SHARED, "models", "stories260K")
TOK = os.path.join(STORIES, "tok512.bin")
D = None
IDS = "1,403,407,261,378,100"


def sh(args, timeout=300):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)


def build(model, out, *extra):
    r = sh([BIN, "build", model, "--tokenizer", TOK, "-o", out] + list(extra))
    check(r.returncode == 0, "build %s %s failed: %s" % (model, " ".join(extra), r.stderr.decode()[-600:]))
    return out


def logits(engine, ids, n, *extra):
    out = engine + ".logits"
    r = sh([BIN, "run", engine, "--prompt-ids", ids, "-n", str(n), "--temperature", "0", "--logits-out", out] +
           list(extra))
    check(r.returncode == 0, "run %s failed: %s" % (engine, r.stderr.decode()[-600:]))
    return np.fromfile(out, dtype=np.float32), r.stdout


def gen(preset, seed=0):
    d = os.path.join(D, preset)
    r = sh(["/usr/bin/python3", os.path.join(SRC, "tests", "gen_checkpoints.py"), "--preset", preset, "--dtype",
            "f32", "--out", d, "--seed", str(seed)])
    check(r.returncode == 0, "gen_checkpoints.py %s failed: %s" % (preset, r.stderr.decode()[-400:]))
    return d


def compare(name, model, tp, dtype="f32", tol=1e-5, n=40):
    """Builds tp 1 and tp N engines of model and compares their logits over a
    prompt and n - 6 greedy tokens; returns the relative max difference."""
    e1 = build(model, os.path.join(D, "%s.%s.tp1.engine" % (name, dtype)), "--dtype", dtype)
    en = build(model, os.path.join(D, "%s.%s.tp%d.engine" % (name, dtype, tp)), "--dtype", dtype, "--tp", str(tp))
    a, ta = logits(e1, IDS, n)
    b, tb = logits(en, IDS, n)
    check(a.size == b.size and a.size > 0, "%s: %d logits against %d" % (name, a.size, b.size))
    scale = max(1.0, float(np.abs(a).max()))
    rel = float(np.abs(a - b).max()) / scale
    check(rel <= tol, "%s %s tp %d: logits differ by %.3g of their scale %.3g (bound %.1g)" % (name, dtype, tp, rel,
                                                                                            scale, tol))
    check(ta == tb, "%s %s tp %d: greedy tokens differ: %r vs %r" % (name, dtype, tp, ta[:200], tb[:200]))
    return rel, scale


def t_stories_reference():
    e = build(os.path.join(STORIES, "stories260K.bin"), os.path.join(D, "s.tp2.engine"), "--tp", "2")
    r = sh([BIN, "run", e, "-n", "200", "--temperature", "0", "-p", "Once upon a time"])
    check(r.returncode == 0, "run failed: %s" % r.stderr.decode()[-400:])
    want = open(os.path.join(STORIES, "expected_once_upon_a_time_n200.txt"), "rb").read()
    check(r.stdout == want, "tp 2 greedy text differs from the reference:\n%r\n%r" % (r.stdout[:300], want[:300]))
    info = sh([BIN, "inspect", e]).stdout.decode()
    check('"tensor_parallel": 2' in info and '"devices":2' in info and "graph.1" in info and "weights.1" in info,
          "inspect does not show the ranks: %s" % info[:400])
    ok("stories260K --tp 2: the reference greedy text byte for byte; inspect shows 2 ranks and their sections")


def t_logits_f32():
    rows = []
    rows.append(("stories260K", *compare("stories", os.path.join(STORIES, "stories260K.bin"), 2)))
    rows.append(("stories260K tp4", *compare("stories", os.path.join(STORIES, "stories260K.bin"), 4)))
    rows.append(("llama-gqa (untied head)", *compare("gqa", gen("llama-gqa"), 2)))
    rows.append(("qwen2 (q/k/v bias, tied)", *compare("qwen2", gen("qwen2"), 2)))
    rows.append(("mistral tp4", *compare("mistral", gen("mistral"), 4)))
    ok("f32 logits of tp 2 / 4 equal tp 1's within 1e-5 of their scale: " +
       ", ".join("%s %.2g (scale %.1f)" % (n, r, s) for n, r, s in rows))


def t_logits_low_precision():
    # f16: the KV cache is f16 too, and a key that differs in its last f32
    # bits may round to the neighbouring f16 value
    rel16, _ = compare("gqa", os.path.join(D, "llama-gqa"), 2, dtype="f16", tol=1e-3)
    # int8: o_proj and down are split along K, so a rank's per-row scale is
    # over its half of the row: the codes differ from tp 1's, the logits
    # only by quantization noise
    e1 = build(os.path.join(D, "llama-gqa"), os.path.join(D, "gqa.i8.tp1.engine"), "--dtype", "int8",
               "--qmm-tactics", "exact")
    e2 = build(os.path.join(D, "llama-gqa"), os.path.join(D, "gqa.i8.tp2.engine"), "--dtype", "int8",
               "--qmm-tactics", "exact", "--tp", "2")
    a, _ = logits(e1, IDS, 7)
    b, _ = logits(e2, IDS, 7)
    rel8 = float(np.abs(a - b).max()) / max(1.0, float(np.abs(a).max()))
    check(rel8 < 0.05, "int8 tp 2 logits differ from tp 1's by %.3g of their scale" % rel8)
    ok("f16 tp 2 = tp 1 within %.2g of the scale; int8 tp 2 within %.3f of int8 tp 1 (per-rank scales)" % (rel16, rel8))


def t_serve_and_bench():
    e1 = os.path.join(D, "stories.f32.tp1.engine")
    e2 = os.path.join(D, "stories.f32.tp2.engine")
    texts = []
    for e in (e1, e2):
        # tp 2 warms up first (decode batches over both ranks): its texts must
        # still be tp 1's
        s = Server(e, "--threads", "2", *(("--model-warmup", "on") if e == e2 else ())).start()
        try:
            if e == e2:
                check("warm-up: decode batches of 1.." in s.log(), "no warm-up line:\n" + s.log()[-1500:])
            body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
            texts.append([s.completion(body)["choices"][0]["text"]])
            # four at once: continuous batching over the ranks
            import threading
            res = [None] * 4

            def one(i):
                res[i] = s.completion({"prompt": "Lily saw a" + " big" * i, "max_tokens": 24, "temperature": 0})
            th = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            [t.start() for t in th]
            [t.join(60) for t in th]
            check(all(r is not None for r in res), "a concurrent request got no answer")
            texts[-1] += [r["choices"][0]["text"] for r in res]
        finally:
            s.kill()
    check(texts[0] == texts[1], "the server's texts differ between tp 1 and tp 2: %r vs %r" % (texts[0], texts[1]))
    r = sh([BIN, "bench", "--engine", e2, "--batch", "1,4", "--input-len", "16", "--output-len", "8", "--threads",
            "2"], timeout=300)
    out = r.stdout.decode() + r.stderr.decode()
    check(r.returncode == 0 and "decode t/s" in out, "bench --engine on a tp 2 engine failed: %s" % out[-600:])
    ok("turbine serve: tp 2 (warmed up first) answers 1 + 4 concurrent greedy requests with tp 1's texts; "
       "bench --engine runs it")


def t_refused():
    model = os.path.join(STORIES, "stories260K.bin")
    cases = [(["--tp", "3"], "1, 2, 4 or 8"), (["--tp", "8"], "divide by 8")]
    for extra, want in cases:
        r = sh([BIN, "build", model, "--tokenizer", TOK, "-o", os.path.join(D, "bad.engine")] + extra)
        err = r.stderr.decode()
        check(r.returncode != 0 and want in err, "build %s: exit %d, message %r (want %r)" % (extra, r.returncode,
                                                                                           err[-300:], want))
    r = sh([BIN, "run", os.path.join(D, "s.tp2.engine"), "-p", "x", "-n", "4", "--device", "cuda"])
    err = r.stderr.decode()
    check(r.returncode != 0 and ("tensor-parallel" in err or "cuda" in err), "tp 2 engine on cuda: %r" % err[-300:])
    ok("--tp 3, a --tp the heads do not divide by, and a tp engine on cuda (without a GPU, or one GPU per rank): "
       "clear errors")


def main():
    global D
    D = workdir("tensor_parallel")
    run_tests([("stories reference", t_stories_reference), ("f32 logits", t_logits_f32),
               ("f16 and int8", t_logits_low_precision), ("serve and bench", t_serve_and_bench),
               ("refused", t_refused)])


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""run_models.py — the models make_models.py exported, through turbine, against
PyTorch's outputs.

    /usr/bin/python3 tests/onnx/run_models.py --turbine build/turbine --dir OUTDIR
        [--mode exec|build|both] [--rtol R] [--atol A] [--loose]
        [--models REGEX] [--only-supported] [--exec-arg ARG ...] [--build-arg ARG ...]
        [--timeout S] [-v]

For every OUTDIR/*/model.onnx and each of its test_data_set_N:

  --mode exec (default): turbine exec MODEL.onnx --inputs DATA_SET --outputs TMP
  --mode build: turbine build MODEL.onnx -o TMP/model.engine
                    --min-shapes in:1x3x64x64,... --opt-shapes ... --max-shapes ...
                then turbine exec TMP/model.engine --inputs DATA_SET --outputs TMP
                (the shapes span the model's data sets: min and max per
                dimension over them, opt the first data set's)
  --mode both: the two.

Outputs (TMP/output_K.pb, or TMP/OUTPUT_NAME.pb) are compared with the stored
ones: floats within |got - exp| <= atol + rtol * |exp| (rtol 1e-3, atol 1e-4 by
default; --loose: rtol 1e-2, atol 1e-3), integers exactly.

--only-supported skips (and names) the models with an op type that
`turbine exec --list-ops` does not print. Exit status: 0 all compared data
sets match, 1 a mismatch or a turbine failure, 2 usage error, 77 when
`turbine exec --list-ops` fails (no ONNX front end) or every model was
skipped.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx  # noqa: E402
import onnx_compare as oc  # noqa: E402

SKIP = 77


def shape_args(model, sets):
    """--min-shapes/--opt-shapes/--max-shapes values over the data sets."""
    names = [i.name for i in oc.graph_inputs(model)]
    shapes = {n: [] for n in names}
    for ds in sets:
        for k, n in enumerate(names):
            p = os.path.join(ds, f"input_{k}.pb")
            t = onnx.TensorProto()
            with open(p, "rb") as f:
                t.ParseFromString(f.read())
            shapes[n].append(list(t.dims))

    def fmt(pick):
        parts = []
        for n in names:
            dims = pick(shapes[n])
            parts.append(f"{n}:{'x'.join(str(d) for d in dims)}" if dims else f"{n}:")
        return ",".join(parts)

    mn = fmt(lambda ss: [min(c) for c in zip(*ss)])
    mx = fmt(lambda ss: [max(c) for c in zip(*ss)])
    opt = fmt(lambda ss: ss[0])
    return mn, opt, mx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turbine", required=True)
    ap.add_argument("--dir", required=True, help="make_models.py's OUTDIR")
    ap.add_argument("--mode", choices=("exec", "build", "both"), default="exec")
    ap.add_argument("--rtol", type=float)
    ap.add_argument("--atol", type=float)
    ap.add_argument("--loose", action="store_true", help="rtol 1e-2, atol 1e-3")
    ap.add_argument("--models", help="only model folders whose name matches this regular expression")
    ap.add_argument("--only-supported", action="store_true",
                    help="skip models with an op type turbine does not list")
    ap.add_argument("--exec-arg", action="append", default=[], help="extra argument for turbine exec")
    ap.add_argument("--build-arg", action="append", default=[], help="extra argument for turbine build")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    rtol = a.rtol if a.rtol is not None else (1e-2 if a.loose else 1e-3)
    atol = a.atol if a.atol is not None else (1e-3 if a.loose else 1e-4)

    supported = oc.list_ops(a.turbine)
    if supported is None:
        print(f"run_models: `{a.turbine} exec --list-ops` failed: no ONNX support, skipped")
        return SKIP
    dirs = sorted(d for d in os.listdir(a.dir) if os.path.isfile(os.path.join(a.dir, d, "model.onnx")))
    if a.models:
        dirs = [d for d in dirs if re.search(a.models, d)]
    if not dirs:
        print(f"run_models: no model.onnx under {a.dir}", file=sys.stderr)
        return 2
    modes = ["exec", "build"] if a.mode == "both" else [a.mode]
    passed, failed, skipped = [], [], []
    tmp_root = tempfile.mkdtemp(prefix="onnx_models_")
    try:
        for d in dirs:
            mdir = os.path.join(a.dir, d)
            mpath = os.path.join(mdir, "model.onnx")
            model = onnx.load(mpath, load_external_data=False)
            missing = sorted(oc.op_types(model) - supported)
            sets = oc.data_sets(mdir)
            if a.only_supported and missing:
                print(f"skip {d}: turbine lacks {', '.join(missing)}")
                skipped.append(d)
                continue
            if not sets:
                print(f"skip {d}: no test data set")
                skipped.append(d)
                continue
            for mode in modes:
                target = mpath
                if mode == "build":
                    engine = os.path.join(tmp_root, f"{d}.engine")
                    mn, opt, mx = shape_args(model, sets)
                    cmd = [a.turbine, "build", mpath, "-o", engine, "--min-shapes", mn,
                           "--opt-shapes", opt, "--max-shapes", mx, *a.build_arg]
                    if a.verbose:
                        print("+ " + " ".join(cmd), flush=True)
                    t0 = time.time()
                    try:
                        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           timeout=a.timeout)
                        rc, log = r.returncode, r.stdout.decode("utf-8", "replace")
                    except subprocess.TimeoutExpired:
                        rc, log = None, f"timed out after {a.timeout}s"
                    if rc != 0:
                        for ds in sets:
                            failed.append(f"{d}/{os.path.basename(ds)} [build]")
                        print(f"FAIL {d} [build]: turbine build exit {rc}")
                        print("    " + "\n    ".join(log.strip().splitlines()[-5:]))
                        continue
                    if a.verbose:
                        print(f"    built in {time.time() - t0:.1f}s", flush=True)
                    target = engine
                for ds in sets:
                    label = f"{d}/{os.path.basename(ds)} [{mode}]"
                    out = tempfile.mkdtemp(dir=tmp_root)
                    t0 = time.time()
                    rc, log = oc.run_exec(a.turbine, target, ds, out, a.timeout, a.exec_arg)
                    dt = time.time() - t0
                    if rc != 0:
                        failed.append(label)
                        print(f"FAIL {label}: turbine exec exit {rc}"
                              + (f" (lacks {', '.join(missing)})" if missing else ""))
                        print("    " + "\n    ".join(log.strip().splitlines()[-5:]))
                    else:
                        fails = oc.check_data_set(model, ds, out, rtol, atol)
                        if fails:
                            failed.append(label)
                            print(f"FAIL {label}")
                            for f in fails:
                                print(f"    {f}")
                        else:
                            passed.append(label)
                            print(f"ok   {label} ({dt:.1f}s)", flush=True)
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    print(f"rtol {rtol:g}, atol {atol:g}")
    print(f"summary: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    if failed:
        return 1
    return SKIP if skipped and not passed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""run_node_tests.py — ONNX's own node tests (Debian's libonnx-testdata)
through `turbine exec`.

    /usr/bin/python3 tests/onnx/run_node_tests.py --turbine build/turbine
        [--data DIR] [--allow-fail FILE] [--markdown FILE] [--filter REGEX]
        [--opsets LO-HI] [--jobs N] [--timeout S] [--rtol R] [--atol A] [-v]

A test (DIR/test_*/model.onnx with test_data_set_N/input_K.pb, output_K.pb)
is selected only when every op type of its model (subgraphs included) is in
what `turbine exec --list-ops` prints (one op type of the default domain a
line). Each selected test runs as

    turbine exec DIR/model.onnx --inputs DIR/test_data_set_N --outputs TMP

and TMP/output_K.pb (or TMP/OUTPUT_NAME.pb) is compared with the expected
output: floats within |got - exp| <= atol + rtol * |exp| (defaults 1e-4 and
1e-3) with NaN in the same places, integers, bools and strings exactly.

--opsets LO-HI: only models importing a default-domain opset in that range
(the node tests of an op are written at the opset of its latest version).

--upgrade-to N: models below default-domain opset N are converted to N with
onnx.version_converter first (onnx 1.12's Conv, pooling, Range, logical and
many other node tests are written at opsets below 13); those it cannot convert
stay as they are.

onnx 1.12 stores BFLOAT16 test tensors as UINT16 (numpy has no bfloat16):
where the model declares BFLOAT16, such inputs are retyped (a copy of the
data set is fed) and so are expected outputs.

--allow-fail FILE: known failures, one "test_name reason" a line (# starts a
comment); they are reported but do not fail the run.

Prints pass/fail counts per op (a test counts for its main op: the one its
name is about) and a summary line. Exit status: 0 when no selected test
failed other than the allowed ones, 1 when one did, 2 usage error, 77 when
`turbine exec --list-ops` fails (the binary has no ONNX front end).
"""
import argparse
import concurrent.futures as cf
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


def find_node_data():
    try:
        r = subprocess.run(["dpkg", "-L", "libonnx-testdata"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=30)
        for line in r.stdout.decode().splitlines():
            if line.rstrip("/").endswith("/data/node"):
                return line.rstrip("/")
    except (OSError, subprocess.TimeoutExpired):
        pass
    d = "/usr/share/libonnx-testdata/data/node"
    return d if os.path.isdir(d) else None


def norm(s):
    return re.sub(r"[^a-z0-9]", "", s.lower())


def main_op(test, ops, base_ops):
    """The op a node test is about: the op whose name starts the test's name
    (test_reduce_sum_... -> ReduceSum); an _expanded test counts for the op of
    the test it expands."""
    name = test[len("test_"):] if test.startswith("test_") else test
    cands = set(ops) | set(base_ops or ())
    best = None
    for op in cands:
        n = norm(op.split(".")[-1])
        if norm(name).startswith(n) and (best is None or len(n) > len(norm(best.split(".")[-1]))):
            best = op
    if best:
        return best
    if base_ops and len(base_ops) == 1:
        return next(iter(base_ops))
    if len(ops) == 1:
        return next(iter(ops))
    real = sorted(o for o in ops if o not in ("Constant", "Identity", "Cast", "Shape", "Reshape"))
    return real[0] if real else sorted(ops)[0]


def load_allow(path):
    allow = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 1)
            allow[parts[0]] = parts[1] if len(parts) > 1 else ""
    return allow


def run_test(turbine, tdir, mpath, model, tmp_root, timeout, rtol, atol):
    fails = []
    for ds in oc.data_sets(tdir):
        out = tempfile.mkdtemp(dir=tmp_root)
        try:
            rc, log = oc.run_exec(turbine, mpath, oc.fixed_inputs(model, ds, tmp_root), out, timeout)
            if rc != 0:
                last = log.strip().splitlines()[-1] if log.strip() else ""
                fails.append(f"{os.path.basename(ds)}: exit {rc}: {last}"[:300])
                continue
            for r in oc.check_data_set(model, ds, out, rtol, atol):
                fails.append(f"{os.path.basename(ds)}: {r}")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turbine", required=True, help="the turbine binary")
    ap.add_argument("--data", help="the node test folder (default: libonnx-testdata's data/node)")
    ap.add_argument("--allow-fail", help="file of known failures: 'test_name reason' a line")
    ap.add_argument("--markdown", help="write a table of passes per op to this file")
    ap.add_argument("--filter", help="only tests whose name matches this regular expression")
    ap.add_argument("--opsets", help="only models whose default-domain opset is in LO-HI (e.g. 13-21)")
    ap.add_argument("--upgrade-to", type=int, help="convert models below this opset to it first")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=120, help="seconds per turbine exec (default 120)")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every test")
    a = ap.parse_args()

    data = a.data or find_node_data()
    if not data or not os.path.isdir(data):
        print("run_node_tests: no node test data (install libonnx-testdata or give --data)", file=sys.stderr)
        return 2
    supported = oc.list_ops(a.turbine)
    if supported is None:
        print(f"run_node_tests: `{a.turbine} exec --list-ops` failed: no ONNX support, skipped")
        return SKIP
    allow = load_allow(a.allow_fail) if a.allow_fail else {}
    flt = re.compile(a.filter) if a.filter else None
    lo, hi = 0, 1 << 30
    if a.opsets:
        mo = re.fullmatch(r"(\d+)-(\d+)", a.opsets)
        if not mo:
            print("run_node_tests: --opsets wants LO-HI, e.g. 13-21", file=sys.stderr)
            return 2
        lo, hi = int(mo.group(1)), int(mo.group(2))

    tests = sorted(d for d in os.listdir(data)
                   if d.startswith("test_") and os.path.isfile(os.path.join(data, d, "model.onnx")))
    tmp_root = tempfile.mkdtemp(prefix="onnx_node_")
    models, ops_of, paths, upgraded = {}, {}, {}, set()
    for t in tests:
        try:
            m = onnx.load(os.path.join(data, t, "model.onnx"))
        except Exception as ex:
            print(f"run_node_tests: {t}: unreadable model: {ex}", file=sys.stderr)
            continue
        paths[t] = os.path.join(data, t, "model.onnx")
        opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
        if a.upgrade_to and opset is not None and opset < a.upgrade_to:
            try:
                from onnx import version_converter
                cm = version_converter.convert_version(m, a.upgrade_to)
                onnx.checker.check_model(cm)
                d = os.path.join(tmp_root, "upgraded", t)
                os.makedirs(d)
                paths[t] = os.path.join(d, "model.onnx")
                onnx.save(cm, paths[t])
                m, opset = cm, a.upgrade_to
                upgraded.add(t)
            except Exception:
                pass
        if opset is not None and not lo <= opset <= hi:
            continue
        models[t] = m
        ops_of[t] = oc.op_types(m)
    primary = {}
    for t in models:
        base = re.sub(r"_expanded(_ver\d+)?$", "", t)
        primary[t] = main_op(t, ops_of[t], ops_of.get(base) if base != t else None)

    selected = [t for t in models if ops_of[t] <= supported and (not flt or flt.search(t))]
    per_op = {}  # op -> [total, selected, passed, failed, allowed]
    for t in models:
        if flt and not flt.search(t):
            continue
        row = per_op.setdefault(primary[t], [0, 0, 0, 0, 0])
        row[0] += 1
    for t in selected:
        per_op[primary[t]][1] += 1

    results = {}
    t0 = time.time()
    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
            futs = {ex.submit(run_test, a.turbine, os.path.join(data, t), paths[t], models[t], tmp_root,
                              a.timeout, a.rtol, a.atol): t for t in selected}
            for f in cf.as_completed(futs):
                t = futs[f]
                results[t] = f.result()
                if a.verbose:
                    print(f"{'ok  ' if not results[t] else 'FAIL'} {t}", flush=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)

    passed, failed, xfail, xpass = [], [], [], []
    for t in selected:
        fails = results[t]
        row = per_op[primary[t]]
        if not fails:
            passed.append(t)
            row[2] += 1
            if t in allow:
                xpass.append(t)
        elif t in allow:
            xfail.append(t)
            row[4] += 1
        else:
            failed.append(t)
            row[3] += 1

    print(f"{'op':<28} {'tests':>5} {'run':>5} {'pass':>5} {'fail':>5} {'known':>5}")
    for op in sorted(per_op):
        tot, sel, ps, fl, kn = per_op[op]
        if sel or op in supported:
            print(f"{op:<28} {tot:>5} {sel:>5} {ps:>5} {fl:>5} {kn:>5}")
    for t in sorted(xfail):
        print(f"known failure: {t}: {allow[t]}")
    for t in sorted(xpass):
        print(f"note: {t} is on the allowed-failure list but passed")
    for t in sorted(failed):
        print(f"FAIL {t} [{', '.join(sorted(ops_of[t]))}]")
        for r in results[t][:3]:
            print(f"    {r}")
    unknown = sorted(o for o in supported if o not in {p for p in primary.values()})
    if unknown:
        print(f"note: no node test is mainly about {', '.join(unknown)}")
    skipped = len([t for t in models if not flt or flt.search(t)]) - len(selected)

    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"ONNX node tests (onnx {onnx.__version__} test data) through `turbine exec`: "
                    f"{len(passed)} of {len(selected)} selected tests pass, {len(failed)} fail, "
                    f"{len(xfail)} known failures; {skipped} tests not selected (an op not supported).\n\n")
            f.write("| op | node tests | selected | passed | failed | known failures |\n")
            f.write("| --- | ---: | ---: | ---: | ---: | ---: |\n")
            for op in sorted(per_op):
                tot, sel, ps, fl, kn = per_op[op]
                if sel or op in supported:
                    f.write(f"| {op} | {tot} | {sel} | {ps} | {fl} | {kn} |\n")
    if upgraded:
        print(f"{len(upgraded)} models converted to opset {a.upgrade_to} ({len(set(selected) & upgraded)} of them selected)")
    print(f"{len(selected)} of {len(models)} node tests selected ({len(supported)} op types listed), "
          f"{time.time() - t0:.1f}s")
    print(f"summary: {len(passed)} passed, {len(failed)} failed, {skipped} skipped"
          + (f", {len(xfail)} known failures" if xfail else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""onnx_compare.py — what run_node_tests.py and run_models.py share: reading
the ONNX backend-test layout (model.onnx, test_data_set_N/input_K.pb and
output_K.pb), running `turbine exec`, comparing outputs."""
import glob
import os
import re
import subprocess

import numpy as np
import onnx
from onnx import numpy_helper


def graph_inputs(model):
    """The graph inputs that are fed (initializers listed as inputs are not)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def op_types(model):
    """The op types of every node, subgraphs included. Ops outside the default
    domain are written 'domain.OpType'."""
    ops = set()

    def walk(g):
        for n in g.node:
            ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)
    walk(model.graph)
    return ops


def data_sets(model_dir):
    ds = glob.glob(os.path.join(model_dir, "test_data_set_*"))
    return sorted((d for d in ds if os.path.isdir(d)), key=lambda d: int(re.sub(r"\D", "", os.path.basename(d)) or 0))


def load_value(path, type_proto=None):
    """A .pb file as a numpy array, a list (sequence) or None (empty optional),
    by the graph's declared type when given, else as a TensorProto."""
    with open(path, "rb") as f:
        data = f.read()
    kind = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    if kind == "sequence_type":
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return [np.asarray(x) for x in numpy_helper.to_list(p)]
    if kind == "optional_type":
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        v = numpy_helper.to_optional(p)
        if isinstance(v, list):
            return [np.asarray(x) for x in v]
        return None if v is None else np.asarray(v)
    p = onnx.TensorProto()
    p.ParseFromString(data)
    bf16_as_uint16(p, type_proto)
    return numpy_helper.to_array(p)


def bf16_as_uint16(p, type_proto):
    """onnx 1.12's node tests store BFLOAT16 tensors as UINT16 (the same bits,
    numpy having no bfloat16): retype p as BFLOAT16 where the graph declares
    BFLOAT16. True when p was changed."""
    if (type_proto is None or type_proto.WhichOneof("value") != "tensor_type"
            or type_proto.tensor_type.elem_type != onnx.TensorProto.BFLOAT16
            or p.data_type != onnx.TensorProto.UINT16):
        return False
    p.data_type = onnx.TensorProto.BFLOAT16
    return True


def fixed_inputs(model, ds_dir, tmp_root):
    """ds_dir, or a copy of it under tmp_root whose input_K.pb files are
    retyped as bf16_as_uint16 says (the graph's inputs in order)."""
    import shutil
    import tempfile
    fixed = {}
    for k, gi in enumerate(graph_inputs(model)):
        path = os.path.join(ds_dir, f"input_{k}.pb")
        if gi.type.WhichOneof("value") != "tensor_type" or not os.path.exists(path):
            continue
        p = onnx.TensorProto()
        with open(path, "rb") as f:
            p.ParseFromString(f.read())
        if bf16_as_uint16(p, gi.type):
            fixed[k] = p
    if not fixed:
        return ds_dir
    d = tempfile.mkdtemp(dir=tmp_root)
    for f in glob.glob(os.path.join(ds_dir, "input_*.pb")):
        shutil.copy(f, d)
    for k, p in fixed.items():
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(p.SerializeToString())
    return d


def find_output(out_dir, k, name):
    """turbine exec's output K: output_K.pb, or NAME.pb."""
    for cand in (f"output_{k}.pb", f"{name}.pb"):
        p = os.path.join(out_dir, cand)
        if os.path.exists(p):
            return p
    return None


def compare(expected, actual, rtol, atol):
    """None when equal within tolerance, else a short reason. Floats:
    |a - e| <= atol + rtol * |e|, NaN where and only where expected has NaN,
    infinities equal. Integers, bools and strings: exact."""
    if isinstance(expected, list) or isinstance(actual, list):
        if not isinstance(expected, list) or not isinstance(actual, list):
            return "sequence / tensor mismatch"
        if len(expected) != len(actual):
            return f"sequence length {len(actual)}, expected {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            r = compare(e, a, rtol, atol)
            if r:
                return f"[{i}] {r}"
        return None
    if expected is None or actual is None:
        return None if expected is None and actual is None else "optional presence differs"
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape:
        return f"shape {list(a.shape)}, expected {list(e.shape)}"
    if e.dtype != a.dtype:
        return f"dtype {a.dtype}, expected {e.dtype}"
    if e.dtype.kind in "fc":
        ct = np.complex128 if e.dtype.kind == "c" else np.float64
        e64, a64 = e.astype(ct).reshape(-1), a.astype(ct).reshape(-1)
        en, an = np.isnan(e64), np.isnan(a64)
        if not np.array_equal(en, an):
            return f"NaN positions differ ({int(np.count_nonzero(en != an))} elements)"
        ei, ai = np.isinf(e64), np.isinf(a64)
        ok = en | (ei & ai & (e64 == a64))
        both = ~en & ~ei & ~ai
        ok[both] = np.abs(a64[both] - e64[both]) <= atol + rtol * np.abs(e64[both])
        if not ok.all():
            bad = np.flatnonzero(~ok)
            i = int(bad[0])
            idx = [int(x) for x in np.unravel_index(i, e.shape)] if e.shape else []
            with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: masked off
                diff = np.where(both, np.abs(a64 - e64), 0)
            return (f"{len(bad)}/{e.size} elements off, first at {idx}: "
                    f"{a64[i]} vs {e64[i]} (max abs diff {float(np.max(np.abs(diff))):.3g})")
        return None
    if e.dtype.kind in "OUS":
        eq = np.array_equal(e.astype(str), a.astype(str))
    else:
        eq = np.array_equal(e, a)
    if not eq:
        n = int(np.count_nonzero(e != a)) if e.dtype.kind not in "OUS" else -1
        return f"{n}/{e.size} elements differ" if n >= 0 else "strings differ"
    return None


def run_exec(turbine, model, inputs_dir, out_dir, timeout, extra=()):
    """Runs `turbine exec MODEL --inputs DIR --outputs DIR`; returns
    (returncode or None on timeout, combined stderr/stdout tail)."""
    # TURBINE_EXEC_ARGS: more arguments for every exec (e.g. "--device cuda")
    env_extra = os.environ.get("TURBINE_EXEC_ARGS", "").split()
    cmd = [turbine, "exec", model, "--inputs", inputs_dir, "--outputs", out_dir, *extra, *env_extra]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    return r.returncode, r.stdout.decode("utf-8", "replace")[-2000:]


def check_data_set(model, ds_dir, out_dir, rtol, atol):
    """Compares turbine's outputs in out_dir with ds_dir's output_K.pb; returns
    a list of failure reasons (empty when all match)."""
    fails = []
    for k, go in enumerate(model.graph.output):
        exp_path = os.path.join(ds_dir, f"output_{k}.pb")
        if not os.path.exists(exp_path):
            continue
        got_path = find_output(out_dir, k, go.name)
        if got_path is None:
            fails.append(f"output {k} ({go.name}): not written")
            continue
        try:
            exp = load_value(exp_path, go.type)
            got = load_value(got_path, go.type)
        except Exception as ex:  # unreadable protobuf
            fails.append(f"output {k} ({go.name}): unreadable: {ex}")
            continue
        r = compare(exp, got, rtol, atol)
        if r:
            fails.append(f"output {k} ({go.name}): {r}")
    return fails


def list_ops(turbine):
    """The op types `turbine exec --list-ops` prints, or None if it fails."""
    try:
        r = subprocess.run([turbine, "exec", "--list-ops"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    ops = {l.strip() for l in r.stdout.decode("utf-8", "replace").splitlines()}
    ops.discard("")
    return {o for o in ops if not o.startswith("#")}

#!/usr/bin/python3
"""gen_models.py OUTDIR — writes the small ONNX models test_onnx_import reads.

Built with onnx.helper (python3-onnx 1.12) at test time; nothing binary is
committed. Exits 77 when the onnx module is missing (the test then skips).
Each model exercises one import path or one refusal; test_onnx_import.c says
what it expects of each.
"""
import os
import random
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:  # pragma: no cover
    print(f"gen_models.py: {e}: skipping", file=sys.stderr)
    sys.exit(77)

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
F = TensorProto.FLOAT


def save(name, graph, opset=17, ir=8, extra_opsets=()):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    m.ir_version = ir
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(m.SerializeToString())
    return m


def arange(shape, scale=0.25, dtype=np.float32):
    return (np.arange(int(np.prod(shape))).reshape(shape) * scale).astype(dtype)


# Conv + Relu, fixed shapes
w = numpy_helper.from_array(arange((4, 3, 3, 3), 0.01), "W")
b = numpy_helper.from_array(arange((4,), 0.5), "B")
save("conv_relu.onnx", helper.make_graph(
    [helper.make_node("Conv", ["X", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
     helper.make_node("Relu", ["c"], ["Y"], name="relu")],
    "conv_relu", [helper.make_tensor_value_info("X", F, [1, 3, 8, 8])],
    [helper.make_tensor_value_info("Y", F, [1, 4, 8, 8])], [w, b]))

# MatMul + Add with a symbolic batch; the weight is also listed as a graph
# input (IR >= 4: an initializer with a default, still a weight)
wm = numpy_helper.from_array(arange((4, 5)), "Wm")
bm = numpy_helper.from_array(arange((5,), 1.0), "Bm")
save("matmul_add.onnx", helper.make_graph(
    [helper.make_node("MatMul", ["X", "Wm"], ["mm"], name="mm"),
     helper.make_node("Add", ["mm", "Bm"], ["Y"], name="add")],
    "matmul_add", [helper.make_tensor_value_info("X", F, ["batch", 4]),
                   helper.make_tensor_value_info("Wm", F, [4, 5])],
    [helper.make_tensor_value_info("Y", F, ["batch", 5])], [wm, bm]))

# Shape -> Gather -> Unsqueeze -> Concat -> Reshape over symbolic batch/seq
# shared by two inputs, Constant nodes of each kind, Cast, Dropout, Softmax
# with a negative axis, and a value name past TB_NAME_LEN.
LONG = "encoder/layer_0/attention/self/" + "very_long_scope_name/" * 6 + "probs"
nodes = [
    helper.make_node("Shape", ["x"], ["shp"], name="shape"),
    helper.make_node("Constant", [], ["i0"], name="c0", value_int=0),
    helper.make_node("Constant", [], ["i1"], name="c1",
                     value=numpy_helper.from_array(np.array(1, dtype=np.int64))),
    helper.make_node("Constant", [], ["ax0"], name="cax", value_ints=[0]),
    helper.make_node("Constant", [], ["tail"], name="ctail", value_ints=[2, 4]),
    helper.make_node("Gather", ["shp", "i0"], ["b"], name="gather_b", axis=0),
    helper.make_node("Gather", ["shp", "i1"], ["s"], name="gather_s", axis=-1),
    helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="unsq_b"),
    helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="unsq_s"),
    helper.make_node("Concat", ["b1", "s1", "tail"], ["newshape"], name="concat", axis=-1),
    helper.make_node("Cast", ["ids"], ["idsf"], name="cast", to=F),
    helper.make_node("Constant", [], ["axm1"], name="caxm1", value_ints=[-1]),
    helper.make_node("Unsqueeze", ["idsf", "axm1"], ["idsf3"], name="unsq_ids"),
    helper.make_node("Mul", ["x", "idsf3"], ["xm"], name="mul"),
    helper.make_node("Dropout", ["xm"], ["xd"], name="dropout"),
    helper.make_node("Softmax", ["xd"], [LONG], name="softmax", axis=-1),
    helper.make_node("Constant", [], ["half"], name="chalf", value_float=0.5),
    helper.make_node("Mul", [LONG, "half"], ["xh"], name="scale"),
    helper.make_node("Reshape", ["xh", "newshape"], ["y"], name="reshape"),
]
save("shape_chain.onnx", helper.make_graph(
    nodes, "shape_chain",
    [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
     helper.make_tensor_value_info("x", F, ["batch", "seq", 8])],
    [helper.make_tensor_value_info("y", F, ["batch", "seq", 2, 4])]), opset=13)

# One node of most other ops, for their attribute translation (test_ops_misc)
X4 = helper.make_tensor_value_info("X", F, [2, 3, 8, 8])
X3 = helper.make_tensor_value_info("X1", F, [2, 3, 16])
inits = [
    numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    numpy_helper.from_array(np.array([2, 3, 4, 4], np.int64), "sizes"),
    numpy_helper.from_array(arange((10, 192), 0.001), "Wg"),
    numpy_helper.from_array(arange((10,), 0.1), "Cg"),
    numpy_helper.from_array(np.array(0.5, np.float32), "maxc"),
    numpy_helper.from_array(np.array([2, 3], np.int64), "cshape"),
    numpy_helper.from_array(np.array([4, 6], np.int64), "splits"),
    numpy_helper.from_array(np.ones(10, np.float32), "lns"),
    numpy_helper.from_array(np.zeros(10, np.float32), "lnb"),
    numpy_helper.from_array(np.array([0], np.int64), "st0"),
    numpy_helper.from_array(np.array([4], np.int64), "en4"),
    numpy_helper.from_array(np.array([2], np.int64), "step2"),
    numpy_helper.from_array(arange((4, 3, 5), 0.01), "W1"),
] + [numpy_helper.from_array(np.full(3, v, np.float32), n) for n, v in
     (("bns", 1.0), ("bnb", 0.0), ("bnm", 0.5), ("bnv", 2.0))]
ops = [
    helper.make_node("MaxPool", ["X"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
    helper.make_node("AveragePool", ["X"], ["ap"], name="ap", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                     count_include_pad=1),
    helper.make_node("GlobalAveragePool", ["X"], ["gap"], name="gap"),
    helper.make_node("Resize", ["X", "", "scales"], ["rz"], name="rz", mode="linear",
                     coordinate_transformation_mode="align_corners"),
    helper.make_node("Resize", ["X", "", "", "sizes"], ["rs"], name="rs", nearest_mode="floor"),
    helper.make_node("Flatten", ["X"], ["fl"], name="fl", axis=-3),
    helper.make_node("Transpose", ["X"], ["tr"], name="tr"),
    helper.make_node("ReduceMean", ["X"], ["rm"], name="rm", axes=[-1, -2], keepdims=0),
    helper.make_node("Gemm", ["fl", "Wg", "Cg"], ["gm"], name="gm", transB=1, alpha=0.5),
    helper.make_node("Clip", ["gm", "", "maxc"], ["cl"], name="cl"),
    helper.make_node("ConstantOfShape", ["cshape"], ["co"], name="co"),
    helper.make_node("Split", ["gm", "splits"], ["sp0", "sp1"], name="sp", axis=-1),
    helper.make_node("Shape", ["X"], ["sh"], name="sh", start=1, end=-1),
    helper.make_node("Trilu", ["cl"], ["tl"], name="tl", upper=0),
    helper.make_node("LayerNormalization", ["gm", "lns", "lnb"], ["ln"], name="ln", epsilon=1e-3),
    helper.make_node("BatchNormalization", ["X", "bns", "bnb", "bnm", "bnv"], ["bn"], name="bn", epsilon=1e-3),
    helper.make_node("Slice", ["X", "st0", "en4", "", "step2"], ["sl"], name="sl"),
    helper.make_node("Concat", ["X"] * 10, ["cat"], name="cat", axis=1),
    helper.make_node("Conv", ["X1", "W1"], ["c1"], name="c1", strides=[2], pads=[2, 2]),
    helper.make_node("MaxPool", ["c1"], ["mp1"], name="mp1", kernel_shape=[2]),
]
outs = ["mp", "ap", "rz", "rs", "rm", "cl", "co", "sp0", "sp1", "sh", "tl", "ln", "bn", "sl", "cat",
        "mp1"]
save("ops_misc.onnx", helper.make_graph(
    ops, "ops_misc", [X4, X3], [helper.make_tensor_value_info(o, F, None) for o in outs], inits))

# Initializers in typed fields (no raw_data) of each dtype, read back by Identity
typed = [
    helper.make_tensor("t_f32", F, [3], [1.5, -2.0, 3.25]),
    helper.make_tensor("t_f16", TensorProto.FLOAT16, [2], np.array([1.0, -0.5], dtype=np.float16)),
    helper.make_tensor("t_i64", TensorProto.INT64, [2], [-7, 1 << 40]),
    helper.make_tensor("t_i32", TensorProto.INT32, [2], [-3, 100000]),
    helper.make_tensor("t_i8", TensorProto.INT8, [2], [-128, 127]),
    helper.make_tensor("t_u8", TensorProto.UINT8, [2], [0, 255]),
    helper.make_tensor("t_bool", TensorProto.BOOL, [3], [True, False, True]),
    helper.make_tensor("t_f64", TensorProto.DOUBLE, [1], [0.125]),
    helper.make_tensor("t_scalar", F, [], [42.0]),
]
save("typed.onnx", helper.make_graph(
    [helper.make_node("Identity", [t.name], [t.name + "_out"], name="id_" + t.name) for t in typed],
    "typed", [], [helper.make_tensor_value_info(t.name + "_out", t.data_type, list(t.dims)) for t in typed],
    typed))


# External data: two tensors in one file next to the model, the second at an offset
def external(name, loc, offset, length, shape):
    t = TensorProto()
    t.name, t.data_type = name, F
    t.dims.extend(shape)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", loc), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


ew = arange((4, 5), 0.5)
eb = arange((5,), -1.0)
os.makedirs(os.path.join(OUT, "data"), exist_ok=True)
with open(os.path.join(OUT, "data", "weights.bin"), "wb") as f:
    f.write(ew.tobytes())
    f.write(b"\0" * (4096 - ew.nbytes))
    f.write(eb.tobytes())


def ext_graph(wloc, name="ext"):
    return helper.make_graph(
        [helper.make_node("MatMul", ["X", "We"], ["mm"], name="mm"),
         helper.make_node("Add", ["mm", "Be"], ["Y"], name="add")],
        name, [helper.make_tensor_value_info("X", F, [2, 4])], [helper.make_tensor_value_info("Y", F, [2, 5])],
        [external("We", wloc, 0, ew.nbytes, [4, 5]), external("Be", "data/weights.bin", 4096, eb.nbytes, [5])])


save("external.onnx", ext_graph("data/weights.bin"))
save("escape_dotdot.onnx", ext_graph("data/../../secret.bin"))
save("escape_abs.onnx", ext_graph("/etc/passwd"))
save("external_short.onnx", helper.make_graph(
    [helper.make_node("Identity", ["Be"], ["Y"], name="id")], "short", [],
    [helper.make_tensor_value_info("Y", F, [5])], [external("Be", "data/weights.bin", 4100, 20, [5])]))

# Several unsupported nodes in one model: all of them are listed
save("unsupported.onnx", helper.make_graph(
    [helper.make_node("Relu", ["X"], ["r"], name="ok_relu"),
     helper.make_node("NonMaxSuppression", ["r", "r"], ["nms"], name="Foo_12"),
     helper.make_node("Softmax", ["r"], ["sm"], name="Baz", axis=1, frobnicate=3),
     helper.make_node("FusedGemm", ["r", "r"], ["fg"], name="ms_node", domain="com.microsoft"),
     helper.make_node("Add", ["nms", "sm"], ["Y"], name="after")],
    "unsupported", [helper.make_tensor_value_info("X", F, [2, 2])],
    [helper.make_tensor_value_info("Y", F, [2, 2]), helper.make_tensor_value_info("fg", F, [2, 2])]),
    extra_opsets=[helper.make_opsetid("com.microsoft", 1)])

# More refused nodes than one message holds
save("many_unsupported.onnx", helper.make_graph(
    [helper.make_node("Celu", ["X"], [f"c{i}"], name=f"an_unsupported_node_with_a_long_name_{i:02d}")
     for i in range(30)], "many", [helper.make_tensor_value_info("X", F, [2])],
    [helper.make_tensor_value_info("c0", F, [2])]))

# LayerNormalization whose Mean output is used; Dropout whose mask is used
save("layernorm_mean.onnx", helper.make_graph(
    [helper.make_node("LayerNormalization", ["X", "S"], ["Y", "M"], name="ln", axis=-1)],
    "ln", [helper.make_tensor_value_info("X", F, [2, 4])],
    [helper.make_tensor_value_info("Y", F, [2, 4]), helper.make_tensor_value_info("M", F, [2, 1])],
    [numpy_helper.from_array(np.ones(4, np.float32), "S")]))
save("dropout_mask.onnx", helper.make_graph(
    [helper.make_node("Dropout", ["X"], ["Y", "mask"], name="drop")],
    "drop", [helper.make_tensor_value_info("X", F, [2, 4])],
    [helper.make_tensor_value_info("Y", F, [2, 4]), helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 4])]))

# Required inputs given as empty names: Clip with neither x nor min, Slice
# with steps but neither starts nor axes
save("absent_inputs.onnx", helper.make_graph(
    [helper.make_node("Clip", ["", "", "X"], ["c"], name="clip_no_x"),
     helper.make_node("Slice", ["X", "", "E", "", "E"], ["s"], name="slice_no_starts"),
     helper.make_node("Add", ["X", "X"], ["Y"], name="fine")],
    "absent", [helper.make_tensor_value_info("X", F, [2])],
    [helper.make_tensor_value_info("Y", F, [2]), helper.make_tensor_value_info("c", F, [2]),
     helper.make_tensor_value_info("s", F, [2])],
    [numpy_helper.from_array(np.ones(1, np.int64), "E")]))

# Opset outside 13..21
relu = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"], name="relu")], "relu",
                         [helper.make_tensor_value_info("X", F, [2])], [helper.make_tensor_value_info("Y", F, [2])])
save("opset11.onnx", relu, opset=11)
save("relu.onnx", relu, opset=21)

# An initializer of a type the importer refuses
save("bad_dtype.onnx", helper.make_graph(
    [helper.make_node("Identity", ["w16"], ["Y"], name="id")], "bad_dtype", [],
    [helper.make_tensor_value_info("Y", TensorProto.UINT16, [2])],
    [helper.make_tensor("w16", TensorProto.UINT16, [2], [1, 2])]))

# raw_data of the wrong length for its shape
bad = numpy_helper.from_array(np.ones(3, np.float32), "wr")
bad.raw_data = bad.raw_data[:7]
save("bad_raw.onnx", helper.make_graph(
    [helper.make_node("Identity", ["wr"], ["Y"], name="id")], "bad_raw", [],
    [helper.make_tensor_value_info("Y", F, [3])], [bad]))

# Truncated and random files
with open(os.path.join(OUT, "conv_relu.onnx"), "rb") as f:
    full = f.read()
with open(os.path.join(OUT, "truncated.onnx"), "wb") as f:
    f.write(full[: len(full) // 2])
rnd = random.Random(1234)
with open(os.path.join(OUT, "random.onnx"), "wb") as f:
    f.write(bytes(rnd.randrange(256) for _ in range(4096)))


# Messages nested far deeper than any model: Model.graph -> Graph.node ->
# Node.attribute -> Attribute.g -> Graph.node -> ... (protobuf wire format)
def ld(field, payload):
    key, n, out = field << 3 | 2, len(payload), bytearray()
    out.append(key)
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes(out) + payload


g = b""
for _ in range(200):
    g = ld(1, ld(5, ld(6, g)))  # Graph.node { Node.attribute { Attribute.g { ... } } }
with open(os.path.join(OUT, "deep.onnx"), "wb") as f:
    f.write(b"\x08\x08" + ld(7, g))  # ir_version 8, graph
print(f"gen_models.py: models in {OUT}")

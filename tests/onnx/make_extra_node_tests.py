#!/usr/bin/python3
"""make_extra_node_tests.py OUTDIR — a few node tests in ONNX's backend-test
layout (OUTDIR/test_*/model.onnx, test_data_set_0/input_K.pb, output_K.pb)
for import paths onnx 1.12's own node tests leave out: Dropout with constant
training_mode / ratio and its mask used, LayerNormalization with only
InvStdDev used. Run them with run_node_tests.py --data OUTDIR."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(outdir, name, graph, inputs, outputs, opset=17):
    d = os.path.join(outdir, name)
    ds = os.path.join(d, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(d, "model.onnx"))
    for k, (n, v) in enumerate(inputs):
        with open(os.path.join(ds, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())
    for k, (n, v) in enumerate(outputs):
        with open(os.path.join(ds, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())


def dropout(outdir, name, ratio, training):
    x = np.random.RandomState(0).randn(3, 4, 5).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y", "z"], seed=0)], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 5]),
         helper.make_tensor_value_info("z", TensorProto.BOOL, [3, 4, 5])],
        [numpy_helper.from_array(np.array(ratio, np.float32), "r"),
         numpy_helper.from_array(np.array(training, np.bool_), "t")])
    save(outdir, name, g, [("x", x)], [("y", x), ("z", np.ones(x.shape, np.bool_))])


def layernorm_invstd(outdir):
    rs = np.random.RandomState(1)
    x = rs.randn(2, 3, 4).astype(np.float32)
    w = rs.randn(3, 4).astype(np.float32)
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(1, 2), keepdims=True)
    inv = 1 / np.sqrt(var + 1e-5)
    y = ((x - mean) * inv * w).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "w"], ["y", "", "inv"], axis=1)],
        "test_layer_normalization_invstddev_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("inv", TensorProto.FLOAT, [2, 1, 1])])
    save(outdir, "test_layer_normalization_invstddev_only", g, [("x", x), ("w", w)],
         [("y", y), ("inv", inv.astype(np.float32))])


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    dropout(out, "test_dropout_const_inference_mask", 0.5, False)
    dropout(out, "test_dropout_const_training_zero_ratio_mask", 0.0, True)
    layernorm_invstd(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

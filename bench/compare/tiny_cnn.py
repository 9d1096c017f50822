#!/usr/bin/python3
"""tiny_cnn.py — writes a small ResNet-style CNN as ONNX (batch axis dynamic)
and a folder of calibration inputs, for tests of bench/compare_precisions.sh.

    /usr/bin/python3 bench/compare/tiny_cnn.py OUT.onnx CALIB_DIR [--hw 16] [--classes 10]

Conv-BN-free blocks (Conv, Relu, a residual Add), GlobalAveragePool, Flatten,
Gemm; random weights from a fixed seed. CALIB_DIR gets input_K.npy, K < 8,
shape 1x3xHWxHW, random normal values (what `turbine build --calib-data` reads).
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("calib")
    ap.add_argument("--hw", type=int, default=16)
    ap.add_argument("--classes", type=int, default=10)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    inits, nodes = [], []

    def w(name, shape, scale):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def conv(x, cin, cout, name, stride=1):
        nodes.append(helper.make_node("Conv", [x, w(name + "_w", (cout, cin, 3, 3), (2.0 / (9 * cin)) ** 0.5),
                                               w(name + "_b", (cout,), 0.1)], [name],
                                      pads=[1, 1, 1, 1], strides=[stride, stride], kernel_shape=[3, 3]))
        return name

    def relu(x, name):
        nodes.append(helper.make_node("Relu", [x], [name]))
        return name

    # input [N, 3, HW, HW] -> stem [N, 8, HW/2, HW/2] -> block (residual) -> [N, 16, HW/4, HW/4]
    h = relu(conv("input", 3, 8, "stem", 2), "stem_r")
    b = relu(conv(h, 8, 8, "b1a"), "b1a_r")
    b = conv(b, 8, 8, "b1b")
    nodes.append(helper.make_node("Add", [b, h], ["b1_add"]))
    h = relu("b1_add", "b1_r")
    h = relu(conv(h, 8, 16, "b2", 2), "b2_r")
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["gap"]))   # [N, 16, 1, 1]
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))  # [N, 16]
    nodes.append(helper.make_node("Gemm", ["flat", w("fc_w", (a.classes, 16), 0.5), w("fc_b", (a.classes,), 0.1)],
                                  ["output"], transB=1))               # [N, classes]
    g = helper.make_graph(nodes, "tiny_cnn",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, a.hw, a.hw])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", a.classes])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, a.out)
    os.makedirs(a.calib, exist_ok=True)
    for k in range(8):
        np.save(os.path.join(a.calib, "input_%d.npy" % k), rng.standard_normal((1, 3, a.hw, a.hw)).astype(np.float32))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""sweep_models.py OUT_FILE — one-node ONNX models of every mapped op with
inputs left out, of odd ranks and of other dtypes, packed into one file.

For every op type the importer maps (src/ir/ops_nn.def, plus Dropout), every
input count 1..5, every mask of inputs left out (the empty name: an absent
optional input) and six kinds of the input "x" (f32 of rank 2, 4, 0 and 6,
int64 and bool): a model of one node op(x or "" at each position) -> y.
tests/test_onnx_sweep.c imports each from memory: an engine graph or a
clear error, never a read past the importer's tables (it once read before
its value table for Clip with neither x nor min, and for Slice with steps
but no starts). The pack: for each model a line "NAME BYTES\\n", then the
bytes. Needs python3-onnx (/usr/bin/python3).
"""
import os
import re
import sys

try:
    from onnx import TensorProto, helper
except ImportError:
    sys.exit(77)  # no python3-onnx: the test skips

SRC = os.environ.get("TURBINE_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# what "x" is: f32 of rank 2, 4, 0 and 6, int64 and bool
INPUTS = [(TensorProto.FLOAT, [2, 2]), (TensorProto.FLOAT, [1, 2, 4, 4]), (TensorProto.FLOAT, []),
          (TensorProto.FLOAT, [1, 1, 1, 1, 1, 2]), (TensorProto.INT64, [3]), (TensorProto.BOOL, [2, 2])]


def op_types():
    with open(os.path.join(SRC, "src", "ir", "ops_nn.def")) as f:
        text = f.read()
    return sorted(set(re.findall(r'TB_NN_OP\(\s*\w+\s*,\s*"(\w+)"\s*\)', text)) | {"Dropout"})


def main():
    n = 0
    with open(sys.argv[1], "wb") as out:
        for op in op_types():
            for nin in range(1, 6):
                for mask in range(1 << nin):
                    ins = ["" if mask >> i & 1 else "x" for i in range(nin)]
                    for k, (dt, shape) in enumerate(INPUTS):
                        node = helper.make_node(op, ins, ["y"], name="n")
                        g = helper.make_graph([node], "sweep", [helper.make_tensor_value_info("x", dt, shape)],
                                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
                        b = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
                        out.write(b"%s_%d_%d_%d %d\n" % (op.encode(), nin, mask, k, len(b)))
                        out.write(b)
                        n += 1
    print("%d models" % n)


if __name__ == "__main__":
    main()

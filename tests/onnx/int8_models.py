#!/usr/bin/python3
"""int8_models.py — small models for the INT8 tests (tests/test_onnx_int8.sh),
made with onnx.helper, and numpy evaluations of them in float64.

    /usr/bin/python3 tests/onnx/int8_models.py make OUTDIR
        OUTDIR/convnet/model.onnx     f32: stem Conv 3->16, Conv +
                                      BatchNormalization + Relu, a residual
                                      block, GlobalAveragePool, Gemm -> 10
        OUTDIR/convnet/calib/input_0_N.npy  calibration inputs (N = 0..7)
        OUTDIR/convnet/model_b.onnx   the same with another doc string
        OUTDIR/qdq_conv/model.onnx    the same shape with QuantizeLinear /
                                      DequantizeLinear around weights and
                                      activations (per-channel int8 weights,
                                      uint8 and int8 activations)
        OUTDIR/qdq_mlp/model.onnx     MatMul + bias + Relu, then Gemm
                                      (transB), Q/DQ around both
        each with test_data_set_0/input_0.pb and output_0.pb: the numpy
        evaluation (float64) of the graph as ONNX defines it
    /usr/bin/python3 tests/onnx/int8_models.py npy OUTDIR PREFIX N SHAPE KIND
        N calibration arrays OUTDIR/PREFIX_K.npy of SHAPE (e.g. 2x3x64x64),
        KIND normal (f32), ids:V (int64 in [0, V)) or ones (f32)
    /usr/bin/python3 tests/onnx/int8_models.py compare GOT.pb WANT.pb ATOL_FRAC
        max |got - want| <= ATOL_FRAC * max |want|, else exit 1
"""
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

RNG = np.random.default_rng(7)


def conv2d(x, w, b=None, stride=1, pad=0):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
            y += np.einsum('nchw,mc->nmhw', patch, w[:, :, ky, kx])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def q(x, s, z, lo, hi):
    # ONNX QuantizeLinear: float32 division, round half to even, saturate
    v = np.rint(np.float32(x).astype(np.float32) / np.float32(s))
    return np.clip(v + z, lo, hi)


def qdq(x, s, z, signed):
    lo, hi = (-128, 127) if signed else (0, 255)
    return (q(x, s, z, lo, hi) - z) * np.float64(np.float32(s))


def init(name, arr):
    return numpy_helper.from_array(arr, name)


def save(d, graph, x, y, opset=13):
    os.makedirs(os.path.join(d, 'test_data_set_0'), exist_ok=True)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid('', opset)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(d, 'model.onnx'))
    for nm, arr in (('input_0', x), ('output_0', y)):
        t = numpy_helper.from_array(arr.astype(np.float32), nm)
        with open(os.path.join(d, 'test_data_set_0', nm + '.pb'), 'wb') as f:
            f.write(t.SerializeToString())


def wq(w, axis):
    """per-channel symmetric int8 codes and scales of w along axis"""
    red = tuple(i for i in range(w.ndim) if i != axis)
    s = (np.abs(w).max(axis=red) / 127.0).astype(np.float32)
    shp = [1] * w.ndim
    shp[axis] = -1
    codes = np.clip(np.rint(w / s.reshape(shp)), -127, 127).astype(np.int8)
    return codes, s


def make_convnet(d):
    f = np.float32
    w0 = RNG.normal(0, 0.3, (16, 3, 3, 3)).astype(f)
    b0 = RNG.normal(0, 0.1, 16).astype(f)
    w1 = RNG.normal(0, 0.1, (32, 16, 3, 3)).astype(f)
    g1, be1 = RNG.uniform(0.5, 1.5, 32).astype(f), RNG.normal(0, 0.1, 32).astype(f)
    mu1, var1 = RNG.normal(0, 0.1, 32).astype(f), RNG.uniform(0.5, 1.5, 32).astype(f)
    w2 = RNG.normal(0, 0.08, (32, 32, 3, 3)).astype(f)
    b2 = RNG.normal(0, 0.1, 32).astype(f)
    w3 = RNG.normal(0, 0.2, (32, 32, 1, 1)).astype(f)
    wf = RNG.normal(0, 0.3, (10, 32)).astype(f)
    bf = RNG.normal(0, 0.1, 10).astype(f)
    nodes = [
        helper.make_node('Conv', ['x', 'w0', 'b0'], ['c0'], pads=[1, 1, 1, 1]),
        helper.make_node('Relu', ['c0'], ['r0']),
        helper.make_node('Conv', ['r0', 'w1'], ['c1'], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node('BatchNormalization', ['c1', 'g1', 'be1', 'mu1', 'var1'], ['n1'], epsilon=1e-5),
        helper.make_node('Relu', ['n1'], ['r1']),
        helper.make_node('Conv', ['r1', 'w2', 'b2'], ['c2'], pads=[1, 1, 1, 1]),
        helper.make_node('Relu', ['c2'], ['r2']),
        helper.make_node('Conv', ['r2', 'w3'], ['c3']),
        helper.make_node('Add', ['c3', 'r1'], ['a3']),
        helper.make_node('Relu', ['a3'], ['r3']),
        helper.make_node('GlobalAveragePool', ['r3'], ['p']),
        helper.make_node('Flatten', ['p'], ['fl']),
        helper.make_node('Gemm', ['fl', 'wf', 'bf'], ['y'], transB=1),
    ]
    inits = [init(n, a) for n, a in (('w0', w0), ('b0', b0), ('w1', w1), ('g1', g1), ('be1', be1), ('mu1', mu1),
                                      ('var1', var1), ('w2', w2), ('b2', b2), ('w3', w3), ('wf', wf), ('bf', bf))]
    g = helper.make_graph(nodes, 'convnet', [helper.make_tensor_value_info('x', TensorProto.FLOAT, ['N', 3, 16, 16])],
                          [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['N', 10])], inits)
    x = RNG.uniform(-1, 1, (2, 3, 16, 16)).astype(f)
    r = lambda v: np.maximum(v, 0)
    xd = x.astype(np.float64)
    r0 = r(conv2d(xd, w0, b0, 1, 1))
    c1 = conv2d(r0, w1, None, 2, 1)
    r1 = r((c1 - mu1.reshape(1, -1, 1, 1)) / np.sqrt(var1.reshape(1, -1, 1, 1) + 1e-5) * g1.reshape(1, -1, 1, 1)
           + be1.reshape(1, -1, 1, 1))
    r2 = r(conv2d(r1, w2, b2, 1, 1))
    r3 = r(conv2d(r2, w3) + r1)
    y = r3.mean(axis=(2, 3)) @ wf.T.astype(np.float64) + bf
    save(d, g, x, y)
    # the same model in other bytes: a calibration cache of one is refused for the other
    m = onnx.load(os.path.join(d, 'model.onnx'))
    m.doc_string = 'another copy'
    onnx.save(m, os.path.join(d, 'model_b.onnx'))
    os.makedirs(os.path.join(d, 'calib'), exist_ok=True)
    for i in range(8):
        np.save(os.path.join(d, 'calib', 'input_0_%d.npy' % i), RNG.uniform(-1, 1, (2, 3, 16, 16)).astype(f))


def make_qdq_conv(d):
    f = np.float32
    w1 = RNG.normal(0, 0.1, (32, 16, 3, 3)).astype(f)
    b1 = RNG.normal(0, 0.1, 32).astype(f)
    w2 = RNG.normal(0, 0.1, (32, 32, 3, 3)).astype(f)
    w3 = RNG.normal(0, 0.2, (8, 32, 1, 1)).astype(f)
    c1, s1 = wq(w1, 0)
    c2, s2 = wq(w2, 0)
    c3, s3 = wq(w3, 0)
    sx, zx = np.float32(2.0 / 255), np.uint8(128)      # input: uint8 around 128
    sa, za = np.float32(0.02), np.int8(0)             # hidden: int8 symmetric
    sb, zb = np.float32(0.03), np.uint8(0)            # after relu: uint8 from 0
    nodes = [
        helper.make_node('QuantizeLinear', ['x', 'sx', 'zx'], ['xq']),
        helper.make_node('DequantizeLinear', ['xq', 'sx', 'zx'], ['xd']),
        helper.make_node('DequantizeLinear', ['c1', 's1'], ['w1'], axis=0),
        helper.make_node('Conv', ['xd', 'w1', 'b1'], ['h1'], pads=[1, 1, 1, 1]),
        helper.make_node('QuantizeLinear', ['h1', 'sa', 'za'], ['h1q']),
        helper.make_node('DequantizeLinear', ['h1q', 'sa', 'za'], ['h1d']),
        helper.make_node('DequantizeLinear', ['c2', 's2'], ['w2'], axis=0),
        helper.make_node('Conv', ['h1d', 'w2'], ['h2'], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node('Relu', ['h2'], ['r2']),
        helper.make_node('QuantizeLinear', ['r2', 'sb', 'zb'], ['r2q']),
        helper.make_node('DequantizeLinear', ['r2q', 'sb', 'zb'], ['r2d']),
        helper.make_node('DequantizeLinear', ['c3', 's3'], ['w3'], axis=0),
        helper.make_node('Conv', ['r2d', 'w3'], ['y']),
    ]
    inits = [init(n, a) for n, a in (('sx', sx), ('zx', zx), ('c1', c1), ('s1', s1), ('b1', b1), ('sa', sa),
                                      ('za', za), ('c2', c2), ('s2', s2), ('sb', sb), ('zb', zb), ('c3', c3),
                                      ('s3', s3))]
    g = helper.make_graph(nodes, 'qdq_conv', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 16, 12, 12])],
                          [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    x = RNG.uniform(-1, 1, (1, 16, 12, 12)).astype(f)
    deq = lambda c, s: c.astype(np.float64) * s.astype(np.float64).reshape(-1, 1, 1, 1)
    xd = qdq(x, sx, 128, False)
    h1 = conv2d(xd, deq(c1, s1), b1, 1, 1).astype(np.float32)
    h2 = conv2d(qdq(h1, sa, 0, True), deq(c2, s2), None, 2, 1).astype(np.float32)
    y = conv2d(qdq(np.maximum(h2, 0), sb, 0, False), deq(c3, s3))
    save(d, g, x, y)


def make_qdq_mlp(d):
    f = np.float32
    w1 = RNG.normal(0, 0.2, (32, 64)).astype(f)     # MatMul b: (K, N), channels on axis 1
    b1 = RNG.normal(0, 0.1, 64).astype(f)
    w2 = RNG.normal(0, 0.2, (10, 64)).astype(f)     # Gemm transB: (N, K), channels on axis 0
    b2 = RNG.normal(0, 0.1, 10).astype(f)
    c1, s1 = wq(w1, 1)
    c2, s2 = wq(w2, 0)
    sx, zx = np.float32(0.01), np.int8(3)
    sh, zh = np.float32(0.02), np.uint8(0)
    nodes = [
        helper.make_node('QuantizeLinear', ['x', 'sx', 'zx'], ['xq']),
        helper.make_node('DequantizeLinear', ['xq', 'sx', 'zx'], ['xd']),
        helper.make_node('DequantizeLinear', ['c1', 's1'], ['w1'], axis=1),
        helper.make_node('MatMul', ['xd', 'w1'], ['m1']),
        helper.make_node('Add', ['m1', 'b1'], ['a1']),
        helper.make_node('Relu', ['a1'], ['r1']),
        helper.make_node('QuantizeLinear', ['r1', 'sh', 'zh'], ['r1q']),
        helper.make_node('DequantizeLinear', ['r1q', 'sh', 'zh'], ['r1d']),
        helper.make_node('DequantizeLinear', ['c2', 's2'], ['w2'], axis=0),
        helper.make_node('Gemm', ['r1d', 'w2', 'b2'], ['y'], transB=1, alpha=0.5),
    ]
    inits = [init(n, a) for n, a in (('c1', c1), ('s1', s1), ('b1', b1), ('c2', c2), ('s2', s2), ('b2', b2),
                                      ('sx', sx), ('zx', zx), ('sh', sh), ('zh', zh))]
    g = helper.make_graph(nodes, 'qdq_mlp', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [4, 32])],
                          [helper.make_tensor_value_info('y', TensorProto.FLOAT, [4, 10])], inits)
    x = RNG.uniform(-1, 1, (4, 32)).astype(f)
    xd = qdq(x, sx, 3, True)
    r1 = np.maximum(xd @ (c1.astype(np.float64) * s1.astype(np.float64)) + b1, 0).astype(np.float32)
    y = 0.5 * (qdq(r1, sh, 0, False) @ (c2.astype(np.float64) * s2.reshape(-1, 1)).T) + b2
    save(d, g, x, y)


def main():
    if sys.argv[1] == 'make':
        out = sys.argv[2]
        make_convnet(os.path.join(out, 'convnet'))
        make_qdq_conv(os.path.join(out, 'qdq_conv'))
        make_qdq_mlp(os.path.join(out, 'qdq_mlp'))
        return 0
    if sys.argv[1] == 'npy':
        # npy OUTDIR PREFIX N SHAPE KIND: N arrays PREFIX_K.npy, KIND normal | ids:V | ones
        out, prefix, n, shape, kind = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
        dims = tuple(int(v) for v in shape.split('x'))
        os.makedirs(out, exist_ok=True)
        for k in range(n):
            if kind == 'normal':
                a = RNG.standard_normal(dims).astype(np.float32)
            elif kind.startswith('ids:'):
                a = RNG.integers(0, int(kind[4:]), dims).astype(np.int64)
            else:
                a = np.ones(dims, np.float32)
            np.save(os.path.join(out, '%s_%d.npy' % (prefix, k)), a)
        return 0
    if sys.argv[1] == 'compare':
        got = numpy_helper.to_array(onnx.load_tensor(sys.argv[2])).astype(np.float64)
        want = numpy_helper.to_array(onnx.load_tensor(sys.argv[3])).astype(np.float64)
        frac = float(sys.argv[4])
        if got.shape != want.shape:
            print('shape %s, want %s' % (got.shape, want.shape))
            return 1
        err, big = np.abs(got - want).max(), np.abs(want).max()
        print('max abs err %.4g of values up to %.4g (%.3g%%, bound %.3g%%)' % (err, big, 100 * err / big, 100 * frac))
        return 0 if err <= frac * big else 1
    return 2


if __name__ == '__main__':
    sys.exit(main())

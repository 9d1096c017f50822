#!/usr/bin/env node
// ort_bench.js — ONNX Runtime (CPU) latency/throughput for one ONNX model,
// the peer figure for Turbine's `bench --engine`.
//
//   node ort_bench.js MODEL.onnx --shape input_ids:1x128 --shape attention_mask:1x128 \
//        [--threads 2] [--warmup 5] [--iters 50] [--min-seconds S]
//
// Every graph input must be given a shape with --shape NAME:D0xD1x...
// Inputs are filled with fixed pseudo-random data: floats uniform in [-1, 1),
// integer inputs in [0, --int-max) (default 100; names ending in "mask" get 1).
// Prints one JSON object: throughput (inferences/s and samples/s, where the
// batch is the first dimension of the first input) and latency min/mean/
// median/p99 in ms.
'use strict';
const ort = require('onnxruntime-node');

function usage(msg) {
  if (msg) process.stderr.write(`ort_bench: ${msg}\n`);
  process.stderr.write('usage: ort_bench.js MODEL.onnx --shape NAME:D0xD1x... [--shape ...] ' +
    '[--threads N] [--warmup N] [--iters N] [--min-seconds S] [--int-max N]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const o = { model: null, shapes: {}, threads: 2, warmup: 5, iters: 50, minSeconds: 0, intMax: 100 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => { if (i + 1 >= argv.length) usage(`${a} needs a value`); return argv[++i]; };
    if (a === '--shape') {
      const v = val(); const c = v.lastIndexOf(':');
      if (c <= 0) usage(`bad --shape ${v}`);
      const dims = v.slice(c + 1).split('x').map(Number);
      if (dims.some((d) => !Number.isInteger(d) || d < 0)) usage(`bad --shape ${v}`);
      o.shapes[v.slice(0, c)] = dims;
    } else if (a === '--threads') o.threads = parseInt(val(), 10);
    else if (a === '--warmup') o.warmup = parseInt(val(), 10);
    else if (a === '--iters') o.iters = parseInt(val(), 10);
    else if (a === '--min-seconds') o.minSeconds = parseFloat(val());
    else if (a === '--int-max') o.intMax = parseInt(val(), 10);
    else if (a === '-h' || a === '--help') usage();
    else if (a.startsWith('-')) usage(`unknown option ${a}`);
    else if (o.model === null) o.model = a;
    else usage(`unexpected argument ${a}`);
  }
  if (!o.model) usage('no model');
  if (!(o.threads >= 1) || !(o.iters >= 1) || !(o.warmup >= 0)) usage('bad --threads/--iters/--warmup');
  return o;
}

// xorshift32: the same inputs on every run
let rngState = 0x12345678;
function rnd() {
  rngState ^= rngState << 13; rngState >>>= 0;
  rngState ^= rngState >>> 17;
  rngState ^= rngState << 5; rngState >>>= 0;
  return rngState / 4294967296;
}

const TYPED = {
  float32: Float32Array, float64: Float64Array, int32: Int32Array, int64: BigInt64Array,
  int8: Int8Array, uint8: Uint8Array, bool: Uint8Array, float16: Uint16Array,
};

function makeTensor(name, type, dims, intMax) {
  const n = dims.reduce((a, b) => a * b, 1);
  const C = TYPED[type];
  if (!C) throw new Error(`input ${name}: type ${type} not supported by ort_bench`);
  const data = new C(n);
  const isMask = /mask$/i.test(name);
  for (let i = 0; i < n; i++) {
    if (type === 'float32' || type === 'float64') data[i] = rnd() * 2 - 1;
    else if (type === 'float16') data[i] = 0x3c00; // 1.0
    else if (type === 'bool') data[i] = 1;
    else {
      const v = isMask ? 1 : Math.floor(rnd() * intMax);
      data[i] = type === 'int64' ? BigInt(v) : v;
    }
  }
  return new ort.Tensor(type, data, dims);
}

function pct(sorted, p) {
  const k = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[k];
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const opts = {
    executionProviders: ['cpu'],
    intraOpNumThreads: o.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  };
  const t0 = process.hrtime.bigint();
  const session = await ort.InferenceSession.create(o.model, opts);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;

  const meta = session.inputMetadata || [];
  const feeds = {};
  for (const name of session.inputNames) {
    if (!o.shapes[name]) usage(`no --shape for input ${name} (inputs: ${session.inputNames.join(', ')})`);
    const m = Array.isArray(meta) ? meta.find((x) => x.name === name) : null;
    const type = (m && m.type) || 'float32';
    feeds[name] = makeTensor(name, type, o.shapes[name], o.intMax);
  }
  for (const name of Object.keys(o.shapes)) {
    if (!session.inputNames.includes(name)) usage(`--shape for unknown input ${name}`);
  }

  for (let i = 0; i < o.warmup; i++) await session.run(feeds);
  const lat = [];
  const start = process.hrtime.bigint();
  for (;;) {
    const a = process.hrtime.bigint();
    await session.run(feeds);
    lat.push(Number(process.hrtime.bigint() - a) / 1e6);
    const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
    if (lat.length >= o.iters && elapsed >= o.minSeconds) break;
  }
  const total = Number(process.hrtime.bigint() - start) / 1e9;
  const sorted = lat.slice().sort((x, y) => x - y);
  const mean = lat.reduce((x, y) => x + y, 0) / lat.length;
  const median = sorted.length % 2 ? sorted[(sorted.length - 1) / 2]
    : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;
  const firstShape = o.shapes[session.inputNames[0]];
  const batch = firstShape && firstShape.length ? firstShape[0] : 1;
  const r3 = (x) => Math.round(x * 1000) / 1000;
  const out = {
    runtime: 'onnxruntime-node',
    version: ort.env.versions ? ort.env.versions.node || ort.env.versions.common : undefined,
    model: o.model,
    shapes: o.shapes,
    batch,
    threads: { intra_op: o.threads, inter_op: 1 },
    graph_optimization: 'all',
    load_ms: r3(loadMs),
    warmup: o.warmup,
    iters: lat.length,
    throughput_per_s: r3(lat.length / total),
    samples_per_s: r3((lat.length * batch) / total),
    latency_ms: {
      min: r3(sorted[0]), mean: r3(mean), median: r3(median), p99: r3(pct(sorted, 99)),
      max: r3(sorted[sorted.length - 1]),
    },
  };
  process.stdout.write(JSON.stringify(out) + '\n');
  if (session.release) await session.release();
}

main().catch((e) => { process.stderr.write(`ort_bench: ${e && e.stack ? e.stack : e}\n`); process.exit(1); });

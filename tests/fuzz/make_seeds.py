#!/usr/bin/env python3
"""make_seeds.py OUT_DIR — seed inputs for the harnesses of tests/fuzz, made
from real files at test time (nothing here is committed): OUT_DIR/HARNESS/
for each harness (fuzz_safetensors, ...). Reads the shared models through
TURBINE_SHARED, the demo model through TURBINE_SRC and builds two tiny
engines with TURBINE_BIN. A harness without seeds starts from nothing.

Adding a harness: one line in SEEDS naming a function that writes its seeds:
copy_files("GLOB", ...) for real files as they are (paths may start with
$SHARED or $SRC), or a seeds_NAME(out, work) of its own."""
import glob
import json
import os
import random
import struct
import subprocess
import sys

SRC = os.environ.get("TURBINE_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.environ.get("TURBINE_SHARED", os.path.join(SRC, "..", "shared"))
BIN = os.environ.get("TURBINE_BIN", "")
DEMO = os.path.join(SRC, "models", "demo", "shakespeare")
SEP = b"TBFUZSEC"  # fuzz_engine.c's section separator
rng = random.Random(1)


def put(out, name, data):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path, limit=None):
    try:
        with open(path, "rb") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return None


def floats(n):
    return struct.pack("<%df" % n, *[rng.uniform(-0.1, 0.1) for _ in range(n)])


# ---------------------------------------------------------------- model files

def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] -> a .safetensors file."""
    hdr, data = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + data


def tiny_llama_tensors(vocab, dim=8, hidden=16, layers=1, heads=2, kv_heads=1):
    hd = dim // heads
    t = [("model.embed_tokens.weight", "F32", [vocab, dim], floats(vocab * dim))]
    for l in range(layers):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", "F32", [dim], struct.pack("<%df" % dim, *[1.0] * dim)),
              (p + "self_attn.q_proj.weight", "F32", [dim, dim], floats(dim * dim)),
              (p + "self_attn.k_proj.weight", "F32", [kv_heads * hd, dim], floats(kv_heads * hd * dim)),
              (p + "self_attn.v_proj.weight", "F32", [kv_heads * hd, dim], floats(kv_heads * hd * dim)),
              (p + "self_attn.o_proj.weight", "F32", [dim, dim], floats(dim * dim)),
              (p + "post_attention_layernorm.weight", "F32", [dim], struct.pack("<%df" % dim, *[1.0] * dim)),
              (p + "mlp.gate_proj.weight", "F32", [hidden, dim], floats(hidden * dim)),
              (p + "mlp.up_proj.weight", "F32", [hidden, dim], floats(hidden * dim)),
              (p + "mlp.down_proj.weight", "F32", [dim, hidden], floats(dim * hidden))]
    t.append(("model.norm.weight", "F32", [dim], struct.pack("<%df" % dim, *[1.0] * dim)))
    return t


def tiny_config(vocab, **kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": 8,
         "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 4, "hidden_act": "silu", "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
         "torch_dtype": "float32"}
    c.update(kw)
    return c


def llama2c_checkpoint(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=True):
    hs, kv = dim // heads, kv_heads * (dim // heads)
    n = (vocab * dim + layers * dim + layers * dim * dim * 2 + layers * kv * dim * 2 + layers * dim +
         layers * hidden * dim * 3 + dim + seq * (hs // 2) * 2 + (0 if shared else vocab * dim))
    head = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq)
    return head + floats(n)


# ---------------------------------------------------------------- engines

def engine_sections(path):
    """{name: bytes} of an engine file (src/plan/engine.h)."""
    d = read(path)
    if not d or d[:8] != b"TBENGINE":
        return None
    cnt = struct.unpack_from("<I", d, 12)[0]
    secs = {}
    for i in range(cnt):
        name, off, size, _ = struct.unpack_from("<24sQQQ", d, 64 + 48 * i)
        secs[name.rstrip(b"\0").decode()] = d[off:off + size]
    return secs


_engines = None


def engines(work):
    """Two tiny engines: a llama2.c checkpoint with the stories260K tokenizer
    and a Hugging Face folder with the demo model's byte-level tokenizer."""
    global _engines
    if _engines is not None:
        return _engines
    _engines = []
    if not BIN or not os.access(BIN, os.X_OK):
        print("make_seeds: no TURBINE_BIN: no engine seeds")
        return _engines
    os.makedirs(work, exist_ok=True)
    tok512 = os.path.join(SHARED, "models", "stories260K", "tok512.bin")
    l2c = os.path.join(work, "tiny.bin")
    put(work, "tiny.bin", llama2c_checkpoint(8, 16, 1, 2, 1, 512, 16))
    hf = os.path.join(work, "tiny_hf")
    demo_tok = read(os.path.join(DEMO, "tokenizer.json"))
    if demo_tok:
        put(hf, "config.json", json.dumps(tiny_config(1024, bos_token_id=1023, eos_token_id=1023)))
        put(hf, "model.safetensors", safetensors(tiny_llama_tensors(1024)))
        put(hf, "tokenizer.json", demo_tok)
        put(hf, "tokenizer_config.json", json.dumps({
            "eos_token": "<|endoftext|>", "add_bos_token": False,
            "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}))
    builds = []
    if os.path.exists(tok512):
        builds.append([l2c, "--tokenizer", tok512, "-o", os.path.join(work, "tiny_l2c.engine")])
    if demo_tok:
        builds.append([hf, "-o", os.path.join(work, "tiny_hf.engine")])
    for b in builds:
        cmd = [BIN, "build"] + b + ["--max-seq-len", "16", "--max-batch", "2"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            print("make_seeds: %s failed:\n%s" % (" ".join(cmd), r.stdout.decode(errors="replace")[-2000:]))
            continue
        _engines.append(b[-1])
    return _engines


# ---------------------------------------------------------------- per harness

def copy_files(*patterns, limit=1 << 20):
    """Seeds that are real files (each cut to `limit` bytes)."""
    def seeds(out, work):
        for p in patterns:
            p = p.replace("$SHARED", SHARED).replace("$SRC", SRC)
            for f in sorted(glob.glob(p, recursive=True)):
                data = read(f, limit)
                if data is not None:
                    put(out, os.path.relpath(f, os.path.dirname(p.split("*")[0]) or ".").replace("/", "_"), data)
    return seeds


def seeds_fuzz_safetensors(out, work):
    put(out, "tiny_llama", safetensors(tiny_llama_tensors(16)))
    put(out, "dtypes", safetensors([("a", "F32", [2, 2], floats(4)), ("b", "F16", [3], b"\0\x3c" * 3),
                                    ("c", "BF16", [1, 2], b"\x80\x3f" * 2), ("s", "F32", [], floats(1)),
                                    ("e", "F32", [0, 4], b"")], meta={"format": "pt"}))
    put(out, "unsupported", safetensors([("i", "I64", [1], b"\0" * 8), ("u", "U8", [4], b"abcd")]))
    demo = read(os.path.join(DEMO, "model.safetensors"), 1 << 16)
    if demo and len(demo) > 8:  # the demo model's real header, its data cut short
        hlen = struct.unpack_from("<Q", demo)[0]
        if 8 + hlen <= len(demo):
            put(out, "demo_header", demo[:8 + hlen] + demo[8 + hlen:8 + hlen + 256])


def seeds_fuzz_llama2c(out, work):
    put(out, "tiny_shared", llama2c_checkpoint(8, 16, 1, 2, 1, 16, 8))
    put(out, "tiny_classifier", llama2c_checkpoint(8, 12, 2, 4, 2, 10, 4, shared=False))
    real = read(os.path.join(SHARED, "models", "stories260K", "stories260K.bin"), 4096)
    if real:
        put(out, "stories260K_head", real)  # a real header; the file cut short


def seeds_fuzz_hf_config(out, work):
    c = read(os.path.join(DEMO, "config.json"))
    if c:
        put(out, "demo", c)
    put(out, "llama3", json.dumps(tiny_config(1024, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, eos_token_id=[1, 2, 3])))
    put(out, "qwen2", json.dumps(tiny_config(1024, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                                             attention_bias=True, rope_scaling={"type": "linear", "factor": 2.0})))
    put(out, "mistral", json.dumps(tiny_config(1024, architectures=["MistralForCausalLM"], sliding_window=None,
                                               tie_word_embeddings=False, torch_dtype="bfloat16")))


SPM_JSON = {
    "added_tokens": [{"id": 0, "content": "<unk>", "special": True}, {"id": 1, "content": "<s>", "special": True},
                     {"id": 2, "content": "</s>", "special": True},
                     {"id": 12, "content": "<tool>", "special": False, "lstrip": True, "rstrip": True}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                       {"type": "Replace", "pattern": {"String": " "},
                                                        "content": "\u2581"}]},
    "pre_tokenizer": None,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                {"Sequence": {"id": "A", "type_id": 0}}]},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"},
                                                 {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x21>": 3, "<0xC3>": 4, "<0xA9>": 5, "\u2581": 6,
                        "a": 7, "b": 8, "\u2581a": 9, "ab": 10, "\u2581ab": 11},
              "merges": ["a b", ["\u2581", "ab"], "\u2581 a"]}}


def seeds_fuzz_tokenizer_json(out, work):
    t = read(os.path.join(DEMO, "tokenizer.json"))
    if t:
        put(out, "demo_byte_level", t)
    put(out, "spm", json.dumps(SPM_JSON))
    meta = dict(SPM_JSON)
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    meta["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    put(out, "spm_metaspace", json.dumps(meta))
    put(out, "byte_level_small", json.dumps({
        "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3, "\u0120ab": 4},
                  "merges": ["a b", "\u0120 ab"], "ignore_merges": True}}))


def seeds_fuzz_tokenizer_bin(out, work):
    t = read(os.path.join(SHARED, "models", "stories260K", "tok512.bin"))
    if t:
        put(out, "tok512", t)
    big = read(os.path.join(SHARED, "models", "llama2_tokenizer.bin"), 1 << 20)
    if big:  # the Llama 2 tokenizer's first 1000 records (byte tokens and the first merges)
        pos = 4
        for _ in range(1000):
            if pos + 8 > len(big):
                break
            pos += 8 + struct.unpack_from("<i", big, pos + 4)[0]
        put(out, "llama2_head", big[:pos])


def seeds_fuzz_tokenizer_blob(out, work):
    for e in engines(work):
        s = engine_sections(e)
        if s and len(s.get("tokenizer", b"")) > 8:
            put(out, os.path.basename(e), s["tokenizer"][:-8])  # the harness appends the checksum


def seeds_fuzz_graph(out, work):
    for e in engines(work):
        s = engine_sections(e)
        if s and "graph" in s:
            put(out, os.path.basename(e), s["graph"])


def seeds_fuzz_engine(out, work):
    for e in engines(work):
        s = engine_sections(e)
        if not s:
            continue
        name = os.path.basename(e)
        put(out, name + "_raw", b"\x01" + read(e))
        parts = [s.get(k, b"") for k in ("meta", "hardware", "tokenizer", "graph", "weights")]
        put(out, name + "_sections", b"\x00" + SEP.join(parts))


def seeds_fuzz_serve_request(out, work):
    comp = [
        {"prompt": "Once upon a time", "max_tokens": 8},
        {"model": "fuzz-model", "prompt": ["the thing"], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9,
         "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n", "the"], "n": 2, "echo": True},
        {"prompt": [1, 300, 301, 302], "max_tokens": 3, "echo": True, "stream": True,
         "stream_options": {"include_usage": True}},
        {"prompt": "x", "logprobs": 3, "repetition_penalty": 1.1, "presence_penalty": 0.5,
         "frequency_penalty": -0.5, "ignore_eos": True, "min_tokens": 2, "max_tokens": 4, "user": "u"},
        {"prompt": "a\u0000b", "stop": "b\u0000", "max_completion_tokens": 60, "logit_bias": {}, "best_of": 1},
        {"prompt": ["one", [1, 300, 301], "two three"], "max_tokens": 5, "n": 2, "echo": True},
        {"prompt": [1, 300, 301, 302], "max_tokens": 0, "echo": True, "logprobs": 2},
    ]
    chat = [
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        {"model": "fuzz-model", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Tell me a story"},
                                             {"role": "assistant", "content": "Once"},
                                             {"role": "developer", "content": "More"}],
         "logprobs": True, "top_logprobs": 2, "stream": True, "response_format": {"type": "text"}},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], "modalities": ["text"],
         "stop": ["\u00e9"], "n": 3},
    ]
    i = 0
    for b in comp:
        put(out, "completion_%d" % i, b"\x00" + json.dumps(b).encode())
        i += 1
    for k, b in enumerate(chat):
        for fmt in range(5):
            put(out, "chat_%d_%d" % (k, fmt), bytes([1 | fmt << 1]) + json.dumps(b).encode())
    put(out, "not_an_object", b"\x00[1, 2]")


def seeds_fuzz_chat(out, work):
    templates = ["", "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}",
                 "<|start_header_id|>{{ role }}<|end_header_id|>", "[INST] <<SYS>>\n{{ s }}\n<</SYS>> [/INST]",
                 "{{ bos_token }}[INST] {{ m }} [/INST]", "{{ unknown }}"]
    msgs = [(0, b"You are helpful."), (1, b"Hi there"), (2, b"Hello!"), (1, b"a\0b")]
    body = b"".join(bytes([r, len(c) & 255, len(c) >> 8]) + c for r, c in msgs)
    for k, t in enumerate(templates):
        put(out, "template_%d" % k, bytes([k | (0x80 if k % 2 else 0)]) + t.encode() + b"\0" + body)


def seeds_fuzz_onnx(out, work):
    """The small models tests/onnx_import/gen_models.py writes (python3-onnx)."""
    d = os.path.join(work, "onnx")
    try:
        subprocess.run(["/usr/bin/python3", os.path.join(SRC, "tests", "onnx_import", "gen_models.py"), d],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return  # no python3-onnx: the harness starts from an empty corpus
    for f in sorted(glob.glob(os.path.join(d, "*.onnx"))):
        data = read(f, 1 << 20)
        if data is not None:
            put(out, os.path.basename(f), data)


def seeds_fuzz_repo_config(out, work):
    put(out, "empty", "{}")
    put(out, "full", json.dumps({
        "name": "fuzz", "max_batch_size": 8,
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 2000,
                             "default_queue_policy": {"max_queue_size": 64, "default_timeout_microseconds": 100000,
                                                      "timeout_action": "REJECT", "allow_timeout_override": True}},
        "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0], "threads": 1}],
        "version_policy": {"latest": {"num_versions": 2}},
        "build": {"dtype": "int8", "min_shapes": "input:1x3x224x224", "max_shapes": "input:8x3x224x224",
                  "calib_data": "calib"}}))
    put(out, "all", json.dumps({"version_policy": {"all": {}}, "instance_group": [{"kind": "KIND_CPU"}]}))
    put(out, "specific", json.dumps({"version_policy": {"specific": {"versions": [1, 3]}},
                                     "build": {"dtype": "f16", "shapes": "x:1x8"}}))


def seeds_fuzz_kserve(out, work):
    """KServe v2 infer bodies: JSON tensors, output selection, the binary extension (byte 0 bit 0 and
    bytes 1-2: Inference-Header-Content-Length), and a route."""
    ins = [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4.5, -1e-3, 0]]},
           {"name": "ids", "shape": [2], "datatype": "INT64", "data": [1, -2]},
           {"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
           {"name": "h", "shape": [1], "datatype": "FP16", "data": [0.5]}]
    put(out, "json", b"\0\0\0" + json.dumps({"id": "a", "inputs": ins}).encode())
    put(out, "json_outputs", b"\0\0\0" + json.dumps(
        {"inputs": ins, "outputs": [{"name": "h"}, {"name": "x", "parameters": {"binary_data": True}}],
         "parameters": {"binary_data_output": False}}).encode())
    bx = [dict(ins[0], parameters={"binary_data_size": 24}), ins[1], dict(ins[2], shape=[0, 2], data=[]),
          dict(ins[3], parameters={"binary_data_size": 2})]
    del bx[0]["data"]
    del bx[3]["data"]
    h = json.dumps({"inputs": bx, "parameters": {"binary_data_output": True}}).encode()
    put(out, "binary", bytes([1, len(h) & 255, len(h) >> 8]) + h + struct.pack("<6f", 1, 2, 3, 4, 5, 6) + b"\x00\x3c")
    put(out, "route", b"\0\0\0/v2/models/m/versions/1/infer")


def _pb_varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _pb(num, value):
    """One protobuf field: an int as a varint, bytes/str/list-of-fields as length-delimited."""
    if isinstance(value, int):
        return _pb_varint(num << 3) + _pb_varint(value)
    if isinstance(value, str):
        value = value.encode()
    return _pb_varint(num << 3 | 2) + _pb_varint(len(value)) + value


def seeds_fuzz_kserve_grpc(out, work):
    """KServe v2 gRPC ModelInferRequest messages (src/serve/kserve_grpc.proto, encoded by hand): typed
    contents of each field, raw_input_contents, requested outputs, the timeout parameter."""
    def tensor(name, dt, shape, contents=b""):
        t = _pb(1, name) + _pb(2, dt) + _pb(3, b"".join(_pb_varint(d) for d in shape))
        return t + (_pb(5, contents) if contents else b"")

    fp32 = _pb(6, struct.pack("<6f", 1, 2, 3, 4.5, -1e-3, 0))
    int64 = _pb(3, _pb_varint(1) + _pb_varint(-2))
    bools = _pb(1, bytes([1, 0]))
    timeout = _pb(4, _pb(1, "timeout") + _pb(2, _pb(2, 5000)))
    typed = (_pb(1, "m") + _pb(3, "id-1") + timeout + _pb(5, tensor("x", "FP32", [2, 3], fp32)) +
             _pb(5, tensor("ids", "INT64", [2], int64)) + _pb(5, tensor("b", "BOOL", [1, 2], bools)) +
             _pb(5, tensor("h", "FP16", [1])))
    put(out, "typed_h_missing_raw", typed)
    raw = (_pb(1, "m") + _pb(2, "1") + _pb(5, tensor("x", "FP32", [2, 3])) + _pb(5, tensor("ids", "INT64", [2])) +
           _pb(5, tensor("b", "BOOL", [0, 2])) + _pb(5, tensor("h", "FP16", [1])) +
           _pb(6, _pb(1, "h")) + _pb(6, _pb(1, "x")) +
           _pb(7, struct.pack("<6f", 1, 2, 3, 4, 5, 6)) + _pb(7, struct.pack("<2q", 7, -8)) + _pb(7, b"") +
           _pb(7, b"\x00\x3c"))
    put(out, "raw", raw)
    put(out, "empty", b"")
    # model names starting with "l": the LLM profile (text_input BYTES, optional max_tokens, parameters)
    par = (_pb(4, _pb(1, "temperature") + _pb(2, _pb(4, struct.pack("<d", 0.5)))) +
           _pb(4, _pb(1, "stop") + _pb(2, _pb(3, "\n"))) + _pb(4, _pb(1, "ignore_eos") + _pb(2, _pb(1, 1))))
    put(out, "llm_typed", _pb(1, "llm") + par + _pb(5, tensor("text_input", "BYTES", [2], _pb(8, "Once") + _pb(8, ""))) +
        _pb(5, tensor("max_tokens", "INT32", [1], _pb(2, _pb_varint(7)))))
    put(out, "llm_raw", _pb(1, "llm") + _pb(5, tensor("text_input", "BYTES", [1])) +
        _pb(7, struct.pack("<I", 3) + b"abc"))


SEEDS = {
    "fuzz_safetensors": seeds_fuzz_safetensors,
    "fuzz_llama2c": seeds_fuzz_llama2c,
    "fuzz_hf_config": seeds_fuzz_hf_config,
    "fuzz_tokenizer_json": seeds_fuzz_tokenizer_json,
    "fuzz_tokenizer_bin": seeds_fuzz_tokenizer_bin,
    "fuzz_tokenizer_blob": seeds_fuzz_tokenizer_blob,
    "fuzz_graph": seeds_fuzz_graph,
    "fuzz_engine": seeds_fuzz_engine,
    "fuzz_serve_request": seeds_fuzz_serve_request,
    "fuzz_chat": seeds_fuzz_chat,
    "fuzz_onnx": seeds_fuzz_onnx,
    "fuzz_repo_config": seeds_fuzz_repo_config,
    "fuzz_kserve": seeds_fuzz_kserve,
    "fuzz_kserve_grpc": seeds_fuzz_kserve_grpc,
}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_seeds.py OUT_DIR")
    out = sys.argv[1]
    work = os.path.join(out, ".work")
    for name, fn in SEEDS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        fn(d, work)
        print("make_seeds: %-22s %d seeds" % (name, len(os.listdir(d))))


if __name__ == "__main__":
    main()

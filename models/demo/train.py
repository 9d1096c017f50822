#!/usr/bin/env python3
"""train.py: trains Turbine's bundled demo model on tinyshakespeare.

One script, plain PyTorch. It
  1. trains a byte-level BPE tokenizer (GPT-2 byte table and pre-tokenizer)
     on the training split (the first 90% of the text; the last 10% is the
     held-out test split) and writes an HF tokenizer.json;
  2. trains a small Llama (RMSNorm, RoPE in the HF rotate_half layout, GQA,
     SiLU-gated MLP, tied embeddings) with AdamW and a cosine schedule, bf16
     autocast on a GPU. The training split is cut once more: its first 95%
     trains, its last 5% is a validation split that picks the best step (and
     the best dropout when several are given), so the test split is touched
     once, at the end;
  3. reports the test loss (mean cross-entropy per token over the last 10%)
     and perplexity, and samples from "ROMEO:" (greedy and temperature 0.8);
  4. saves a Hugging Face folder (config.json, model.safetensors in f16,
     tokenizer.json, tokenizer_config.json, generation_config.json) and a
     TRAINING.md with the figures.

    python3 models/demo/train.py --out DIR              # full run (GPU)
    python3 models/demo/train.py --smoke --out DIR      # a minute on a CPU

The wall time is capped (--time-limit, default 330 s, counted from the start
of the script): training stops early and the best state so far is saved.
"""
import argparse
import collections
import json
import math
import os
import platform
import re
import struct
import sys
import time

# ---------------------------------------------------------------- tokenizer

# The pattern written into tokenizer.json (GPT-2's, understood by PCRE2 and
# by HF tokenizers) and its ASCII equivalent for Python's `re`. On ASCII text
# \p{L} is [A-Za-z], \p{N} is [0-9], and \s is the same six characters in both
# engines, so the two give the same pre-tokens; check_pretokenizer() verifies
# this on the corpus when the `regex` module is present.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
ASCII_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
PRE_RE = re.compile(ASCII_PATTERN, re.ASCII)
EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's table: every byte to a printable unicode character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENC = bytes_to_unicode()


def pretokenize(text):
    return PRE_RE.findall(text)


def check_pretokenizer(text):
    """Compares the ASCII pattern with GPT2_PATTERN (through `regex`) on text."""
    try:
        import regex
    except ImportError:
        return "not checked (no `regex` module)"
    a = pretokenize(text)
    b = regex.findall(GPT2_PATTERN, text)
    if a != b:
        i = next(k for k in range(min(len(a), len(b))) if a[k] != b[k]) if a[:len(b)] != b[:len(a)] else min(len(a), len(b))
        raise SystemExit("pre-tokenizer mismatch at piece %d: %r vs %r" % (i, a[i:i + 3], b[i:i + 3]))
    return "identical on %d pre-tokens (`regex` with \\p{L}/\\p{N} vs `re` with ASCII classes)" % len(a)


def train_bpe(text, n_merges):
    """Learns up to n_merges merges by pair counts over the pre-tokens of text.
    Base tokens are ids 0..255 (= byte values); merge i makes id 256 + i.
    Returns [(a, b)], the merged pairs in rank order."""
    freq = collections.Counter(pretokenize(text))
    words = [list(w.encode("utf-8")) for w in freq]
    counts = list(freq.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += counts[wi]
            where[p].add(wi)
    merges = []
    for step in range(n_merges):
        if not pairs:
            break
        best, c = max(pairs.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
        if c < 2:
            break
        new = 256 + step
        merges.append(best)
        for wi in list(where[best]):
            w, f = words[wi], counts[wi]
            for p in zip(w, w[1:]):
                pairs[p] -= f
                if pairs[p] <= 0:
                    del pairs[p]
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pairs[p] += f
                where[p].add(wi)
        pairs.pop(best, None)
        where.pop(best, None)
    return merges


class Tokenizer:
    """Rank-based byte-level BPE, the way HF tokenizers applies merges: in each
    pre-token, repeatedly merge the adjacent pair of lowest rank."""

    def __init__(self, merges):
        self.merges = merges
        self.rank = {p: i for i, p in enumerate(merges)}
        self.bytes = [bytes([i]) for i in range(256)]
        for a, b in merges:
            self.bytes.append(self.bytes[a] + self.bytes[b])
        self.eot = len(self.bytes)
        self.vocab_size = self.eot + 1
        self.cache = {}

    def encode_word(self, w):
        ids = self.cache.get(w)
        if ids is not None:
            return ids
        ids = list(w.encode("utf-8"))
        while len(ids) > 1:
            r, i = min((self.rank.get(p, 1 << 30), k) for k, p in enumerate(zip(ids, ids[1:])))
            if r == 1 << 30:
                break
            a, b = self.merges[r]
            new, out, k = 256 + r, [], 0
            while k < len(ids):
                if k + 1 < len(ids) and ids[k] == a and ids[k + 1] == b:
                    out.append(new)
                    k += 2
                else:
                    out.append(ids[k])
                    k += 1
            ids = out
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in pretokenize(text):
            out.extend(self.encode_word(w))
        return out

    def decode(self, ids):
        return b"".join(self.bytes[i] for i in ids if i < self.eot).decode("utf-8", errors="replace")

    def piece(self, i):
        return EOT if i == self.eot else "".join(BYTE_ENC[b] for b in self.bytes[i])

    def hf_json(self):
        vocab = {self.piece(i): i for i in range(self.vocab_size)}
        assert len(vocab) == self.vocab_size, "duplicate token strings"
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [{"id": self.eot, "content": EOT, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": GPT2_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab,
                      "merges": ["%s %s" % (self.piece(a), self.piece(b)) for a, b in self.merges]},
        }


def check_hf_tokenizer(path, tok, text):
    """Encodes text with HF tokenizers (when installed) and compares."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        return "not checked (no `tokenizers` module)"
    hf = HFTokenizer.from_file(path)
    a, b = hf.encode(text).ids, tok.encode(text)
    if a != b:
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        raise SystemExit("HF tokenizers disagrees at token %d: %r vs %r" % (i, a[i:i + 5], b[i:i + 5]))
    if hf.decode(a) != text:
        raise SystemExit("HF tokenizers does not decode the text back")
    return "HF tokenizers %s gives the same %d ids on the test split and decodes it back" % (
        __import__("tokenizers").__version__, len(a))


# ---------------------------------------------------------------- model


def build_model_class(torch):
    nn, F = torch.nn, torch.nn.functional
    has_sdpa = hasattr(F, "scaled_dot_product_attention")

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * xf.to(x.dtype)

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            d, H, KV, hd = c["dim"], c["heads"], c["kv_heads"], c["dim"] // c["heads"]
            self.H, self.KV, self.hd = H, KV, hd
            self.input_layernorm = RMSNorm(d, c["eps"])
            self.q_proj = nn.Linear(d, H * hd, bias=False)
            self.k_proj = nn.Linear(d, KV * hd, bias=False)
            self.v_proj = nn.Linear(d, KV * hd, bias=False)
            self.o_proj = nn.Linear(H * hd, d, bias=False)
            self.post_attention_layernorm = RMSNorm(d, c["eps"])
            self.gate_proj = nn.Linear(d, c["ffn"], bias=False)
            self.up_proj = nn.Linear(d, c["ffn"], bias=False)
            self.down_proj = nn.Linear(c["ffn"], d, bias=False)
            self.drop = nn.Dropout(c["dropout"])
            self.p = c["dropout"]

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, T, self.H, self.hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if self.KV != self.H:
                k = k.repeat_interleave(self.H // self.KV, dim=1)
                v = v.repeat_interleave(self.H // self.KV, dim=1)
            if has_sdpa:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   dropout_p=self.p if self.training else 0.0)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                s = s.masked_fill(mask, float("-inf")).softmax(-1)
                a = F.dropout(s, self.p, self.training) @ v
            x = x + self.drop(self.o_proj(a.transpose(1, 2).reshape(B, T, -1)))
            h = self.post_attention_layernorm(x)
            return x + self.drop(self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)))

    class Llama(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.embed_tokens = nn.Embedding(c["vocab"], c["dim"])
            self.layers = nn.ModuleList([Block(c) for _ in range(c["layers"])])
            self.norm = RMSNorm(c["dim"], c["eps"])
            self.drop = nn.Dropout(c["dropout"])
            hd = c["dim"] // c["heads"]
            inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = torch.arange(c["ctx"], dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * c["layers"]) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            T = idx.shape[1]
            x = self.drop(self.embed_tokens(idx))
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
            for b in self.layers:
                x = b(x, cos, sin)
            return F.linear(self.norm(x), self.embed_tokens.weight)

        def hf_tensors(self):
            """{HF name: tensor} of the weights (lm_head tied to the embedding)."""
            out = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight}
            for i, b in enumerate(self.layers):
                p = "model.layers.%d." % i
                out[p + "input_layernorm.weight"] = b.input_layernorm.weight
                out[p + "post_attention_layernorm.weight"] = b.post_attention_layernorm.weight
                for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    out[p + "self_attn.%s.weight" % n] = getattr(b, n).weight
                for n in ("gate_proj", "up_proj", "down_proj"):
                    out[p + "mlp.%s.weight" % n] = getattr(b, n).weight
            return out

    return Llama


def write_safetensors(path, tensors, torch):
    """Writes {name: tensor} as F16: u64 LE header length, JSON header, data."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.float16).contiguous()
        raw = t.numpy().astype("<f2").tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


# ---------------------------------------------------------------- training


def log(*a):
    print(*a, flush=True)


@__import__("contextlib").contextmanager
def _null():
    yield


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--data", default=None, help="tinyshakespeare.txt (default: ../shared/data/ beside the "
                    "repo, else .devdata/ in it)")
    ap.add_argument("--out", required=True, help="Hugging Face folder to write")
    ap.add_argument("--md", default=None, help="TRAINING.md to write (default: OUT/TRAINING.md)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, few steps, part of the text (CPU check)")
    ap.add_argument("--vocab", type=int, default=1024, help="vocab size: 256 bytes + merges + 1 special")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", default="0.1,0.2,0.3",
                    help="comma list; one run per value, the best on the validation split is kept")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--time-limit", type=float, default=330.0, help="seconds for the whole script")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    if a.smoke:
        a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.ctx = 320, 64, 2, 4, 2, 128, 64
        a.batch, a.steps, a.warmup, a.eval_every, a.dropout = 8, 30, 5, 10, "0.0,0.1"

    t0 = time.time()
    import torch
    torch.manual_seed(a.seed)
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    hw = torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine()) + " CPU"
    log("torch %s on %s (%s)" % (torch.__version__, dev, hw))

    path = a.data
    if not path:
        for p in (os.path.join(os.path.dirname(repo), "shared", "data", "tinyshakespeare.txt"),
                  os.path.join(repo, ".devdata", "tinyshakespeare.txt")):
            if os.path.exists(p):
                path = p
                break
    if not path or not os.path.exists(path):
        raise SystemExit("tinyshakespeare.txt not found; pass --data")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.isascii():
        raise SystemExit("the text is not pure ASCII; the ASCII pre-tokenizer would differ from GPT-2's")
    cut = int(len(text) * 0.9)
    train_text, test_text = text[:cut], text[cut:]
    if a.smoke:
        train_text, test_text = train_text[:60000], test_text[:8000]
    log("text: %d chars (%s); train split %d, test split %d" % (len(text), path, len(train_text), len(test_text)))

    # 1. tokenizer
    t = time.time()
    pre_check = check_pretokenizer(text)
    log("pre-tokenizer check: " + pre_check)
    merges = train_bpe(train_text, a.vocab - 257)
    tok = Tokenizer(merges)
    train_ids = tok.encode(train_text)
    test_ids = tok.encode(test_text)
    assert tok.decode(test_ids) == test_text
    tok_time = time.time() - t
    log("tokenizer: %d merges, vocab %d, %d train tokens (%.2f chars/token), %d test tokens, %.1f s" % (
        len(merges), tok.vocab_size, len(train_ids), len(train_text) / len(train_ids), len(test_ids), tok_time))
    os.makedirs(a.out, exist_ok=True)
    tj = os.path.join(a.out, "tokenizer.json")
    with open(tj, "w", encoding="utf-8") as f:
        json.dump(tok.hf_json(), f, ensure_ascii=False, indent=1)
    hf_check = check_hf_tokenizer(tj, tok, test_text)
    log("tokenizer.json check: " + hf_check)

    vcut = int(len(train_ids) * 0.95)
    tr = torch.tensor(train_ids[:vcut], dtype=torch.long)
    va = torch.tensor(train_ids[vcut:], dtype=torch.long)
    te = torch.tensor(test_ids, dtype=torch.long)

    # 2. model(s)
    Llama = build_model_class(torch)
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else _null
    F = torch.nn.functional

    def windows(ids):
        n = (len(ids) - 1) // a.ctx
        x = ids[:n * a.ctx].view(n, a.ctx)
        y = ids[1:n * a.ctx + 1].view(n, a.ctx)
        return x, y

    @torch.no_grad()
    def eval_loss(model, ids, use_amp=True):
        """Mean per-token cross-entropy over non-overlapping ctx windows."""
        was = model.training
        model.eval()
        x, y = windows(ids)
        tot, n = 0.0, 0
        for i in range(0, x.shape[0], 64):
            xb, yb = x[i:i + 64].to(dev), y[i:i + 64].to(dev)
            with (amp() if use_amp else _null()):
                lg = model(xb)
            tot += F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), yb.reshape(-1), reduction="sum").item()
            n += yb.numel()
        model.train(was)
        return tot / n, n

    base = dict(vocab=tok.vocab_size, dim=a.dim, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                ffn=a.ffn, ctx=a.ctx, eps=1e-5, theta=10000.0)
    drops = [float(d) for d in a.dropout.split(",")]
    runs = []
    for ri, p in enumerate(drops):
        torch.manual_seed(a.seed)
        model = Llama(dict(base, dropout=p)).to(dev)
        nparam = sum(q.numel() for q in model.parameters())
        decay = [q for q in model.parameters() if q.dim() >= 2]
        other = [q for q in model.parameters() if q.dim() < 2]
        kw = {"fused": True} if cuda else {}
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), **kw)
        budget = (a.time_limit - (time.time() - t0) - (20 if not a.smoke else 5)) / (len(drops) - ri)
        log("run %d/%d: dropout %.2f, %d parameters, %d steps of %d x %d tokens, %.0f s budget" % (
            ri + 1, len(drops), p, nparam, a.steps, a.batch, a.ctx, budget))
        g = torch.Generator().manual_seed(a.seed + ri)
        rs = time.time()
        best = (float("inf"), -1, None)
        best_train = (float("nan"), 0)
        step, tokens, train_loss = 0, 0, float("nan")
        sm = None
        for step in range(1, a.steps + 1):
            if step <= a.warmup:
                lr = a.lr * step / a.warmup
            else:
                fr = (step - a.warmup) / max(1, a.steps - a.warmup)
                lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * fr)))
            for gr in opt.param_groups:
                gr["lr"] = lr
            ix = torch.randint(0, len(tr) - a.ctx - 1, (a.batch,), generator=g)
            xb = torch.stack([tr[i:i + a.ctx] for i in ix]).to(dev, non_blocking=True)
            yb = torch.stack([tr[i + 1:i + 1 + a.ctx] for i in ix]).to(dev, non_blocking=True)
            with amp():
                lg = model(xb)
            loss = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), yb.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tokens += xb.numel()
            if step == 20:
                if cuda:
                    torch.cuda.synchronize()
                el = time.time() - rs
                log("  first 20 steps: %.2f s, %.0f tokens/s" % (el, tokens / el))
            last = step == a.steps or (time.time() - rs) > budget
            if step % a.eval_every == 0 or last:
                train_loss = loss.item()
                sm = train_loss if sm is None else 0.7 * sm + 0.3 * train_loss
                vl, _ = eval_loss(model, va)
                if vl < best[0]:
                    best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                    best_train = (train_loss, tokens)
                log("  step %5d  lr %.2e  train %.4f  val %.4f  best %.4f@%d  %.0f s" % (
                    step, lr, train_loss, vl, best[0], best[1], time.time() - t0))
            if last:
                break
        if cuda:
            torch.cuda.synchronize()
        el = time.time() - rs
        stopped = step < a.steps
        log("  run done: %d steps, %d tokens, %.1f s, %.0f tokens/s%s" % (
            step, tokens, el, tokens / el, " (stopped by the time limit)" if stopped else ""))
        runs.append(dict(dropout=p, val=best[0], best_step=best[1], state=best[2], steps=step, tokens=tokens,
                         time=el, stopped=stopped, train_loss=sm, nparam=nparam,
                         best_train_loss=best_train[0], best_tokens=best_train[1]))
        del model, opt

    r = min(runs, key=lambda z: z["val"])
    log("chosen: dropout %.2f, step %d, val %.4f" % (r["dropout"], r["best_step"], r["val"]))
    model = Llama(dict(base, dropout=r["dropout"])).to(dev)
    model.load_state_dict(r["state"])
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(q.half().float())  # the figures below are those of the saved f16 weights
    model.eval()
    if cuda:
        # plain f32 matmuls from here on: TF32 can flip greedy near-ties
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    # 3. figures on the test split, samples
    test_loss, ntest = eval_loss(model, te, use_amp=False)
    val_loss, _ = eval_loss(model, va, use_amp=False)
    bpc = test_loss * ntest / len(tok.decode(te[:ntest].tolist())) / math.log(2)
    log("test loss %.4f nats/token (perplexity %.2f) over %d tokens, %.3f bits/char; val %.4f" % (
        test_loss, math.exp(test_loss), ntest, bpc, val_loss))

    @torch.no_grad()
    def generate(prompt, n, temp, seed):
        model.eval()
        gen = torch.Generator(device=dev).manual_seed(seed)
        ids = tok.encode(prompt)
        for _ in range(n):
            lg = model(torch.tensor([ids[-a.ctx:]], device=dev))[0, -1].float()
            if temp == 0:
                nx = int(lg.argmax())
            else:
                nx = int(torch.multinomial((lg / temp).softmax(-1), 1, generator=gen))
            if nx == tok.eot:
                break
            ids.append(nx)
        return tok.decode(ids)

    n_sample = 60 if a.smoke else 200
    greedy = generate("ROMEO:", n_sample, 0.0, 0)
    warm = generate("ROMEO:", n_sample, 0.8, a.seed)
    log("---- greedy, %d tokens\n%s\n---- temperature 0.8, seed %d\n%s\n----" % (n_sample, greedy, a.seed, warm))

    # 4. the Hugging Face folder
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": tok.vocab_size, "hidden_size": a.dim, "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.dim // a.heads, "hidden_act": "silu", "max_position_embeddings": a.ctx,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": tok.eot, "eos_token_id": tok.eot,
        "torch_dtype": "float16", "initializer_range": 0.02,
    }
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": tok.eot, "eos_token_id": tok.eot, "do_sample": True,
                                   "temperature": 0.8, "max_length": a.ctx},
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                                  "eos_token": EOT, "unk_token": None, "pad_token": None, "add_bos_token": False,
                                  "add_prefix_space": False, "model_max_length": a.ctx, "clean_up_tokenization_spaces": False},
    }
    for name, obj in files.items():
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    st = os.path.join(a.out, "model.safetensors")
    write_safetensors(st, model.hf_tensors(), torch)
    size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    total = time.time() - t0
    log("wrote %s (%.2f MB in all, model.safetensors %.2f MB); %.1f s in all" % (
        a.out, size / 1e6, os.path.getsize(st) / 1e6, total))

    cmd = "python3 models/demo/train.py " + " ".join(sys.argv[1:])
    rows = "\n".join("| %.2f | %d%s | %d | %.1f | %.4f | %.4f (step %d) |" % (
        z["dropout"], z["steps"], " (time limit)" if z["stopped"] else "", z["tokens"], z["time"],
        z["train_loss"], z["val"], z["best_step"]) for z in runs)
    md = """# The demo model: a small Llama trained on tinyshakespeare

`models/demo/shakespeare/` was made by `models/demo/train.py` from
`tinyshakespeare.txt` (public domain; {nchars} characters), with:

    {cmd}

- hardware: {hw}, torch {tv}, {prec}
- splits: the first 90% of the text trains the tokenizer; of its tokens, the
  first 95% train the model and the last 5% are a validation split that picks
  the step and the dropout; the last 10% of the text is the test split, used
  only for the figures below.
- tokenizer: byte-level BPE (GPT-2 byte table and pre-tokenizer pattern), {nm}
  merges learned by pair counts on the training split, vocab {V} (256 bytes +
  merges + `<|endoftext|>`), {cpt:.2f} characters per token on the training split.
  Pre-tokenizer: {pre}. tokenizer.json: {hfc}.
- model: Llama, hidden {dim}, {L} layers, {H} heads of {hd} ({KV} KV heads),
  SiLU-gated MLP {ffn}, RoPE theta 10000 (HF rotate_half layout), RMSNorm eps
  1e-5, tied embeddings, context {ctx}; {nparam} parameters, stored as f16
  ({mb:.2f} MB).
- optimisation: AdamW (betas 0.9/0.95, weight decay {wd} on matrices), peak lr
  {lr}, {wu} warm-up steps then cosine to {mlf}x, batch {B} x {ctx} tokens,
  gradient clip 1.0; one run per dropout value, each given an equal share of
  the {tl:.0f} s wall-time limit:

| dropout | steps | tokens seen | seconds | last train loss (smoothed) | best val loss |
| --- | --- | --- | --- | --- | --- |
{rows}

- kept: dropout {cd:.2f} at step {cs}, after {ktok} tokens ({kep:.1f} passes over
  the {ntr} training tokens); train loss at that step {ktl:.4f}; validation loss
  {cv:.4f} nats/token (recomputed in f32 with the f16 weights: {vl:.4f}).
- **test loss: {tl2:.4f} nats/token, perplexity {ppl:.2f}** ({nt} tokens of the
  held-out last 10%, non-overlapping {ctx}-token windows, f32 with the saved f16
  weights); {bpc:.3f} bits per character.
- total wall time of the script: {tot:.0f} s (tokenizer {tt:.0f} s).

## Samples from "ROMEO:" ({ns} tokens)

Greedy:

```
{greedy}
```

Temperature 0.8 (seed {seed}):

```
{warm}
```
""".format(nchars=len(text), cmd=cmd, hw=hw, tv=torch.__version__,
           prec="bf16 autocast" if cuda else "f32", nm=len(merges), V=tok.vocab_size,
           cpt=len(train_text) / len(train_ids), pre=pre_check, hfc=hf_check, dim=a.dim, L=a.layers, H=a.heads,
           hd=a.dim // a.heads, KV=a.kv_heads, ffn=a.ffn, ctx=a.ctx, nparam=r["nparam"],
           mb=os.path.getsize(st) / 1e6, wd=a.wd, lr=a.lr, wu=a.warmup, mlf=a.min_lr_frac, B=a.batch,
           tl=a.time_limit, rows=rows, cd=r["dropout"], cs=r["best_step"], cv=r["val"], vl=val_loss,
           tl2=test_loss, ktok=r["best_tokens"], kep=r["best_tokens"] / len(tr), ntr=len(tr),
           ktl=r["best_train_loss"], ppl=math.exp(test_loss), nt=ntest, bpc=bpc, tot=total, tt=tok_time, ns=n_sample,
           greedy=greedy, warm=warm, seed=a.seed)
    mdp = a.md or os.path.join(a.out, "TRAINING.md")
    with open(mdp, "w") as f:
        f.write(md)
    log("wrote " + mdp)


if __name__ == "__main__":
    main()

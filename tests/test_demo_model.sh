#!/usr/bin/env bash
# The bundled demo model (models/demo/shakespeare): builds an engine from the
# folder with its own tokenizer.json, checks that greedy text from "ROMEO:"
# reads like the play (speaker lines, common words), that prompts come back
# byte for byte, that Turbine's tokenizer gives the ids of an independent
# encoder, and that its logits agree with tests/reference.py.
set -euo pipefail
: "${TURBINE_BIN:?}" "${TURBINE_SRC:?}" "${TURBINE_TMP:?}"
M="$TURBINE_SRC/models/demo/shakespeare"
D="$TURBINE_TMP/demo_model"
PY=/usr/bin/python3
mkdir -p "$D"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
  [ -f "$M/$f" ] || { echo "FAIL: $M/$f is missing"; exit 1; }
done
"$TURBINE_BIN" build "$M" -o "$D/demo.engine" >"$D/build.out" 2>&1 || { cat "$D/build.out"; echo "FAIL: build"; exit 1; }
echo "ok: engine built from $M"

# 1. greedy text reads like Shakespeare
"$TURBINE_BIN" run "$D/demo.engine" -p "ROMEO:" -n 100 --temperature 0 >"$D/greedy.txt" 2>"$D/run.err"
$PY - "$D/greedy.txt" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
if not text.startswith("ROMEO:"):
    sys.exit("FAIL: output does not start with the prompt: %r" % text[:40])
lines = text.split("\n")
speakers = [l for l in lines[1:] if re.fullmatch(r"[A-Z][A-Za-z ]*[A-Za-z]:", l)]
common = {"i", "the", "and", "to", "my", "of", "you", "that", "is", "not", "with", "me", "thy", "thou",
          "thee", "lord", "shall", "will", "good", "be", "a", "o", "what", "for", "his", "your", "so", "have"}
words = re.findall(r"[a-z']+", text.lower())
found = sorted(common & set(words))
print("greedy text (%d chars, %d lines, %d speaker lines, common words %s)" % (
    len(text), len(lines), len(speakers), " ".join(found)))
if len(speakers) < 1:
    sys.exit("FAIL: no 'NAME:' speaker line after the prompt:\n" + text)
if len(found) < 8:
    sys.exit("FAIL: fewer than 8 common Shakespeare words:\n" + text)
if len(words) < 40:
    sys.exit("FAIL: fewer than 40 words:\n" + text)
print("ok: greedy text from ROMEO: looks like the play")
PY

# 2. prompts come back byte for byte, and the ids match an independent encoder
# (the prompt ends without a newline: "$(cat ...)" would drop it)
PROMPT="$D/prompt.txt"
printf '%s' "KING RICHARD II:
What, 'tis the 3rd of May -- and they'll say we've   gone?

O, I'd rather be a dog!  Come, come; away." >"$PROMPT"
"$TURBINE_BIN" run "$D/demo.engine" -p "$(cat "$PROMPT")" -n 1 --temperature 0 >"$D/echo.txt" 2>/dev/null
$PY - "$PROMPT" "$D/echo.txt" <<'PY'
import sys
p, out = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
if not out.startswith(p):
    sys.exit("FAIL: the prompt does not come back exactly:\n%r\n%r" % (p, out[:len(p) + 20]))
print("ok: the prompt (%d bytes) comes back exactly" % len(p))
PY
IDS=$($PY - "$M/tokenizer.json" "$PROMPT" <<'PY'
import json, re, sys
tj = json.load(open(sys.argv[1], encoding="utf-8"))
pre = tj["pre_tokenizer"]
assert pre["type"] == "Sequence" and pre["pretokenizers"][0]["type"] == "Split", pre
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
benc = {b: chr(c) for b, c in zip(bs, cs)}
vocab = tj["model"]["vocab"]
rank = {tuple(m.split(" ")): i for i, m in enumerate(tj["model"]["merges"])}
pat = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", re.ASCII)
ids = []
for w in pat.findall(open(sys.argv[2], encoding="utf-8").read()):
    sym = [benc[b] for b in w.encode("utf-8")]
    while len(sym) > 1:
        r, i = min((rank.get(p, 1 << 30), k) for k, p in enumerate(zip(sym, sym[1:])))
        if r == 1 << 30:
            break
        sym[i:i + 2] = [sym[i] + sym[i + 1]]
    ids += [vocab[s] for s in sym]
print(",".join(map(str, ids)))
PY
)
"$TURBINE_BIN" run "$D/demo.engine" --prompt-ids "$IDS" -n 1 --temperature 0 --logits-out "$D/ids.bin" >/dev/null 2>&1
"$TURBINE_BIN" run "$D/demo.engine" -p "$(cat "$PROMPT")" -n 1 --temperature 0 --logits-out "$D/text.bin" >/dev/null 2>&1
if ! cmp -s "$D/ids.bin" "$D/text.bin"; then
  echo "FAIL: -p and --prompt-ids $IDS (an independent encoder's ids) give different logits"
  exit 1
fi
echo "ok: Turbine's tokenizer gives the independent encoder's $(echo "$IDS" | tr ',' '\n' | wc -l) ids"

# 3. logits against the float64 reference (prompt rows, then 40 greedy tokens)
HEAD=$(echo "$IDS" | cut -d, -f1-12)
"$TURBINE_BIN" run "$D/demo.engine" --prompt-ids "$HEAD" -n 40 --temperature 0 --logits-out "$D/logits.bin" >/dev/null 2>&1
$PY "$TURBINE_SRC/tests/compare_logits.py" --model "$M" --logits "$D/logits.bin" --prompt-ids "$HEAD" --tol 2e-2 --quiet

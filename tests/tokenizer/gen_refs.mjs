// gen_refs.mjs OUTDIR SHARED — builds tokenizer.json files from vocabularies
// that ship with npm packages / the shared folder, and reference ids for a
// list of test strings from independent JavaScript tokenizers:
//   gpt2/    r50k_base ranks from gpt-tokenizer -> GPT-2 style byte-level BPE;
//            reference: gpt-tokenizer's own encoder, cross-checked with
//            @huggingface/tokenizers on the generated tokenizer.json.
//   cl100k/  cl100k_base -> Llama-3 style (Split regex + ByteLevel without
//            regex, ignore_merges); same two references.
//   llama2/  shared llama2_tokenizer.bin -> Llama-2 style SentencePiece BPE
//            (merges from scores as the HF converter does, byte_fallback);
//            reference: @huggingface/tokenizers.
// Each folder gets tokenizer.json, tokenizer_config.json and cases.json
// ([{text, ids}]). Exits 1 when the two references disagree.
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import r50kRanks from 'gpt-tokenizer/bpeRanks/r50k_base';
import cl100kRanks from 'gpt-tokenizer/bpeRanks/cl100k_base';
import * as r50k from 'gpt-tokenizer/encoding/r50k_base';
import * as cl100k from 'gpt-tokenizer/encoding/cl100k_base';

const [outDir, shared] = process.argv.slice(2);

export const STRINGS = [
  '',
  'Hello world',
  'Once upon a time',
  ' leading space',
  'trailing space ',
  'runs   of    spaces     here',
  '      ',
  '123456789',
  'digits 3.14159 and 2024-01-01, 1000000',
  'line one\nline two\n\nline four',
  'tabs\tand\ttabs\t\t end',
  '\r\n windows\r\n',
  'café résumé naïve é',
  '中文分词测试，你好世界',
  'emoji 🙂 smile',
  'family 👨‍👩‍👧‍👦 zwj',
  'mixed: a🙂b中c é\n\t 12',
  "I'm sure they've said it's fine, we'll see. DON'T",
  'special <|endoftext|> token',
  '<|endoftext|>',
  'x<|endoftext|>y<|endoftext|>',
  '<s> looks special </s>',
  'Ünïcödé ẞ ǅ ﬁ',
  'كلمة عربية',
  'Привет, мир!',
  'code: for (int i = 0; i < n; i++) { x += y; }',
  '    indented\n        more',
  '!!!???...,,,;;;',
  'a',
  ' ',
  '\n',
];

function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const m = new Array(256);
  bs.forEach((b, i) => { m[b] = String.fromCodePoint(cs[i]); });
  return m;
}
const B2U = bytesToUnicode();
const enc = new TextEncoder();

// ranks (array of string | byte array) -> { vocab, merges } in byte-level form,
// merges extracted as HF's tiktoken converter does.
function tiktokenToBpe(ranks) {
  const vocab = Object.create(null);
  const toks = [];
  ranks.forEach((t, rank) => {
    const bytes = typeof t === 'string' ? enc.encode(t) : Uint8Array.from(t);
    const s = Array.from(bytes, (b) => B2U[b]).join('');
    vocab[s] = rank;
    toks.push(s);
  });
  const merges = [];
  toks.forEach((s, rank) => {
    const chars = Array.from(s);
    if (chars.length < 2) return;
    const local = [];
    for (let i = 1; i < chars.length; i++) {
      const l = chars.slice(0, i).join(''), r = chars.slice(i).join('');
      if (l in vocab && r in vocab) local.push([l, r, rank]);
    }
    local.sort((a, b) => vocab[a[0]] - vocab[b[0]] || vocab[a[1]] - vocab[b[1]]);
    merges.push(...local);
  });
  merges.sort((a, b) => a[2] - b[2]);
  return { vocab, merges: merges.map((m) => [m[0], m[1]]) };
}

function addedToken(id, content, special = true) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special };
}

function write(dir, json, config, cases) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(json));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  fs.writeFileSync(path.join(dir, 'cases.json'), JSON.stringify(cases));
}

// gpt-tokenizer's own special-token handling is unreliable across calls, so
// special tokens are split out here (tiktoken's rule) and the ordinary text
// between them goes through its encoder.
function encodeWithSpecials(encode, specials, text) {
  const names = Object.keys(specials).sort((a, b) => b.length - a.length);
  const out = [];
  let rest = text;
  while (rest.length) {
    let best = -1, name = null;
    for (const n of names) {
      const i = rest.indexOf(n);
      if (i >= 0 && (best < 0 || i < best)) { best = i; name = n; }
    }
    if (best < 0) { out.push(...encode(rest)); break; }
    if (best > 0) out.push(...encode(rest.slice(0, best)));
    out.push(specials[name]);
    rest = rest.slice(best + name.length);
  }
  return out;
}

let failures = 0;
function compare(name, text, a, b) {
  if (JSON.stringify(a) !== JSON.stringify(b)) {
    failures++;
    console.error(`${name}: references disagree on ${JSON.stringify(text)}:\n  ${a}\n  ${b}`);
  }
}

// ---------------------------------------------------------------- GPT-2
{
  const { vocab, merges } = tiktokenToBpe(r50kRanks);
  vocab['<|endoftext|>'] = 50256;
  const json = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [addedToken(50256, '<|endoftext|>')],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab, merges: merges.map((m) => m.join(' ')) },
  };
  const config = { bos_token: '<|endoftext|>', eos_token: '<|endoftext|>', add_bos_token: false,
                   chat_template: "{% for m in messages %}{{ m['content'] }}{% endfor %}" };
  const hf = new Tokenizer(json, config);
  const cases = STRINGS.map((text) => {
    const ids = encodeWithSpecials((x) => r50k.encode(x), { '<|endoftext|>': 50256 }, text);
    compare('gpt2', text, ids, hf.encode(text, { add_special_tokens: false }).ids);
    return { text, ids };
  });
  write(path.join(outDir, 'gpt2'), json, config, cases);
}

// ---------------------------------------------------------------- cl100k (Llama-3 style)
{
  const { vocab, merges } = tiktokenToBpe(cl100kRanks);
  const specials = { '<|endoftext|>': 100257, '<|fim_prefix|>': 100258, '<|fim_middle|>': 100259,
                     '<|fim_suffix|>': 100260, '<|endofprompt|>': 100276 };
  const added = [];
  for (const [s, id] of Object.entries(specials)) { vocab[s] = id; added.push(addedToken(id, s)); }
  const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges },
  };
  const config = { bos_token: null, eos_token: '<|endoftext|>' };
  const hf = new Tokenizer(json, config);
  const cases = STRINGS.map((text) => {
    const ids = encodeWithSpecials((x) => cl100k.encode(x), specials, text);
    compare('cl100k', text, ids, hf.encode(text, { add_special_tokens: false }).ids);
    return { text, ids };
  });
  write(path.join(outDir, 'cl100k'), json, config, cases);
}

// ---------------------------------------------------------------- Llama-2 (SentencePiece BPE)
{
  const buf = fs.readFileSync(path.join(shared, 'models', 'llama2_tokenizer.bin'));
  const pieces = [], scores = [];
  let pos = 4;
  const dec = new TextDecoder('utf-8', { fatal: false });
  while (pos < buf.length) {
    const score = buf.readFloatLE(pos);
    const len = buf.readInt32LE(pos + 4);
    let s = dec.decode(buf.subarray(pos + 8, pos + 8 + len));
    pos += 8 + len;
    const id = pieces.length;
    if (id === 0) s = '<unk>';
    else if (id === 1) s = '<s>';
    else if (id === 2) s = '</s>';
    else s = s.replaceAll(' ', '\u2581');
    pieces.push(s);
    scores.push(score);
  }
  const vocab = Object.create(null);
  pieces.forEach((p, i) => { if (!(p in vocab)) vocab[p] = i; });
  // merges from scores, as the HF SentencePiece converter extracts them
  const merges = [];
  pieces.forEach((p, i) => {
    if (i < 3) return;
    const chars = Array.from(p);
    const local = [];
    for (let k = 1; k < chars.length; k++) {
      const l = chars.slice(0, k).join(''), r = chars.slice(k).join('');
      if (l in vocab && r in vocab) local.push([l, r, scores[i]]);
    }
    local.sort((a, b) => vocab[a[0]] - vocab[b[0]] || vocab[a[1]] - vocab[b[1]]);
    merges.push(...local);
  });
  merges.sort((a, b) => b[2] - a[2]);
  const json = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [addedToken(0, '<unk>'), addedToken(1, '<s>'), addedToken(2, '</s>')],
    normalizer: { type: 'Sequence', normalizers: [
      { type: 'Prepend', prepend: '\u2581' },
      { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    pre_tokenizer: null,
    post_processor: { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
             vocab, merges: merges.map((m) => [m[0], m[1]]) },
  };
  const config = { bos_token: '<s>', eos_token: '</s>', add_bos_token: true, add_eos_token: false,
                   chat_template: [{ name: 'default', template: 'DEFAULT' }, { name: 'tool_use', template: 'TOOLS' }] };
  const hf = new Tokenizer(json, config);
  const cases = STRINGS.map((text) => ({ text, ids: hf.encode(text, { add_special_tokens: false }).ids }));
  write(path.join(outDir, 'llama2'), json, config, cases);
}

if (failures) { console.error(`${failures} disagreements between references`); process.exit(1); }
console.log('references written to', outDir);

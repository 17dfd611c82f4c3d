// Hugging Face tokenizers (the Rust library, as the Node module @anush008/tokenizers) as the oracle of
// the tokenizer tests and benchmark. One process serves a whole file:
//   node tokenizers_oracle.js MODULE_DIR TOKENIZER_JSON encode INPUT.jsonl OUTPUT [special|nospecial]
//       INPUT: one JSON string per line -> OUTPUT: that text's ids, space-separated, one line each
//   node tokenizers_oracle.js MODULE_DIR TOKENIZER_JSON decode INPUT.ids OUTPUT [skip|keep]
//       INPUT: ids per line -> OUTPUT: one JSON string per line
//   node tokenizers_oracle.js MODULE_DIR TOKENIZER_JSON all INPUT.jsonl OUTBASE
//       both encodes and both decodes (of the ids with special tokens) of one load of the tokenizer:
//       OUTBASE.special, OUTBASE.nospecial (ids), OUTBASE.skip, OUTBASE.keep (JSON strings)
//   node tokenizers_oracle.js MODULE_DIR TOKENIZER_JSON bench TEXT_FILE CHUNK_BYTES REPEATS
//       encodes the file in chunks of whole lines one call at a time (single-threaded) and prints
//       {"bytes":..., "seconds":[...], "tokens":...} as JSON
'use strict';
const fs = require('fs');
const path = require('path');
const [moduleDir, tokenizerPath, mode, input, output, option] = process.argv.slice(2);
const {Tokenizer} = require(path.resolve(moduleDir, 'node_modules', '@anush008', 'tokenizers'));
const tokenizer = Tokenizer.fromFile(tokenizerPath);

function lines(file) {
  const text = fs.readFileSync(file, 'utf8');
  const all = text.split('\n');
  if (all.length && all[all.length - 1] === '') all.pop();
  return all;
}

async function encode() {
  const texts = lines(input).map((l) => JSON.parse(l));
  const addSpecialTokens = option !== 'nospecial';
  const out = [];
  for (const t of texts) {
    const e = await tokenizer.encode(t, null, {addSpecialTokens});
    out.push(e.getIds().join(' '));
  }
  fs.writeFileSync(output, out.join('\n') + (out.length ? '\n' : ''));
}

async function decode() {
  const rows = lines(input).map((l) => (l.trim() === '' ? [] : l.trim().split(/\s+/).map(Number)));
  const out = [];
  for (const ids of rows) out.push(JSON.stringify(await tokenizer.decode(ids, option === 'skip')));
  fs.writeFileSync(output, out.join('\n') + (out.length ? '\n' : ''));
}

async function all() {
  const texts = lines(input).map((l) => JSON.parse(l));
  const ids = {special: [], nospecial: []};
  for (const t of texts) {
    for (const mode of ['special', 'nospecial']) {
      ids[mode].push((await tokenizer.encode(t, null, {addSpecialTokens: mode === 'special'})).getIds());
    }
  }
  const write = (suffix, rows) => fs.writeFileSync(output + '.' + suffix, rows.join('\n') + (rows.length ? '\n' : ''));
  for (const mode of ['special', 'nospecial']) write(mode, ids[mode].map((r) => r.join(' ')));
  for (const skip of ['skip', 'keep']) {
    const out = [];
    for (const r of ids.special) out.push(JSON.stringify(await tokenizer.decode(Array.from(r), skip === 'skip')));
    write(skip, out);
  }
}

async function bench() {
  // chunks end after the newline that brings them to at least CHUNK_BYTES, as bench/tokenizer_bench.c cuts
  const data = fs.readFileSync(input);
  const chunkBytes = Number(output);
  const chunks = [];
  let start = 0;
  for (let i = data.indexOf(10); i >= 0; i = data.indexOf(10, i + 1)) {
    if (i + 1 - start >= chunkBytes) { chunks.push(data.toString('utf8', start, i + 1)); start = i + 1; }
  }
  if (start < data.length) chunks.push(data.toString('utf8', start));
  const seconds = [];
  let tokens = 0;
  for (let r = 0; r < Number(option); r++) {
    tokens = 0;
    const t0 = process.hrtime.bigint();
    for (const c of chunks) tokens += (await tokenizer.encode(c, null, {addSpecialTokens: false})).getIds().length;
    seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(JSON.stringify({bytes: data.length, chunks: chunks.length, seconds, tokens}));
}

({encode, decode, all, bench})[mode]().catch((e) => { console.error(e); process.exit(1); });

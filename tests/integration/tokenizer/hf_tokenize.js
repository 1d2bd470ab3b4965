#!/usr/bin/env node
// Reference tokenizer for the tests: Hugging Face `tokenizers` (npm, native Rust binding).
// usage: node hf_tokenize.js TOKENIZER_JSON [--add-special]  < {"text":...} lines
// prints {"ids":[...]} lines. Exits 77 when the package is not installed
// (install it outside the repo: npm install --prefix $TYCHO_PEERS_DIR/hftok tokenizers).
'use strict';
const path = require('path');
const readline = require('readline');

function loadTokenizers() {
  const peers = process.env.TYCHO_PEERS_DIR || path.resolve(__dirname, '../../../../peers');
  for (const p of [path.join(peers, 'hftok/node_modules/tokenizers'), 'tokenizers']) {
    try { return require(p); } catch (e) { /* next */ }
  }
  return null;
}

async function main() {
  const hf = loadTokenizers();
  if (!hf) {
    console.error('skip: npm package "tokenizers" not installed');
    process.exit(77);
  }
  const file = process.argv[2];
  const addSpecial = process.argv.includes('--add-special');
  const tok = hf.Tokenizer.fromFile(file);
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const { text } = JSON.parse(line);
    const enc = await tok.encode(text, null, { addSpecialTokens: addSpecial });
    process.stdout.write(JSON.stringify({ ids: Array.from(enc.getIds()) }) + '\n');
  }
}
main().catch((e) => { console.error(e); process.exit(1); });

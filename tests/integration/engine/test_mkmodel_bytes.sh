#!/bin/sh
# `tycho mkmodel --vocab-from bytes` makes a random model that needs no donor file (what
# `tycho serve` falls back to on a machine without test data): its tokenizer is pure byte
# fallback, so the ids of a text are its UTF-8 bytes (+3, after <unk> <s> </s>) with spaces as
# U+2581, computed here independently with od; the model loads and generates.
set -eu
tycho="$TYCHO_BUILD_DIR/src/cli/tycho"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$tycho" mkmodel --preset tiny --vocab-from bytes --out "$tmp/m.gguf"
text="Hi wörld 🙂"
got=$("$tycho" tokenize --tokenizer "$tmp/m.gguf" --text "$text")
# SentencePiece: a leading U+2581 and every space as U+2581 (bytes e2 96 81)
want=$(printf '\342\226\201%s' "$text" | sed 's/ /\xe2\x96\x81/g' | od -An -tu1 -v |
       tr -s ' \n' '\n\n' | grep -v '^$' | awk '{printf "%s%d", (NR>1?",":""), $1+3}')
[ "$got" = "{\"ids\":[$want]}" ] || { echo "tokenize: got $got want [$want]"; exit 1; }
out=$("$tycho" generate --model "$tmp/m.gguf" --prompt "$text" -n 4 --json)
case "$out" in *'"output_ids":['*) ;; *) echo "generate: $out"; exit 1 ;; esac
# the same shape with Q8_0 matrices (blocks written whole across the writer's chunks) loads and
# generates too; a shape whose rows are not whole blocks is refused
"$tycho" mkmodel --preset tiny --vocab-from bytes --type q8_0 --out "$tmp/q8.gguf"
out=$("$tycho" generate --model "$tmp/q8.gguf" --prompt "$text" -n 4 --json)
case "$out" in *'"output_ids":['*) ;; *) echo "generate q8_0: $out"; exit 1 ;; esac
if "$tycho" mkmodel --dims 48,1,2,2,96 --vocab-from bytes --type q8_0 --out "$tmp/bad.gguf" \
    2>"$tmp/err"; then
    echo "mkmodel q8_0 accepted dim 48"; exit 1
fi
grep -q "multiples of 32" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "ok: $got"

#!/bin/sh
# `tycho generate` end to end without npm: the continuation the issue states for
# "Once upon a time", the same 256 greedy ids from the GGUF and the HF copy of stories260K on
# every prompt, seeded sampling reproducible, stop strings, and usage errors.
set -u
T="${TYCHO_BUILD_DIR:-.}/src/cli/tycho"
D="${TYCHO_TEST_DATA:-}"
HERE="$(dirname "$0")"
G="$D/models/stories260K/stories260K.gguf"
H="$D/models/stories260K-hf"
[ -f "$G" ] && [ -d "$H" ] || { echo "skip: no test models"; exit 77; }
fail=0
bad() { echo "FAIL: $*"; fail=1; }
ids() { sed -n 's/.*"output_ids":\[\([0-9,]*\)\].*/\1/p'; }

want=", there was a little girl named Lily. She loved to play outside in the park."
for m in "$G" "$H"; do
    out=$("$T" generate --model "$m" --prompt "Once upon a time" -n 28 --json) || bad "exit $m"
    case "$out" in *"\"text\":\"$want"*) ;; *) bad "text from $m: $out" ;; esac
    case "$out" in *'"prompt_ids":[1,403,407,261,378]'*) ;; *) bad "prompt ids $m" ;; esac
    case "$out" in *'"decode_tok_s":'*) ;; *) bad "timing fields $m" ;; esac
done

# GGUF (interleaved rope rows) and HF (rotate_half rows) give identical ids
n=0
while IFS= read -r line; do
    text=$(printf '%s' "$line" | sed 's/^{"text": "\(.*\)"}$/\1/' | sed 's/\\"/"/g')
    case "$text" in *'\'*) continue ;; esac   # keep to prompts without JSON escapes
    a=$("$T" generate --model "$G" --prompt "$text" -n 256 --ignore-eos --json | ids)
    b=$("$T" generate --model "$H" --prompt "$text" -n 256 --ignore-eos --json | ids)
    [ -n "$a" ] && [ "$a" = "$b" ] || bad "gguf vs hf ids differ for: $text"
    [ "$(printf "%s," "$a" | tr -cd , | wc -c)" -eq 256 ] || bad "not 256 ids for: $text"
    n=$((n + 1))
done < "$HERE/prompts.jsonl"
[ "$n" -ge 10 ] || bad "only $n prompts compared"

# the CPU worker pool (attention heads and matrix-vector rows split over 3 threads) gives the
# ids of one thread; in the ThreadSanitizer build this is the race check of that pool (the model
# is small enough that OpenBLAS, whose threads TSan cannot see into, stays on one thread)
t1=$("$T" generate --model "$G" --prompt "Once upon a time" -n 64 --ignore-eos --json | ids)
t3=$("$T" generate --model "$G" --prompt "Once upon a time" -n 64 --ignore-eos --threads 3 \
    --json | ids)
[ -n "$t1" ] && [ "$t1" = "$t3" ] || bad "--threads 3 ids differ from one thread's"

# same seed, same sample; another seed, (almost surely) another sample
s1=$("$T" generate --model "$G" --prompt "Once upon a time" -n 40 --temp 1 --seed 7 --json | ids)
s2=$("$T" generate --model "$G" --prompt "Once upon a time" -n 40 --temp 1 --seed 7 --json | ids)
s3=$("$T" generate --model "$G" --prompt "Once upon a time" -n 40 --temp 1 --seed 8 --json | ids)
[ "$s1" = "$s2" ] || bad "seeded sampling not reproducible"
[ "$s1" != "$s3" ] || bad "different seeds gave the same 40 tokens"

out=$("$T" generate --model "$G" --prompt "Once upon a time" -n 100 --stop "Lily" --json)
case "$out" in *'"text":", there was a little girl named ","finish_reason":"stop"'*) ;;
    *) bad "stop string: $out" ;; esac

# stop token ids, min_tokens, logit_bias, against the plain greedy ids (g): a stop id ends
# the answer before its first occurrence; min_tokens bans it (and EOS) until then; a -100
# bias keeps it out of the answer, which then follows the same path as the banned one
g=$("$T" generate --model "$G" --prompt "Once upon a time" -n 20 --ignore-eos --json | ids)
x=$(printf '%s' "$g" | cut -d, -f4)
head3=$(printf '%s' "$g" | cut -d, -f1-3)
out=$("$T" generate --model "$G" --prompt "Once upon a time" -n 20 --stop-token-id "$x" --json)
case "$out" in *"\"output_ids\":[$head3],"*'"finish_reason":"stop"'*) ;;
    *) bad "--stop-token-id $x (4th of $g): $out" ;; esac
m=$("$T" generate --model "$G" --prompt "Once upon a time" -n 20 --stop-token-id "$x" \
    --min-tokens 5 --json | ids)
case "$m" in "$head3",*) ;; *) bad "--min-tokens 5: first 3 ids $m" ;; esac
[ "$(printf '%s' "$m" | cut -d, -f4)" != "$x" ] || bad "--min-tokens 5: $x still 4th: $m"
[ "$(printf '%s' "$m" | tr -cd , | wc -c)" -ge 4 ] || bad "--min-tokens 5: fewer than 5: $m"
b=$("$T" generate --model "$G" --prompt "Once upon a time" -n 20 --logit-bias "$x:-100" \
    --json | ids)
case ",$b," in *",$x,"*) bad "--logit-bias $x:-100 still gives $x: $b" ;; esac
case "$b" in "$head3",*) ;; *) bad "--logit-bias: first 3 ids $b" ;; esac
[ "$(printf '%s' "$b" | cut -d, -f1-5)" = "$(printf '%s' "$m" | cut -d, -f1-5)" ] ||
    bad "banning $x by bias or by min_tokens: different first 5 ($b / $m)"
err=$("$T" generate --model "$G" --prompt x --logit-bias 999:1 2>&1 >/dev/null)
case "$err" in *"not a token of this model"*) ;; *) bad "--logit-bias 999: $err" ;; esac
"$T" generate --model "$G" --prompt x --logit-bias 1:101 >/dev/null 2>&1; [ $? -eq 2 ] ||
    bad "--logit-bias 1:101 is not a usage error"

"$T" generate --model "$G" >/dev/null 2>&1; [ $? -eq 2 ] || bad "missing prompt is not a usage error"
"$T" generate --model "$G" --prompt x --temp abc >/dev/null 2>&1; [ $? -eq 2 ] || bad "bad --temp"
"$T" generate --model /nonexistent --prompt x >/dev/null 2>&1; [ $? -eq 1 ] || bad "missing model"

# a rope scaling this build does not compute is refused by name (a GGUF with YaRN scaling
# whose type string is changed to another of the same length), never loaded without it
tmp=$(mktemp -d)
"$T" mkmodel --dims 64,1,4,2,128 --vocab-from bytes --yarn 4,32 --out "$tmp/y.gguf" >/dev/null ||
    bad "mkmodel --yarn"
"$T" generate --model "$tmp/y.gguf" --prompt-ids 1,2,3 -n 2 >/dev/null 2>&1 || bad "yarn model"
sed 's/yarn/yorn/' "$tmp/y.gguf" >"$tmp/n.gguf"
err=$("$T" generate --model "$tmp/n.gguf" --prompt-ids 1,2,3 -n 2 2>&1 >/dev/null)
case "$err" in *"unsupported rope scaling type 'yorn'"*) ;; *) bad "rope type yorn: $err" ;; esac
rm -rf "$tmp"
[ $fail -eq 0 ] && echo "all ok ($n prompts)"
exit $fail

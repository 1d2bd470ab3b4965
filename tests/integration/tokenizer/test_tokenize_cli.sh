#!/usr/bin/env bash
# `tycho tokenize --jsonl` end to end:
#  1. every case of ../shared/data/tokenizer_cases_{qwen3,gptoss}.jsonl (ids from HF tokenizers);
#  2. stories260K's GGUF and HF tokenizer.json, with and without --add-special, against the
#     HF tokenizers reference (hf_tokenize.js; that part skips when the npm package is missing);
#  3. bad input gives a clear error and a non-zero exit.
set -euo pipefail
TYCHO="${TYCHO_BUILD_DIR:?}/src/cli/tycho"
DATA="${TYCHO_TEST_DATA:?}"
HERE="$(cd "$(dirname "$0")" && pwd)"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
[ -d "$DATA/tokenizers" ] || { echo "skip: no test data"; exit 77; }
command -v jq >/dev/null || { echo "skip: jq missing"; exit 77; }
fail=0

for m in qwen3 gptoss; do
  cases="$DATA/data/tokenizer_cases_$m.jsonl"
  jq -c '{ids}' "$cases" > "$TMP/want_$m"
  "$TYCHO" tokenize --tokenizer "$DATA/tokenizers/$m/tokenizer.json" --jsonl < "$cases" > "$TMP/got_$m"
  if ! diff -u "$TMP/want_$m" "$TMP/got_$m"; then echo "FAIL: $m cases"; fail=1; fi
  echo "ok: $m $(wc -l < "$cases") cases"
done

skipped=0
for flag in "" "--add-special"; do
  for tk in "$DATA/models/stories260K-hf/tokenizer.json" "$DATA/tokenizers/qwen3/tokenizer.json"; do
    set +e
    node "$HERE/hf_tokenize.js" "$tk" $flag < "$HERE/prompts.jsonl" > "$TMP/ref"
    rc=$?
    set -e
    if [ $rc -eq 77 ]; then skipped=1; break 2; fi
    [ $rc -eq 0 ] || { echo "FAIL: reference tokenizer exited $rc"; exit 1; }
    "$TYCHO" tokenize --tokenizer "$tk" $flag --jsonl < "$HERE/prompts.jsonl" > "$TMP/got"
    if ! diff -u "$TMP/ref" "$TMP/got"; then echo "FAIL: $tk $flag vs HF"; fail=1; fi
    if [ "$tk" = "$DATA/models/stories260K-hf/tokenizer.json" ]; then
      # the GGUF vocabulary is the same tok512: llama.cpp's SPM must agree with HF's BPE
      "$TYCHO" tokenize --tokenizer "$DATA/models/stories260K/stories260K.gguf" $flag --jsonl \
        < "$HERE/prompts.jsonl" > "$TMP/got_gguf"
      if ! diff -u "$TMP/ref" "$TMP/got_gguf"; then echo "FAIL: gguf $flag vs HF"; fail=1; fi
    fi
    echo "ok: $(basename "$(dirname "$tk")") ${flag:-plain} matches HF tokenizers"
  done
done
[ $skipped -eq 1 ] && echo "note: HF reference comparison skipped (npm tokenizers missing)"

# the HF directory form and the decode direction
"$TYCHO" tokenize --tokenizer "$DATA/models/stories260K-hf" --add-special --text "Once upon a time" > "$TMP/o"
[ "$(cat "$TMP/o")" = '{"ids":[1,403,407,261,378]}' ] || { echo "FAIL: dir form: $(cat "$TMP/o")"; fail=1; }
echo '{"ids":[1,403,407,261,378]}' | "$TYCHO" tokenize --tokenizer "$DATA/models/stories260K-hf" --decode > "$TMP/o"
[ "$(cat "$TMP/o")" = '{"text":"Once upon a time"}' ] || { echo "FAIL: decode: $(cat "$TMP/o")"; fail=1; }

# errors: missing file, malformed file, bad stdin line, usage
echo '{"model": ' > "$TMP/bad.json"
for args in "--tokenizer /nonexistent.json --jsonl" "--tokenizer $TMP/bad.json --jsonl"; do
  set +e; "$TYCHO" tokenize $args < /dev/null 2> "$TMP/err"; rc=$?; set -e
  [ $rc -ne 0 ] && [ -s "$TMP/err" ] || { echo "FAIL: '$args' rc=$rc"; fail=1; }
done
set +e
echo 'not json' | "$TYCHO" tokenize --tokenizer "$DATA/models/stories260K-hf" --jsonl 2> "$TMP/err"; rc=$?
"$TYCHO" tokenize --jsonl 2>/dev/null; rc2=$?
set -e
[ $rc -ne 0 ] && grep -q "line 1" "$TMP/err" || { echo "FAIL: bad stdin line rc=$rc"; fail=1; }
[ $rc2 -eq 2 ] || { echo "FAIL: usage error rc=$rc2"; fail=1; }
exit $fail

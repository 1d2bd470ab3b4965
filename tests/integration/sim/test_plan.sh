#!/bin/bash
# tycho plan on workloads whose best prefill:decode split is known from the cost model
# (llama3-70b-8xa800: prefill 141 us per token + 10 ms per call; a decode step 14.4 ms +
# 0.14 ms per sequence + 0.034 us per context token), and its YAML passes check-config.
set -euo pipefail
TYCHO=${TYCHO_BUILD_DIR:?}/src/cli/tycho
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
head -c 32 /dev/urandom | base64 > "$TMP/secret" && chmod 600 "$TMP/secret"

# Prefill-heavy: 8k-12k-token prompts, 8-16-token answers. A prompt costs a prefill node about
# 1.4 s; a decode node holds hundreds of such short answers. With 8 nodes the prefill side
# must take nearly all of them: 7:1 (6:2 gives up a seventh of prefill for idle decode).
"$TYCHO" plan --nodes 8 --ttft-slo 10 --tbt-slo 100 --rate 1 --input 8000-12000 --output 8-16 \
    --chunks 2048,8192 --json --out "$TMP/prefill-heavy" --secret-file "$TMP/secret" \
    --model "$TMP/model.gguf" > "$TMP/ph.json" 2> "$TMP/ph.err" \
    || fail "prefill-heavy plan exited $?: $(cat "$TMP/ph.err")"
# Decode-heavy: 100-300-token prompts (about 40 ms of prefill each: 25 requests/s per prefill
# node), 400-600-token answers under a 50 ms TBT (at most ~230 sequences per decode step, so
# ~9 requests/s per decode node, with 1.5 M tokens of KV each): 2:6.
"$TYCHO" plan --nodes 8 --ttft-slo 2 --tbt-slo 50 --rate 1 --input 100-300 --output 400-600 \
    --cluster.decode_kv_tokens=1500000 --chunks 2048 --json --out "$TMP/decode-heavy" \
    --secret-file "$TMP/secret" --model "$TMP/model.gguf" > "$TMP/dh.json" 2> "$TMP/dh.err" \
    || fail "decode-heavy plan exited $?: $(cat "$TMP/dh.err")"
grep -q "again with" "$TMP/dh.err" \
    || fail "the decode-heavy workload of 2000 requests is too short at its capacity and must be regenerated longer"

python3 - "$TMP/ph.json" "$TMP/dh.json" <<'PY' || fail "plan output"
import json, sys
ph, dh = (json.load(open(p)) for p in sys.argv[1:3])
for d in (ph, dh):
    r = d["recommendation"]
    assert r["prefill_nodes"] + r["decode_nodes"] == 8, r
    split = d["stages"][0]["candidates"]
    assert len(split) == 7 * len({c["prefill_chunk_tokens"] for c in split}), len(split)
    caps = [c["capacity_rps"] for c in split]
    assert caps == sorted(caps, reverse=True), caps       # ranked, best first
    assert r["capacity_rps"] >= caps[0] * 0.98, (r, caps[0])  # later stages keep the best
    assert d["colocated"]["capacity_rps"] > 0, d["colocated"]
    assert {c["admission"] for c in d["stages"][2]["candidates"]} == {"baseline", "early", "predicted"}
r = ph["recommendation"]
assert (r["prefill_nodes"], r["decode_nodes"]) == (7, 1), r
r = dh["recommendation"]
assert (r["prefill_nodes"], r["decode_nodes"]) == (2, 6), r
assert dh["workload"]["requests"] > 2000, dh["workload"]
PY

for w in prefill-heavy decode-heavy; do
    for role in conductor prefill decode; do
        "$TYCHO" check-config --role $role --config "$TMP/$w/$role.yaml" > "$TMP/cc.out" 2>&1 \
            || fail "$w/$role.yaml: $(cat "$TMP/cc.out")"
    done
done
grep -q '^chunk_tokens: ' "$TMP/prefill-heavy/prefill.yaml" || fail "prefill.yaml without chunk_tokens"
grep -q 'admission: ' "$TMP/prefill-heavy/conductor.yaml" || fail "conductor.yaml without admission"
grep -q 'tbt: 50000us' "$TMP/decode-heavy/conductor.yaml" || fail "conductor.yaml without the TBT SLO"

# usage: --help exits 0; a missing SLO or a half-described workload is a usage error (2)
"$TYCHO" plan --help > /dev/null || fail "--help exited $?"
rc=0; "$TYCHO" plan --nodes 8 --rate 1 --input 10 --output 10 2> /dev/null || rc=$?
[ "$rc" = 2 ] || fail "plan without SLOs exited $rc, want 2"
rc=0; "$TYCHO" plan --nodes 8 --ttft-slo 1 --tbt-slo 50 --rate 1 --input 10 2> /dev/null || rc=$?
[ "$rc" = 2 ] || fail "plan without --output exited $rc, want 2"
echo "ok: prefill-heavy 7:1, decode-heavy 2:6, YAML accepted"

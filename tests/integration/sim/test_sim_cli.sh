#!/bin/bash
# tycho sim as an operator runs it: a sweep runs every point of the grid it was given (never a
# silently shortened one), over-long lists and bad traces are usage errors with a message, and
# the JSON carries the prefill busy share. Uses a trace written here (no test data needed).
set -euo pipefail
TYCHO=${TYCHO_BUILD_DIR:?}/src/cli/tycho
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 400 requests, 5 per second, prompts of 1-8 blocks sharing a 1-block system prompt
python3 - "$TMP/trace.jsonl" <<'PY'
import json, random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    for i in range(400):
        n = random.randint(1, 8)
        ids = [0] + [1000 + i * 8 + k for k in range(n - 1)]
        f.write(json.dumps({"timestamp": i * 200, "input_length": n * 512 - random.randint(0, 500),
                            "output_length": random.randint(1, 300), "hash_ids": ids}) + "\n")
PY

# a sweep over 20 ratios x 3 admissions: 60 runs, each ratio present
ratios=$(python3 -c "print(','.join(f'{p}:{d}' for p in (1,2,3,4) for d in (1,2,3,4,5)))")
"$TYCHO" sim --trace "$TMP/trace.jsonl" --sweep --admission all --ratios "$ratios" --json \
    > "$TMP/sweep.json" 2> "$TMP/sweep.err" || fail "sweep exited $?: $(cat "$TMP/sweep.err")"
python3 - "$TMP/sweep.json" <<'PY' || fail "sweep output"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert len(runs) == 60, f"{len(runs)} runs, want 60"
seen = {(r["prefill_nodes"], r["decode_nodes"]) for r in runs}
assert seen == {(p, d) for p in (1, 2, 3, 4) for d in (1, 2, 3, 4, 5)}, seen
for r in runs:
    assert r["served"] + r["rejected"] == 400, r
    u = r["prefill_utilization"]
    assert 0 < u <= 1.0 + 1e-9, u
    assert r["prefill_busy_s"] > 0
# one prefill node is busier than four on the same requests
by = {(r["prefill_nodes"], r["decode_nodes"], r["admission"]): r for r in runs}
assert by[(1, 5, "baseline")]["prefill_utilization"] > by[(4, 5, "baseline")]["prefill_utilization"]
PY

# 65 items is more than a list may hold: exit 2 and say so, nothing run
long=$(python3 -c "print(','.join(f'{p}:1' for p in range(1, 66)))")
set +e
"$TYCHO" sim --trace "$TMP/trace.jsonl" --sweep --ratios "$long" > "$TMP/out" 2> "$TMP/err"
rc=$?
set -e
[ "$rc" = 2 ] || fail "65-item list: exit $rc, want 2"
grep -q "more than 64 items" "$TMP/err" || fail "65-item list: no message: $(cat "$TMP/err")"
[ ! -s "$TMP/out" ] || fail "65-item list: ran anyway"

# a trace with a broken line: an error naming the line, not a crash or a partial run
head -3 "$TMP/trace.jsonl" > "$TMP/bad.jsonl"
echo '{"timestamp": 5, "input_length": "many"}' >> "$TMP/bad.jsonl"
set +e
"$TYCHO" sim --trace "$TMP/bad.jsonl" > "$TMP/out" 2> "$TMP/err"
rc=$?
set -e
[ "$rc" != 0 ] && [ "$rc" -lt 128 ] || fail "bad trace: exit $rc"
grep -q ":4" "$TMP/err" || fail "bad trace: error does not name line 4: $(cat "$TMP/err")"
# --capacity: per TBT SLO, every split of the node budget and every colocated chunk size is
# searched; the best of each is reported with the rates it ran, and a 3:1 split that is
# asked for but does not add up to --nodes is a usage error
"$TYCHO" sim --trace "$TMP/trace.jsonl" --capacity --nodes 4 --tbt-slos 100,300 \
    --ttft-slos 30 --chunks 256,1024 --json > "$TMP/cap.json" 2> "$TMP/cap.err" \
    || fail "capacity exited $?: $(cat "$TMP/cap.err")"
python3 - "$TMP/cap.json" <<'PY' || fail "capacity output"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["nodes"] == 4 and d["target"] == 0.9 and d["ttft_slo_s"] == 30, d
th = d["thresholds"]
assert [t["tbt_slo_ms"] for t in th] == [100, 300], th
for t in th:
    s = t["searches"]
    assert len(s) == 3 + 2, len(s)  # 1:3, 2:2, 3:1 and two chunk sizes
    dis = [x for x in s if x["mode"] == "disaggregated"]
    col = [x for x in s if x["mode"] == "colocated"]
    assert t["disaggregated"]["capacity_rps"] == max(x["capacity_rps"] for x in dis)
    assert t["colocated"]["capacity_rps"] == max(x["capacity_rps"] for x in col)
    for x in s:
        pts = x["points"]
        assert pts, x
        # the capacity is a rate that was run and held the target; every faster run that
        # held lies at or below it... and the first rate above it that was run did not hold
        held = [p for p in pts if p["slo_attainment"] >= 0.9]
        if x["capacity_rps"] > 0:
            assert max(p["rate_rps"] for p in held) >= x["capacity_rps"] - 1e-9
            above = [p for p in pts if p["rate_rps"] > x["capacity_rps"] + 1e-9]
            assert not above or above[0]["slo_attainment"] < 0.9, x
# a looser TBT SLO never lowers the colocated capacity
assert th[1]["colocated"]["capacity_rps"] >= th[0]["colocated"]["capacity_rps"] * 0.98
PY
rc=0
"$TYCHO" sim --trace "$TMP/trace.jsonl" --capacity --nodes 4 --ratios 3:2 > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "capacity with a 3:2 split of 4 nodes: exit $rc, want 2"
if command -v gnuplot > /dev/null; then
    "$TYCHO" sim --trace "$TMP/trace.jsonl" --capacity --nodes 4 --tbt-slos 200 --chunks 512 \
        --plot "$TMP" > /dev/null 2>&1 || fail "capacity --plot exited $?"
    [ -s "$TMP/capacity_tbt200.png" ] || fail "no capacity_tbt200.png"
fi
# --goodput judges attainment by the given thresholds without refusing anything: a TTFT bound
# below every request's TTFT makes it 0 with every request still served
"$TYCHO" sim --trace "$TMP/trace.jsonl" --goodput ttft:0.001,tbt:1000 --json > "$TMP/g.json" \
    || fail "--goodput exited $?"
python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['runs'][0]
assert r['served'] == 400 and r['slo_attainment'] == 0, r
" "$TMP/g.json" || fail "--goodput output"
rc=0; "$TYCHO" sim --trace "$TMP/trace.jsonl" --goodput ttft:x > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--goodput ttft:x exited $rc, want 2"
echo "test_sim_cli: ok"

# Summarise an admission sweep (tycho sim --sweep --admission all --json): per setting the
# rejections of baseline / early / predicted, and how often each pairwise ordering holds among
# the settings where the three modes differ at all; then how far early and predicted admission
# misjudged the decode node (their picture at arrival against the batch the KV found), mean
# over all settings, in % of that batch.
# Usage: python3 bench/sim/admission_grid.py SWEEP.json
import json, sys
from collections import defaultdict

runs = json.load(open(sys.argv[1]))["runs"]
grid = defaultdict(dict)
for r in runs:
    key = (r["prefill_nodes"], r["decode_nodes"], r["ttft_slo_s"], r["tbt_slo_s"] * 1e3)
    grid[key][r["admission"]] = r
print(f"{'P:D':>5} {'TTFT':>5} {'TBT':>5} {'baseline':>8} {'early':>8} {'predicted':>9} "
      f"{'pbusy%':>6}  order")
n = be = ep = bp = full = 0
for (p, d, ttft, tbt), m in sorted(grid.items()):
    b, e, q = (m[a]["rejected"] for a in ("baseline", "early", "predicted"))
    if b == e == q:
        continue
    n += 1
    be += b > e
    ep += e > q
    bp += b > q
    full += b > e > q
    util = 100 * m["baseline"].get("prefill_utilization", 0)
    order = "paper's" if b > e > q else ""
    print(f"{p:>2}:{d:<2} {ttft:>4g}s {tbt:>3g}ms {b:>8} {e:>8} {q:>9} {util:>6.1f}  {order}")
print(f"{len(grid)} settings, {n} where the modes differ: baseline > early in {be}, "
      f"early > predicted in {ep}, baseline > predicted in {bp}, the paper's full order in {full}")
for a in ("early", "predicted"):
    js = [m[a]["decode_judged"] for m in grid.values() if a in m]
    js = [j for j in js if j["requests"] and j["landed_batch"] > 0]
    if js:
        bias = 100 * sum(j["batch_bias"] / j["landed_batch"] for j in js) / len(js)
        err = 100 * sum(j["batch_err"] / j["landed_batch"] for j in js) / len(js)
        print(f"{a} admission's decode picture over {len(js)} settings: "
              f"bias {bias:+.1f} %, absolute error {err:.1f} % of the batch found")

# Load fluctuation of an admission comparison (arXiv 2407.00079 v4 §7.3: early rejection makes
# the prefill and decode loads swing in anti-phase; prediction is meant to damp it). Reads the
# load.dat that `tycho sim --plot DIR` writes (one block per run: t_s, prefill_queue_s,
# decode_batch, in_flight every 10 s) and prints, per run, over the steady part of the replay
# (from --from s to --to s of simulated time): mean and coefficient of variation of the mean
# prefill queue and of the mean decode batch, and their correlation (negative: anti-phase).
# Usage: python3 bench/sim/fluctuation.py DIR/load.dat [--from 120] [--to 1700] [--json]
import json, statistics as st, sys

args = sys.argv[1:]
if not args or args[0].startswith("-"):
    sys.exit("usage: fluctuation.py LOAD_DAT [--from S] [--to S] [--json]")
path, lo, hi, as_json = args[0], 120.0, 1700.0, "--json" in args
if "--from" in args:
    lo = float(args[args.index("--from") + 1])
if "--to" in args:
    hi = float(args[args.index("--to") + 1])

runs, cur = [], None
with open(path) as f:
    for n, line in enumerate(f, 1):
        if line.startswith("#"):
            cur = {"run": line[1:].split(": ")[0].strip(), "rows": []}
            runs.append(cur)
        elif line.strip():
            if cur is None:
                sys.exit(f"{path}:{n}: data before a '# run' header")
            t, q, b = (float(x) for x in line.split()[:3])
            if lo <= t <= hi:
                cur["rows"].append((q, b))

out = []
for r in runs:
    rows = r["rows"]
    if len(rows) < 2:
        continue
    q, b = [x[0] for x in rows], [x[1] for x in rows]
    mq, mb, sq, sb = st.mean(q), st.mean(b), st.pstdev(q), st.pstdev(b)
    corr = (sum((x - mq) * (y - mb) for x, y in rows) / len(rows) / (sq * sb)) if sq and sb else 0.0
    out.append({"run": r["run"], "samples": len(rows), "prefill_queue_mean_s": mq,
                "prefill_queue_cv": sq / mq if mq else 0.0, "decode_batch_mean": mb,
                "decode_batch_cv": sb / mb if mb else 0.0, "correlation": corr})
if as_json:
    print(json.dumps(out, indent=1))
else:
    print(f"{'run':44} {'n':>4} {'queue s':>8} {'cv':>5} {'batch':>7} {'cv':>5} {'corr':>6}")
    for o in out:
        print(f"{o['run']:44} {o['samples']:>4} {o['prefill_queue_mean_s']:>8.2f} "
              f"{o['prefill_queue_cv']:>5.2f} {o['decode_batch_mean']:>7.1f} "
              f"{o['decode_batch_cv']:>5.3f} {o['correlation']:>+6.2f}")

#!/usr/bin/env python3
"""Live trace replay against `tycho cache-sim`, and prefix replication off against on.

A slice of the Mooncake conversation trace is replayed with `tycho bench serve` against a
cluster on loopback: tycho-conductor (kvcache_centric), P tycho-prefill nodes, each with a page
cache of C blocks (`--kv_pages`), and one tycho-decode node. The same slice goes through
`tycho cache-sim` at the same capacity. Printed: the prompt tokens the prefill nodes computed
(their `tycho_node_step_tokens_total`) against the tokens cache-sim says are left to compute
(prompt tokens - reusable blocks x block), per run; and per run the busiest prefill node's
load over the mean (tokens computed, and forward seconds) and TTFT p50/p99 from bench serve.

Runs (same slice, fresh cluster and cold caches each, back to back):
- `off`: scheduler.local_prefix_only: each prefill node reuses only what its own cache holds;
  a turn placed elsewhere than its prefix recomputes it;
- `on` (the default Conductor): kvcache_centric may plan the prefix from the peer that holds it
  (KvFetch), and the node that read it keeps a copy, so hot prefixes replicate and their
  readers spread (paper §6.2 "cache load balancing").

Which capacity cache-sim is given: with peer reads every block in any node's cache is
reusable by every node, so the P caches form one cache of P x C blocks, less the blocks held
twice (copies); cache-sim's one LRU pool of P x C blocks is the reference (the `on` run), and
C (one node's cache, what a node whose turns all stay on it can reuse at worst) is printed too.

The trace is mapped onto the small model consistently for both sides: each hash id is B
prompt tokens (B = the nodes' kv_block_tokens, `bench serve --trace-block-tokens B`), a prompt
keeps its first M hash ids, and its last block is made partial (r of B tokens, r from the
trace's own last block) and unique (a fresh hash id): the nodes never cache a partial block and
always compute the prompt's last token, so a hit in cache-sim is exactly a block the nodes can
reuse. Timestamps are divided by --speed.

usage: python3 bench/cluster/trace_replay.py BUILD_DIR [--model GGUF] [--start I] [--requests N]
           [--speed X] [--prefill P] [--capacity C] [--block-tokens B] [--max-blocks M]
           [--out-tokens T] [--runs off,on] [--out DIR] [--json]

Without --model it writes a 256-dim, 4-layer F16 random model (`tycho mkmodel`, stories260K's
vocabulary) whose prefill takes milliseconds per block here. Needs TYCHO_TEST_DATA.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from prefix_routing import Cluster, ensure_cluster_secret  # noqa: E402

UNIQUE = 1 << 40  # hash ids of the made-partial last blocks (the trace's are far below)


def derive_trace(src, dst, start, n, speed, block, max_blocks, out_tokens):
    """The slice as both sides see it; returns (requests, prompt tokens)."""
    reqs = []
    with open(src) as f:
        for i, line in enumerate(f):
            if i >= start and line.strip():
                reqs.append(json.loads(line))
            if len(reqs) == n:
                break
    t0 = reqs[0]["timestamp"]
    total = 0
    with open(dst, "w") as f:
        for i, r in enumerate(reqs):
            ids = r["hash_ids"][:max_blocks]
            last = r["input_length"] - 512 * (len(r["hash_ids"]) - 1)  # the trace's last block
            part = len(ids) < len(r["hash_ids"]) and block // 2 or round(last / 512 * block)
            part = min(max(part, 1), block - 1)
            ids = ids[:-1] + [UNIQUE + start + i]
            n_in = (len(ids) - 1) * block + part
            total += n_in
            f.write(json.dumps({"timestamp": round((r["timestamp"] - t0) / speed, 3),
                                "input_length": n_in,
                                "output_length": max(1, min(r["output_length"], out_tokens)),
                                "hash_ids": ids}) + "\n")
    return len(reqs), total


def cache_sim(tycho, trace, caps):
    out = subprocess.run([tycho, "cache-sim", "--trace", trace, "--capacity",
                          ",".join(str(c) for c in caps), "--policy", "lru", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return {r["capacity"]: r for r in json.loads(out)["results"]}


def scrape(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                m[k] = float(v)
            except ValueError:
                pass
    return m


def node_load(cl, names):
    """Per prefill node: prompt tokens computed, forward seconds, forward calls."""
    out = {}
    for n in names:
        m = scrape(cl.metrics_port(n))
        out[n] = (m.get("tycho_node_step_tokens_total", 0),
                  m.get("tycho_node_step_seconds_sum", 0), m.get("tycho_node_step_seconds_count", 0))
    return out


def settle(cl, names, timeout=10):
    """Wait until the nodes' counters stop moving (the last forward calls observed)."""
    prev, end = None, time.time() + timeout
    while time.time() < end:
        cur = node_load(cl, names)
        if cur == prev:
            return cur
        prev = cur
        time.sleep(0.5)
    return prev


def replay(a, tycho, model, trace, n, run, out_dir):
    names = ["p%d" % i for i in range(a.prefill)]
    sched = "  local_prefix_only: true\n" if run == "off" else ""
    cl = Cluster(a.build, model, "kvcache_centric", n_prefill=a.prefill, kv_pages=a.capacity,
                 sched_yaml=sched, node_args=["--kv_block_tokens=%d" % a.block_tokens,
                                              "--prefill_batch=1"])
    try:
        before = node_load(cl, names)
        out_json = os.path.join(out_dir, "bench-%s.json" % run)
        bench = subprocess.Popen([tycho, "bench", "serve", "--base-url",
                                  "http://127.0.0.1:%d" % cl.http, "--dataset-path", trace,
                                  "--num-prompts", str(n), "--random-input-len", "0",
                                  "--random-output-len", "0", "--trace-block-tokens",
                                  str(a.block_tokens), "--json", out_json],
                                 stdout=subprocess.DEVNULL)
        samples = [before]
        while bench.poll() is None:  # the nodes' counters every --window seconds
            time.sleep(a.window)
            samples.append(node_load(cl, names))
        if bench.returncode:
            raise RuntimeError("tycho bench serve failed (%d)" % bench.returncode)
        after = settle(cl, names)
        conductor = cl.metrics()
    finally:
        cl.stop()
    b = json.load(open(out_json))
    load = {k: [after[k][i] - before[k][i] for i in range(3)] for k in names}
    tokens = [load[k][0] for k in names]
    secs = [load[k][1] for k in names]
    # the busiest node over the mean per window, weighted by the window's tokens: a node that
    # is busiest now and idle later shows here, not in the run's totals
    num = den = 0.0
    for s0, s1 in zip(samples, samples[1:] + [after]):
        w = [s1[k][0] - s0[k][0] for k in names]
        if sum(w) > 0:
            num += max(w) / (sum(w) / len(w)) * sum(w)
            den += sum(w)
    cm = {}
    for line in conductor.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            cm[k] = float(v) if v.replace(".", "").replace("e", "").replace("+", "").isdigit() \
                else 0.0
    peer = cm.get('tycho_prefix_used_blocks_total{source="peer"}', 0.0)
    peer_planned = cm.get('tycho_prefix_planned_blocks_total{source="peer"}', 0.0)
    failed = cm.get("tycho_prefix_fetch_failed_blocks_total", 0.0)
    return {"run": run, "completed": b["completed"], "failed": b["failed"],
            "prompt_tokens": b["total_input_tokens"], "computed_tokens": sum(tokens),
            "per_node_tokens": tokens, "per_node_forward_s": secs,
            "max_over_mean_tokens": max(tokens) / (sum(tokens) / len(tokens)),
            "max_over_mean_forward_s": max(secs) / (sum(secs) / len(secs)),
            "max_over_mean_windows": num / den if den else 0,
            "peer_blocks": peer, "peer_planned_blocks": peer_planned,
            "fetch_failed_blocks": failed, "ttft_p50_ms": b["median_ttft_ms"],
            "ttft_p99_ms": b["p99_ttft_ms"], "ttft_mean_ms": b["mean_ttft_ms"],
            "duration_s": b["duration"]}


def main():
    ensure_cluster_secret()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--model")
    ap.add_argument("--start", type=int, default=0, help="first request of the slice")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--speed", type=float, default=2.0, help="trace time / replay time")
    ap.add_argument("--prefill", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=400, help="page cache per prefill node, "
                    "in blocks (its kv_pages)")
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--max-blocks", type=int, default=32, help="hash ids kept per prompt")
    ap.add_argument("--out-tokens", type=int, default=4)
    ap.add_argument("--runs", default="off,on")
    ap.add_argument("--window", type=float, default=5.0,
                    help="seconds per window of the windowed busiest-node figure")
    ap.add_argument("--out", help="keep the derived trace, model and bench JSON here")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    data = os.environ.get("TYCHO_TEST_DATA") or os.path.join(HERE, "..", "..", "..", "shared")
    tycho = os.path.join(a.build, "src", "cli", "tycho")
    out = a.out or tempfile.mkdtemp(prefix="tycho-trace-replay-")
    os.makedirs(out, exist_ok=True)
    model = a.model or os.path.join(out, "model-256x4.gguf")
    if not os.path.exists(model):
        subprocess.run([tycho, "mkmodel", "--dims", "256,4,4,4,768", "--vocab-from",
                        os.path.join(data, "models", "stories260K", "stories260K.gguf"),
                        "--type", "f16", "--out", model], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trace = os.path.join(out, "slice.jsonl")
    n, prompt = derive_trace(os.path.join(data, "data", "traces", "conversation_trace.jsonl"),
                             trace, a.start, a.requests, a.speed, a.block_tokens, a.max_blocks,
                             a.out_tokens)
    total_cap = a.capacity * a.prefill
    sim = cache_sim(tycho, trace, [total_cap, a.capacity, 0])
    sim_rows = {}
    for cap, key in ((total_cap, "total"), (a.capacity, "per_node"), (0, "unlimited")):
        reusable = sim[cap]["hit_blocks"] * a.block_tokens
        sim_rows[key] = {"capacity": cap, "hit_rate": sim[cap]["hit_rate"],
                         "reusable_tokens": reusable, "computed_tokens": prompt - reusable}
    runs = []
    for run in a.runs.split(","):
        print("# %s: %d requests at %gx ..." % (run, n, a.speed), file=sys.stderr, flush=True)
        r = replay(a, tycho, model, trace, n, run, out)
        ref = sim_rows["total"]["computed_tokens"]
        r["computed_vs_sim"] = r["computed_tokens"] / ref
        r["reused_tokens"] = r["prompt_tokens"] - r["computed_tokens"]
        r["reused_vs_sim"] = r["reused_tokens"] / max(1, sim_rows["total"]["reusable_tokens"])
        r["within_5pct"] = abs(r["computed_vs_sim"] - 1) <= 0.05
        runs.append(r)
    res = {"requests": n, "prompt_tokens": prompt, "speed": a.speed, "prefill_nodes": a.prefill,
           "capacity_per_node": a.capacity, "block_tokens": a.block_tokens,
           "cache_sim": sim_rows, "runs": runs}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print("slice: %d requests from %d, %d prompt tokens, %gx; %d prefill nodes x %d blocks of %d"
          % (n, a.start, prompt, a.speed, a.prefill, a.capacity, a.block_tokens))
    for key, s in sim_rows.items():
        print("cache-sim lru %-9s capacity %6s: hit rate %.4f, reusable %7d, to compute %7d"
              % (key, s["capacity"] or "unlim", s["hit_rate"], s["reusable_tokens"],
                 s["computed_tokens"]))
    print("%-4s %5s %9s %8s %8s %8s %8s %8s %8s %8s %9s %9s" %
          ("run", "ok", "computed", "vs_sim", "reused", "vs_sim", "max/mean", "max/mean",
           "max/mean", "peer", "TTFT p50", "TTFT p99"))
    print("%-4s %5s %9s %8s %8s %8s %8s %8s %8s %8s %9s %9s" %
          ("", "", "tokens", "", "tokens", "", "tokens", "fwd s", "windows", "blocks", "ms",
           "ms"))
    for r in runs:
        print("%-4s %5d %9d %8.3f %8d %8.3f %8.2f %8.2f %8.2f %8d %9.1f %9.1f" %
              (r["run"], r["completed"], r["computed_tokens"], r["computed_vs_sim"],
               r["reused_tokens"], r["reused_vs_sim"], r["max_over_mean_tokens"],
               r["max_over_mean_forward_s"], r["max_over_mean_windows"], r["peer_blocks"],
               r["ttft_p50_ms"], r["ttft_p99_ms"]))
        print("     per node tokens %s, forward s %s; computed within 5%% of cache-sim: %s" %
              ([int(x) for x in r["per_node_tokens"]],
               ["%.2f" % x for x in r["per_node_forward_s"]], "yes" if r["within_5pct"]
               else "NO"))


if __name__ == "__main__":
    main()

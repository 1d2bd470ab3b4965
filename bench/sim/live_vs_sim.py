#!/usr/bin/env python3
"""Live against simulated, on this machine: a slice of the Mooncake conversation trace replayed
by `tycho bench serve` against a colocated `tycho serve` (2 engine threads) and against a P/D
cluster (1 prefill + 1 decode node, 1 thread each: the same CPU threads), and the same slice
simulated by `tycho sim` with cost models fitted by `tycho fit-cost` for each setup's threads
and chunk size. Prints, per setup and arrival rate, SLO attainment (both SLOs met, as `bench
serve --goodput` counts it: a failed request is a miss) and TTFT p50/p90, live beside sim.

usage: python3 bench/sim/live_vs_sim.py BUILD_DIR [--model GGUF] [--requests N]
           [--rates R1,R2] [--in-cap T] [--out-cap T] [--ttft-ms MS] [--tbt-ms MS] [--out DIR]
           [--json]

Without --model it writes a 512-dim, 8-layer F16 random model (`tycho mkmodel`) whose prefill
and decode take tens to hundreds of milliseconds here, so that compute, not the HTTP path,
sets the timings. Needs TYCHO_TEST_DATA (the trace and stories260K's tokenizer).
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def slice_trace(src, dst, n, rate, in_cap, out_cap, block=512):
    """The first n requests of src, arrivals rescaled to `rate` requests/s on average, prompt
    and answer lengths capped (the prompt's hash ids cut to its capped blocks)."""
    reqs = []
    with open(src) as f:
        for line in f:
            if line.strip():
                reqs.append(json.loads(line))
            if len(reqs) == n:
                break
    t0, t1 = reqs[0]["timestamp"], reqs[-1]["timestamp"]
    span = max(t1 - t0, 1)
    scale = (n / rate * 1000.0) / span  # ms of the slice per ms of the trace
    with open(dst, "w") as f:
        for r in reqs:
            inp = min(r["input_length"], in_cap)
            out = max(1, min(r["output_length"], out_cap))
            ids = r["hash_ids"][: math.ceil(inp / block)]
            f.write(json.dumps({"timestamp": round((r["timestamp"] - t0) * scale, 3),
                                "input_length": inp, "output_length": out,
                                "hash_ids": ids}) + "\n")


def wait_port_file(path, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path):
            txt = open(path).read().split()
            if txt:
                return int(txt[0])
        time.sleep(0.1)
    raise RuntimeError("server did not start: no " + path)


def replay(tycho, port, trace, a, out_json):
    sh(tycho, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--dataset-path",
       trace, "--num-prompts", a.requests, "--random-input-len", a.in_cap,
       "--random-output-len", a.out_cap, "--goodput", f"ttft:{a.ttft_ms}", f"tpot:{a.tbt_ms}",
       "--json", out_json, stdout=subprocess.DEVNULL)
    j = json.load(open(out_json))
    return {"attainment": j["slo_attainment"], "ttft_p50_s": j["median_ttft_ms"] / 1e3,
            "ttft_p90_s": j["p90_ttft_ms"] / 1e3, "failed": j["failed"]}


def warm(tycho, port):
    """Two requests before the replay: first-call costs (page faults, BLAS buffers)."""
    sh(tycho, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--num-prompts", 2,
       "--random-input-len", 64, "--random-output-len", 4, "--request-rate", "inf",
       stdout=subprocess.DEVNULL)


def live_colocated(a, tycho, model, trace, out_json, tmp):
    pf = os.path.join(tmp, "serve.port")
    if os.path.exists(pf):
        os.unlink(pf)
    log = open(os.path.join(tmp, "serve.log"), "w")
    p = subprocess.Popen([tycho, "serve", "--model", model, "--listen_port=0", "--rpc_port=0",
                          f"--port_file={pf}", "--engine.threads=2",
                          f"--engine.step_tokens={a.coloc_chunk}"],
                         stdout=log, stderr=log, start_new_session=True)
    try:
        port = wait_port_file(pf)
        warm(tycho, port)
        return replay(tycho, port, trace, a, out_json)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


def live_pd(a, build, tycho, model, trace, out_json, tmp):
    env = dict(os.environ, TYCHO_BIN_DIR=build, TYCHO_CLUSTER_DIR=os.path.join(tmp, "cluster"),
               TYCHO_PREFILL_ARGS=f"--threads=1 --chunk_tokens={a.pd_chunk}",
               TYCHO_DECODE_ARGS="--threads=1")
    script = os.path.join(ROOT, "deploy", "local-cluster.sh")
    out = subprocess.run(["sh", script, "start", "--model", model, "--port", "0", "--prefill",
                          "1", "--decode", "1", "--pool", "0"], env=env, check=True,
                         capture_output=True, text=True).stdout
    try:
        ports = open(os.path.join(tmp, "cluster", "conductor.ports")).read().split()
        port = int(ports[0])
        warm(tycho, port)
        return replay(tycho, port, trace, a, out_json)
    finally:
        subprocess.run(["sh", script, "stop"], env=env, capture_output=True)
        del out


def simulate(a, tycho, cost, trace, mode_args):
    out = subprocess.run([tycho, "sim", "--trace", trace, "--config", cost, "--json",
                          "--goodput", f"ttft:{a.ttft_ms},tbt:{a.tbt_ms}",
                          "--scheduler.policy=kvcache_centric",
                          "--scheduler.admission=baseline", "--cost.net_gbytes_per_s=5"]
                         + mode_args, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)["runs"][0]
    return {"attainment": r["slo_attainment"], "ttft_p50_s": r["ttft_s"]["p50"],
            "ttft_p90_s": r["ttft_s"]["p90"], "failed": r["rejected"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rates", default="0.3,0.6")
    ap.add_argument("--in-cap", type=int, default=1024)
    ap.add_argument("--out-cap", type=int, default=32)
    ap.add_argument("--ttft-ms", type=float, default=4000)
    ap.add_argument("--tbt-ms", type=float, default=60)
    ap.add_argument("--coloc-chunk", type=int, default=256)
    ap.add_argument("--pd-chunk", type=int, default=512)
    ap.add_argument("--out")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--refit", action="store_true", help="fit again even if --out has fits")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tycho = os.path.join(build, "src", "cli", "tycho")
    data = os.environ.get("TYCHO_TEST_DATA", os.path.join(ROOT, "..", "shared"))
    trace_src = os.path.join(data, "data", "traces", "conversation_trace.jsonl")
    out = a.out or tempfile.mkdtemp(prefix="live-vs-sim-")
    os.makedirs(out, exist_ok=True)
    model = a.model
    if not model:
        model = os.path.join(out, "model.gguf")
        sh(tycho, "mkmodel", "--dims", "512,8,8,8,1536", "--vocab-from",
           os.path.join(data, "models", "stories260K", "stories260K.gguf"), "--type", "f16",
           "--out", model, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    costs = {}
    for name, threads, chunk in (("colocated", 2, a.coloc_chunk), ("pd", 1, a.pd_chunk)):
        costs[name] = os.path.join(out, f"cost-{name}.yaml")
        if os.path.exists(costs[name]) and not a.refit:
            continue  # (a rerun into the same --out keeps its fits)
        print(f"fitting the cost model: {threads} thread(s), chunk {chunk} ...", file=sys.stderr)
        sh(tycho, "fit-cost", "--model", model, "--threads", threads, "--chunk-tokens", chunk,
           "--max-prompt", a.in_cap, "--max-batch", 16, "--out", costs[name],
           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    for rate in [float(x) for x in a.rates.split(",")]:
        trace = os.path.join(out, f"slice-{rate:g}.jsonl")
        slice_trace(trace_src, trace, a.requests, rate, a.in_cap, a.out_cap)
        for setup in ("colocated", "pd"):
            print(f"rate {rate:g}/s, {setup}: live replay ...", file=sys.stderr)
            lj = os.path.join(out, f"live-{setup}-{rate:g}.json")
            if setup == "colocated":
                live = live_colocated(a, tycho, model, trace, lj, out)
                sim = simulate(a, tycho, costs[setup], trace,
                               ["--cluster.mode=colocated", "--cluster.nodes=1",
                                f"--cluster.chunk_tokens={a.coloc_chunk}"])
            else:
                live = live_pd(a, build, tycho, model, trace, lj, out)
                sim = simulate(a, tycho, costs[setup], trace,
                               ["--cluster.prefill_nodes=1", "--cluster.decode_nodes=1",
                                "--cluster.prefill_batch=8",
                                f"--cluster.prefill_batch_tokens={a.pd_chunk}",
                                "--cluster.prefill_interleave=true"])
            rows.append({"setup": setup, "rate": rate, "live": live, "sim": sim})
    if a.json:
        print(json.dumps({"requests": a.requests, "ttft_slo_ms": a.ttft_ms,
                          "tbt_slo_ms": a.tbt_ms, "rows": rows}, indent=1))
        return
    print(f"{a.requests} requests of the conversation trace, prompts <= {a.in_cap} tokens, "
          f"answers <= {a.out_cap}; SLOs TTFT {a.ttft_ms:g} ms, TBT {a.tbt_ms:g} ms")
    print(f"{'setup':<10} {'rate':>5} {'slo% live':>9} {'sim':>6} {'diff':>6} "
          f"{'p50 live':>9} {'sim':>6} {'ratio':>6} {'p90 live':>9} {'sim':>6} {'ratio':>6}")
    for r in rows:
        lv, sm = r["live"], r["sim"]
        ratio = lambda x, y: y / x if x > 0 else float("nan")
        print(f"{r['setup']:<10} {r['rate']:>5g} {100 * lv['attainment']:>9.1f} "
              f"{100 * sm['attainment']:>6.1f} {100 * (sm['attainment'] - lv['attainment']):>+6.1f} "
              f"{lv['ttft_p50_s']:>8.2f}s {sm['ttft_p50_s']:>5.2f}s "
              f"{ratio(lv['ttft_p50_s'], sm['ttft_p50_s']):>6.2f} "
              f"{lv['ttft_p90_s']:>8.2f}s {sm['ttft_p90_s']:>5.2f}s "
              f"{ratio(lv['ttft_p90_s'], sm['ttft_p90_s']):>6.2f}")
    print(f"(files in {out})", file=sys.stderr)


if __name__ == "__main__":
    main()

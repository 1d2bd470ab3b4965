#!/usr/bin/env python3
"""Live cluster: how much prefill the Conductor's placement policy saves on multi-turn traffic.

Starts tycho-conductor + 2 tycho-prefill + 1 tycho-decode on loopback (a fresh cluster, cold
caches, per policy), sends the same multi-turn workload through the OpenAI API to each, and
reports per policy the prompt tokens the prefill nodes reused from their KV page caches, the
tokens they computed, and request latency. round_robin (cache-blind, what least-in-flight
routing amounts to for a steady stream) is the peer every other policy is compared with in the
same run.

A policy written POLICY+pool runs with the cluster KV pool: a tycho-store (master and one
1 GiB pool node) that the prefill nodes read prefixes from and write their blocks to, and
whose blocks the Conductor follows (kv_pool.master on both); POLICY+pool-all gives the pool to
the decode nodes too, which write each finished answer's blocks.

Workloads (C requests in flight at a time, each asking for N greedy tokens):
- chat (default): S sessions x T turns; turn t of a session is its previous prompt plus a new
  ~W-word user message (a chat that grows); each round every session takes a turn, in a
  random (seeded) order;
- shared: S x T requests that share one ~P-word prefix and differ in a W-word question (the
  hot-prefix case: cache_aware queues them all on the node holding the prefix);
- conversation: S sessions x T turns where turn t's prompt is turn t-1's prompt, its answer
  (N tokens, as text) and a new W-word message, as a chat client sends it; sessions run in
  parallel (C at a time), each one turn after the other. The answers' KV exists only on the
  decode node: only the pool with decode writes (+pool-all) lets a prefill node reuse it.

usage: prefix_routing.py BUILD_DIR MODEL [--workload chat|shared|conversation] [--sessions S]
                         [--turns T]
                         [--words W] [--prefix-words P] [--concurrency C] [--tokens N]
                         [--policies a,b,...] [--kv-pages N] [--json]
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("the a little big dog cat girl boy park tree ball sun day happy sad ran saw played "
         "went home mom dad friend red blue green small tall old new found lost gave took "
         "looked said wanted liked").split()


def read_ports(path, deadline):
    while time.time() < deadline:
        try:
            with open(path) as f:
                a, b = f.read().split()
                return int(a), int(b)
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError("no port file " + path)


class Cluster:
    def __init__(self, build, model, policy, n_prefill=2, kv_pages=0, sched_yaml="",
                 node_args=()):
        """sched_yaml: more lines of the Conductor's scheduler: section (indented by 2);
        node_args: flags of every node daemon."""
        self.dir = tempfile.mkdtemp(prefix="tycho-bench-cluster-")
        self.procs = []
        policy, _, pool = policy.partition("+")
        pool_arg = []
        if pool in ("pool", "pool-all"):
            self.spawn("store", [os.path.join(build, "src/store/tycho-store"), "--master=true",
                                 "--listen_port=0", "--dram_bytes=1G", "--name=pool-0"])
            pool_arg = ["--kv_pool.master=127.0.0.1:%d" % self.store_port(time.time() + 60)]
        elif pool:
            raise SystemExit("unknown policy suffix +%s (+pool, +pool-all)" % pool)
        node_pool = {"prefill": pool_arg, "decode": pool_arg if pool == "pool-all" else []}
        cfg = os.path.join(self.dir, "conductor.yaml")
        with open(cfg, "w") as f:
            f.write("scheduler:\n  policy: %s\n  admission: baseline\n%s" % (policy, sched_yaml))
        self.spawn("conductor", [os.path.join(build, "src/conductor/tycho-conductor"),
                                 "--config=" + cfg, "--model_path=" + model, "--listen_port=0",
                                 "--rpc_port=0", "--heartbeat_interval=100ms", *pool_arg])
        self.http, rpc = read_ports(self.port_file("conductor"), time.time() + 60)
        nodes = [("prefill", "p%d" % i) for i in range(n_prefill)] + [("decode", "d0")]
        for role, name in nodes:
            self.spawn(name, [os.path.join(build, "src/%s/tycho-%s" % (role, role)),
                              "--model_path=" + model, "--name=" + name, "--threads=1",
                              "--conductor_address=127.0.0.1:%d" % rpc,
                              "--heartbeat_interval=100ms",
                              *node_pool[role], *node_args,
                              *(["--kv_pages=%d" % kv_pages] if kv_pages and role == "prefill"
                                else [])])
        deadline = time.time() + 120
        while time.time() < deadline:
            logs = [open(os.path.join(self.dir, n + ".log")).read() for _, n in nodes]
            if all("registered with the Conductor" in text for text in logs):
                return
            time.sleep(0.1)
        raise RuntimeError("nodes did not register (logs in %s)" % self.dir)

    def port_file(self, name):
        return os.path.join(self.dir, name + ".ports")

    def metrics_port(self, name):
        """A node's /metrics port (its port file: rpc transfer metrics)."""
        with open(self.port_file(name)) as f:
            return int(f.read().split()[2])

    def store_port(self, deadline):
        while time.time() < deadline:
            try:
                with open(self.port_file("store")) as f:
                    return int(dict(kv.split("=") for kv in f.read().split())["master"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        raise RuntimeError("tycho-store did not start (logs in %s)" % self.dir)

    def spawn(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.procs.append(subprocess.Popen(argv + ["--port_file=" + self.port_file(name)],
                                           stdout=log, stderr=log))

    def complete(self, prompt, n):
        c = http.client.HTTPConnection("127.0.0.1", self.http, timeout=600)
        t0 = time.time()
        c.request("POST", "/v1/completions",
                  json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0,
                              "ignore_eos": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        c.close()
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, body))
        u = body["usage"]
        return (time.time() - t0, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
                body["choices"][0]["text"])

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.http, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        return text

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def workload(sessions, turns, words):
    rng = random.Random(7)
    prompts = [["Session %d." % s] for s in range(sessions)]
    order = []
    for t in range(turns):  # every session takes one turn, in a random order
        for s in rng.sample(range(sessions), sessions):
            msg = " ".join(rng.choice(WORDS) for _ in range(words))
            prompts[s].append(msg + ".")
            order.append((s, " ".join(prompts[s])))
    return order


def shared_workload(n, prefix_words, words):
    """n requests that share one long instruction (a system prompt, few-shot examples) and
    differ in a short question: the hot-prefix case, where sending everything to the node that
    holds the prefix queues it up while the other idles."""
    rng = random.Random(11)
    prefix = " ".join(rng.choice(WORDS) for _ in range(prefix_words)) + "."
    return [(i, prefix + " " + " ".join(rng.choice(WORDS) for _ in range(words)) + "?")
            for i in range(n)]


def ideal_cached(order, results, block):
    """Prompt tokens a perfect router could reuse: each turn finds its session's previous
    prompt (all its full blocks but the last token's) on its node."""
    if len({s for s, _ in order}) == len(order):  # shared: every request a session of its own
        return 0
    prev, total = {}, 0
    for (s, _), r in zip(order, results):
        if s in prev:
            total += min(prev[s] // block, (r[1] - 1) // block) * block
        prev[s] = r[1]
    return total


def drive(cl, worker, threads, policy, errors):
    """Warm cl up, run `worker` on `threads` threads, stop cl; the timed wall seconds. A
    worker's error (in `errors`) voids the run."""
    try:
        cl.complete("warm up.", 1)  # page in the weights everywhere before timing
        t0 = time.time()
        th = [threading.Thread(target=worker) for _ in range(threads)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.time() - t0
    finally:
        cl.stop()
    if errors:
        raise RuntimeError("%s: %s" % (policy, errors[0]))
    return wall


def summarize(policy, results, wall, ideal):
    """One table row from the requests' (latency, prompt tokens, cached tokens, text)."""
    lat = sorted(r[0] for r in results)
    prompt = sum(r[1] for r in results)
    cached = sum(r[2] for r in results)
    return {"policy": policy, "requests": len(results), "prompt_tokens": prompt,
            "cached_tokens": cached, "computed_tokens": prompt - cached,
            "cached_share": cached / prompt, "ideal_cached_tokens": ideal,
            "of_ideal": cached / ideal if ideal else 0, "latency_mean_s": sum(lat) / len(lat),
            "latency_p90_s": lat[int(0.9 * (len(lat) - 1))], "wall_s": wall}


def run_conversation(a, policy):
    """The conversation workload: each session's turns in order, sessions in parallel."""
    cl = Cluster(a.build, a.model, policy, kv_pages=a.kv_pages)
    rng = random.Random(5)
    msgs = [[" ".join(rng.choice(WORDS) for _ in range(a.words)) + "." for _ in range(a.turns)]
            for _ in range(a.sessions)]
    results, lock, errors, nxt = [], threading.Lock(), [], [0]

    def session_worker():
        while True:
            with lock:
                s = nxt[0]
                nxt[0] += 1
            if s >= a.sessions:
                return
            prompt = "Session %d." % s
            try:
                for t in range(a.turns):
                    prompt += " " + msgs[s][t]
                    r = cl.complete(prompt, a.tokens)
                    with lock:
                        results.append(r)
                    prompt += r[3]  # the answer, as a chat client sends it back
            except Exception as e:  # reported, and the run is void
                errors.append(repr(e))

    wall = drive(cl, session_worker, a.concurrency, policy, errors)
    return summarize(policy, results, wall, 0)


def run_policy(a, policy, order):
    prompts = [p for _, p in order]
    cl = Cluster(a.build, a.model, policy, kv_pages=a.kv_pages)
    results = [None] * len(prompts)
    nxt = [0]
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(prompts):
                return
            try:
                results[i] = cl.complete(prompts[i], a.tokens)
            except Exception as e:  # reported, and the run is void
                errors.append(repr(e))
                return

    wall = drive(cl, worker, a.concurrency, policy, errors)
    return summarize(policy, results, wall, ideal_cached(order, results, a.block_tokens))


def ensure_cluster_secret():
    """The daemons prove a cluster secret to each other (docs/arch/security.md): the caller's
    TYCHO_CLUSTER_SECRET_FILE, else a throwaway one."""
    if os.environ.get("TYCHO_CLUSTER_SECRET_FILE"):
        return
    path = os.path.join(tempfile.mkdtemp(prefix="tycho-secret-"), "cluster.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    os.environ["TYCHO_CLUSTER_SECRET_FILE"] = path


def main():
    ensure_cluster_secret()
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--words", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--block-tokens", type=int, default=64, help="the nodes' kv_block_tokens")
    ap.add_argument("--kv-pages", type=int, default=0,
                    help="the prefill nodes' kv_pages (a small page cache: memory pressure)")
    ap.add_argument("--workload", choices=("chat", "shared", "conversation"), default="chat")
    ap.add_argument("--prefix-words", type=int, default=200, help="shared: the common prefix")
    ap.add_argument("--policies", default="round_robin,load_balance,cache_aware,kvcache_centric")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.workload == "shared":
        order = shared_workload(a.sessions * a.turns, a.prefix_words, a.words)
    else:
        order = workload(a.sessions, a.turns, a.words)
    rows = []
    for pol in a.policies.split(","):
        print("# %s: %d requests ..." % (pol, len(order)), file=sys.stderr, flush=True)
        rows.append(run_conversation(a, pol) if a.workload == "conversation"
                    else run_policy(a, pol, order))
    base = next((r for r in rows if r["policy"] == "round_robin"), rows[0])
    for r in rows:
        r["computed_vs_peer"] = r["computed_tokens"] / base["computed_tokens"]
        r["latency_vs_peer"] = r["latency_mean_s"] / base["latency_mean_s"]
    if a.json:
        print(json.dumps({"peer": base["policy"], "rows": rows}, indent=1))
        return
    print("%-16s %8s %8s %8s %7s %7s %9s %9s %8s %9s %9s" %
          ("policy", "prompt", "cached", "computed", "cached%", "ideal%", "lat_mean", "lat_p90",
           "wall", "computed/", "latency/"))
    print("%-16s %8s %8s %8s %7s %7s %9s %9s %8s %9s %9s" %
          ("", "tokens", "tokens", "tokens", "", "", "s", "s", "s", base["policy"][:9],
           base["policy"][:9]))
    for r in rows:
        ideal = "%6.1f%%" % (100 * r["of_ideal"]) if r["ideal_cached_tokens"] else "%7s" % "-"
        print("%-16s %8d %8d %8d %6.1f%% %s %9.3f %9.3f %8.1f %8.2fx %8.2fx" %
              (r["policy"], r["prompt_tokens"], r["cached_tokens"], r["computed_tokens"],
               100 * r["cached_share"], ideal, r["latency_mean_s"], r["latency_p90_s"],
               r["wall_s"], r["computed_vs_peer"], r["latency_vs_peer"]))
    if rows[0]["ideal_cached_tokens"]:
        print("# ideal%%: cached tokens as a share of what a perfect router could reuse (%d)" %
              rows[0]["ideal_cached_tokens"])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Chaos soak of a whole Tycho cluster (docs/arch/testing.md "Chaos soak").

Two Conductors, two prefill and two decode nodes (registered with both Conductors), the KV
pool's master and two pool nodes, all on stories260K, inside a network namespace whose
loopback delays and drops packets (tc netem) where this process may make one (root, `ip`,
`tc`; else plain loopback, said in the report). Poisson load comes through the official
`openai` npm client (soak_client.mjs) against both Conductors while a driver SIGKILLs and
SIGSTOPs random daemons and restarts the killed ones on their ports, as systemd would (the
first Conductor, prefill, decode and pool node are only ever stopped: survivors of each kind).

It checks what the issue asks: every request ends with the greedy answer or a clean error
within its deadline (no hang); no finished answer misses or changes a token (texts compared
with `tycho generate`); afterwards the decode nodes run nothing and hold no more KV pages than
before the load, the pool has no pending put; the daemons that were never killed grew their
RSS by at most 5% over the second half of the load (from the most they held in the first half:
buffers grow to the largest batch and prompt met, a high-water mark; a leak keeps growing);
with a sanitizer build, no daemon log holds a sanitizer report (RSS is not judged there: ASan's
quarantine keeps freed memory). Prints a table (and --json FILE) of requests, faults and errors by kind.

Usage: soak.py BUILD_DIR [--duration 180] [--rate 4] [--seed 1] [--json FILE]
Exit 77 without the shared model or the openai package.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import http.client
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../pylib"))
from tyports import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("TYCHO_TEST_DATA", os.path.join(HERE, "..", "..", "..", "shared"))
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.gguf")
PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park",
           "One day, a big bear", "There was a girl named Sue", "The sun was hot",
           "Tim had a red ball", "The cat sat on the mat and looked at the bird in the tree"]
NS = "tycho-soak-%d" % os.getpid()
KEEP = ("conductor0", "p0", "d0", "pool0")  # SIGSTOPped at times, never SIGKILLed


def scrape(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Daemon:
    def __init__(self, name, argv, logdir, kind):
        self.name, self.argv, self.kind = name, argv, kind
        self.log = os.path.join(logdir, name + ".log")
        self.proc = None
        self.starts = 0
        self.stopped = False

    def start(self):
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=logf)
        self.starts += 1

    def alive(self):
        return self.proc and self.proc.poll() is None


def build_cluster(bindir, tmp):
    P = {k: free_port() for k in ("master", "master_m", "c0h", "c0r", "c1h", "c1r")}
    conductors = "127.0.0.1:%d,127.0.0.1:%d" % (P["c0r"], P["c1r"])
    pool = "--kv_pool.master=127.0.0.1:%d" % P["master"]
    B = lambda rel: os.path.join(bindir, rel)
    ds = []
    ds.append(Daemon("master", [B("src/store/tycho-store"), "--master=true", "--dram_bytes=0",
                                "--listen_port=%d" % P["master"],
                                "--metrics_port=%d" % P["master_m"], "--node_timeout=2s"],
                     tmp, "store"))
    for i in range(2):
        ds.append(Daemon("pool%d" % i, [
            B("src/store/tycho-store"), "--name=pool-%d" % i, "--dram_bytes=32M",
            "--master_address=127.0.0.1:%d" % P["master"], "--rpc_port=%d" % free_port(),
            "--xfer_port=%d" % free_port(), "--metrics_port=%d" % free_port(),
            "--heartbeat_interval=200ms"], tmp, "store"))
    for i in range(2):
        ds.append(Daemon("conductor%d" % i, [
            B("src/conductor/tycho-conductor"), "--model_path=" + MODEL,
            "--listen_port=%d" % P["c%dh" % i], "--rpc_port=%d" % P["c%dr" % i],
            "--heartbeat_interval=200ms", "--heartbeat_timeout=1500ms",
            "--node_answer_timeout=2s", "--breaker_open=2s", "--request_timeout=30s", pool],
            tmp, "conductor"))
        ds[-1].http = P["c%dh" % i]
    for role in ("prefill", "decode"):
        for i in range(2):
            mport = free_port()
            d = Daemon("%s%d" % (role[0], i), [
                B("src/%s/tycho-%s" % (role, role)), "--model_path=" + MODEL,
                "--name=%s%d" % (role[0], i), "--conductor_address=" + conductors,
                "--listen_port=%d" % free_port(), "--transfer_port=%d" % free_port(),
                "--metrics_port=%d" % mport, "--kv_block_tokens=16",
                "--heartbeat_interval=200ms", "--chunk_tokens=32", "--kv_pages=128", pool],
                tmp, role)
            d.metrics = mport
            ds.append(d)
    ds[0].metrics = P["master_m"]
    return ds


def sanitizer(bindir):
    """The build's TYCHO_SANITIZE setting ("" for none), from its CMakeCache.txt."""
    try:
        with open(os.path.join(bindir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("TYCHO_SANITIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def references(bindir):
    refs = []
    for i, p in enumerate(PROMPTS):
        n = 8 + 4 * (i % 4)
        out = subprocess.run([os.path.join(bindir, "src/cli/tycho"), "generate", "--model", MODEL,
                              "--prompt", p, "-n", str(n), "--temp", "0", "--json"],
                             capture_output=True, text=True, check=True)
        refs.append({"prompt": p, "max_tokens": n, "text": json.loads(out.stdout)["text"]})
    return refs


def wait_ready(ds, secs=30):
    """Every prefill and decode node up in every Conductor's GET /status."""
    end = time.time() + secs
    need = {d.name for d in ds if d.kind in ("prefill", "decode")}
    while time.time() < end:
        ok = True
        for c in (d for d in ds if d.kind == "conductor"):
            try:
                h = http.client.HTTPConnection("127.0.0.1", c.http, timeout=5)
                h.request("GET", "/status")
                nodes = json.loads(h.getresponse().read()).get("nodes", [])
                h.close()
            except (OSError, ValueError, http.client.HTTPException):
                nodes = []
            up = {n["id"] for n in nodes if n.get("alive")}
            ok &= need <= up
        if ok:
            return True
        time.sleep(0.2)
    return False


def idle_state(ds):
    """Per decode node: (running + waiting, KV pages used); the master's pending puts."""
    out = {}
    for d in ds:
        if d.kind == "decode":
            m = scrape(d.metrics)
            used = [v for k, v in m.items() if k.startswith("tycho_node_kv_pages{") and
                    'state="used"' in k]
            used = sum(used) if used else -1  # -1: not scraped (a failed check below)
            out[d.name] = (m.get("tycho_node_requests_running", -1) +
                           m.get("tycho_node_requests_waiting", -1), used)
    m = scrape(ds[0].metrics)
    out["pending_puts"] = m.get("tycho_store_pending_puts", -1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-every", type=float, default=5.0, help="mean seconds between faults")
    ap.add_argument("--netem", default="delay 1ms 1ms loss 0.2%",
                    help="tc netem arguments for the namespace's loopback ('' : none)")
    ap.add_argument("--tbf", default="rate 200mbit burst 64kb latency 20ms",
                    help="tc tbf arguments where the kernel has no netem")
    ap.add_argument("--qdisc", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        print("skip: no " + MODEL)
        return 77
    netem = "none (plain loopback)"
    if not a.inside and a.netem and os.geteuid() == 0 and shutil.which("ip") and \
            shutil.which("tc"):
        # run the whole cluster, client included, in a namespace whose loopback is impaired:
        # delay and loss (netem) where the kernel has sch_netem, else a rate limit with its
        # queueing delay (tbf)
        try:
            subprocess.run(["ip", "netns", "add", NS], check=True)
            subprocess.run(["ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up"],
                           check=True)
            qdisc = "netem " + a.netem
            r = subprocess.run(["ip", "netns", "exec", NS, "tc", "qdisc", "add", "dev", "lo",
                                "root", "netem", *a.netem.split()], capture_output=True)
            if r.returncode != 0:
                qdisc = "tbf " + a.tbf + " (this kernel has no sch_netem)"
                subprocess.run(["ip", "netns", "exec", NS, "tc", "qdisc", "add", "dev", "lo",
                                "root", "tbf", *a.tbf.split()], check=True)
            return subprocess.run(["ip", "netns", "exec", NS, sys.executable, __file__,
                                   *sys.argv[1:], "--inside", "--qdisc", qdisc]).returncode
        except subprocess.CalledProcessError as e:
            print("no network namespace (%s): plain loopback" % e)
        finally:
            subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    if a.inside:
        netem = "namespace loopback, " + a.qdisc
    return run(a, netem)


def run(a, netem):
    rnd = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="tycho-soak-")
    if not os.environ.get("TYCHO_CLUSTER_SECRET_FILE"):
        path = os.path.join(tmp, "cluster.secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
        os.environ["TYCHO_CLUSTER_SECRET_FILE"] = path
    ds = build_cluster(a.build, tmp)
    failures = []

    def check(cond, what):
        print(("ok: " if cond else "FAIL: ") + what)
        if not cond:
            failures.append(what)

    faults = {"kill": 0, "stop": 0}
    client = None
    try:
        refs = references(a.build)
        for d in ds:
            d.start()
        if not wait_ready(ds):
            check(False, "every node registered with both Conductors")
            return 1
        # warm-up: the load without faults, until caches and allocators settle (128 KV pages per
    # node, so that the warm-up has touched them: the RSS baseline is the node's working set)
        plan = {"urls": ["http://127.0.0.1:%d/v1" % d.http for d in ds if d.kind == "conductor"],
                "rate": a.rate, "duration_s": 12, "deadline_s": 30, "prompts": refs,
                "seed": a.seed}
        pf = os.path.join(tmp, "plan.json")
        with open(pf, "w") as f:
            json.dump(plan, f)
        node = shutil.which("node") or "node"
        warm = subprocess.run([node, os.path.join(HERE, "soak_client.mjs"), pf],
                              capture_output=True, text=True)
        if warm.returncode == 77:
            print("skip: " + warm.stdout.strip())
            return 77
        time.sleep(1.0)
        before = idle_state(ds)
        plan["duration_s"] = a.duration
        plan["seed"] = a.seed + 1
        with open(pf, "w") as f:
            json.dump(plan, f)
        t0 = time.time()
        client = subprocess.Popen([node, os.path.join(HERE, "soak_client.mjs"), pf],
                                  stdout=subprocess.PIPE, text=True)
        stopped = []  # (daemon, resume_at)
        dead = []     # (daemon, restart_at)
        next_fault = t0 + rnd.expovariate(1 / a.fault_every)
        # each daemon's RSS baseline: the most it held during the first half of the load (its
        # buffers grow to the largest batch, prompt and fault recovery it has met: a high-water
        # mark, not growth); a leak shows as growth over the second half
        base = {}
        next_sample = t0
        while client.poll() is None:
            now = time.time()
            if now >= next_sample and now < t0 + a.duration / 2:
                next_sample = now + 1.0
                for d in ds:
                    if d.starts == 1 and d.alive():
                        base[d.name] = max(base.get(d.name, 0), rss_kb(d.proc.pid))
            for d, at in list(stopped):
                if now >= at:
                    d.proc.send_signal(signal.SIGCONT)
                    stopped.remove((d, at))
            for d, at in list(dead):
                if now >= at:
                    d.start()
                    dead.remove((d, at))
            if now >= next_fault and now < t0 + a.duration - 5:
                next_fault = now + rnd.expovariate(1 / a.fault_every)
                busy = {d.name for d, _ in stopped + dead}
                cand = [d for d in ds if d.name not in busy]
                # one Conductor always serves: the load balancer needs somewhere to send
                if any(d.kind == "conductor" for d, _ in stopped + dead):
                    cand = [d for d in cand if d.kind != "conductor"]
                d = rnd.choice(cand)
                # the first of each kind is only ever stopped, never killed: survivors of every
                # kind whose memory the run can judge (the others are killed and restarted)
                if rnd.random() < 0.5 and d.name not in KEEP:
                    d.proc.send_signal(signal.SIGKILL)
                    d.proc.wait()
                    dead.append((d, now + rnd.uniform(1.0, 3.0)))
                    faults["kill"] += 1
                    print("  %6.1f s  SIGKILL %s" % (now - t0, d.name))
                else:
                    d.proc.send_signal(signal.SIGSTOP)
                    stopped.append((d, now + rnd.uniform(1.0, 4.0)))
                    faults["stop"] += 1
                    print("  %6.1f s  SIGSTOP %s" % (now - t0, d.name))
            time.sleep(0.05)
        for d, _ in stopped:
            d.proc.send_signal(signal.SIGCONT)
        for d, _ in dead:
            d.start()
        out = json.loads(client.stdout.read().strip().splitlines()[-1])
        # settle: restarted nodes register, the last requests' pages are freed
        wait_ready(ds)
        time.sleep(3.0)
        after = idle_state(ds)
        survivors = [d for d in ds if d.starts == 1]
        survivors = [d for d in survivors if d.name in base]  # idle throughout: nothing to say
        rss1 = {d.name: rss_kb(d.proc.pid) for d in survivors}
        growth = {d.name: (rss1[d.name] - base[d.name]) / max(base[d.name], 1)
                  for d in survivors}
        errors = sum(out["errors"].values())
        print("\n%-28s %s" % ("network", netem))
        print("%-28s %.0f s at %.1f req/s" % ("load", a.duration, a.rate))
        print("%-28s %d" % ("requests", out["sent"]))
        print("%-28s %d" % ("answered, greedy text", out["ok"]))
        print("%-28s %d" % ("answered, other text", out["mismatch"]))
        for k, v in sorted(out["errors"].items()):
            print("%-28s %d  (%s)" % ("error: " + k, v, out.get("error_samples", {}).get(k, "")))
        print("%-28s %d SIGKILL+restart, %d SIGSTOP" % ("faults", faults["kill"],
                                                          faults["stop"]))
        print("%-28s p50 %d, p99 %d, max %d" % ("latency ms", out["latency_ms"]["p50"],
                                                 out["latency_ms"]["p99"],
                                                 out["latency_ms"]["max"]))
        print("%-28s %s" % ("RSS growth (never killed)",
                            ", ".join("%s %+.1f%%" % (k, 100 * v) for k, v in growth.items())))
        print("%-28s %s" % ("RSS KiB 1st-half max -> end", ", ".join(
            "%s %d -> %d" % (k, base[k], rss1[k]) for k in rss1)))
        print()
        check(out["sent"] > 0 and out["ok"] + out["mismatch"] + errors == out["sent"],
              "every request ended (%d sent, %d answered, %d errors)" %
              (out["sent"], out["ok"] + out["mismatch"], errors))
        check(not out["errors"].get("deadline") and not out["errors"].get("late"),
              "no request ran past its deadline (no hang)")
        check(out["mismatch"] == 0, "no finished answer differs from tycho generate's: %s" %
              out["mismatches"][:2])
        check(out["ok"] >= out["sent"] // 2, "most requests answered (%d of %d)" %
              (out["ok"], out["sent"]))
        check(all(after[n][0] == 0 for n in after if n != "pending_puts"),
              "the decode nodes run and queue nothing after the load: %s" % after)
        check(all(0 <= after[n][1] <= before.get(n, (0, 0))[1] for n in after
                  if n != "pending_puts"),
              "their KV pages are back to the idle level: before %s, after %s" % (before, after))
        check(after["pending_puts"] == 0, "the pool has no pending put")
        if sanitizer(a.build):
            print("(RSS not judged: a sanitizer build keeps freed memory in quarantine)")
        else:
            check(all(v <= 0.05 for v in growth.values()),
                  "the never-killed daemons' RSS grew at most 5% over the second half of the "
                  "load")
        bad = []
        for d in ds:
            text = open(d.log, errors="replace").read()
            if "AddressSanitizer" in text or "LeakSanitizer" in text or \
                    "runtime error:" in text or "ThreadSanitizer" in text:
                bad.append(d.name)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"network": netem, "duration_s": a.duration, "rate": a.rate,
                           "client": out, "faults": faults, "rss_growth": growth,
                           "idle_before": before, "idle_after": after,
                           "failures": failures}, f, indent=1)
        # stop everything; a sanitizer build reports leaks at exit
        for d in ds:
            if d.alive():
                d.proc.send_signal(signal.SIGTERM)
        for d in ds:
            try:
                d.proc.wait(15)
            except subprocess.TimeoutExpired:
                d.proc.kill()
        for d in ds:
            text = open(d.log, errors="replace").read()
            if ("AddressSanitizer" in text or "LeakSanitizer" in text or
                    "runtime error:" in text) and d.name not in bad:
                bad.append(d.name)
        check(not bad, "no sanitizer report in any daemon's log: %s" % bad)
    finally:
        if client and client.poll() is None:
            client.kill()
        for d in ds:
            if d.alive():
                d.proc.send_signal(signal.SIGCONT)
                d.proc.kill()
        if failures:
            for d in ds:
                print("==== %s\n%s" % (d.name, open(d.log, errors="replace").read()[-2500:]))
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Integration tests of the disaggregated cluster on stories260K: tycho-conductor, tycho-prefill
and tycho-decode as separate processes on loopback ephemeral ports, KV over the local transport
(transfer.transport auto on one host) or tcp where a case asks; case gpu runs the nodes on CUDA
(scripts/gpu-check.sh).

Usage: test_cluster.py BUILD_DIR CASE   (CASE: equal, concurrent, kill_decode, hung_decode,
prefix_routing, cache_events, slo_reject, cost_refit, phantom_credit, kv_pool, pool_sched, pool_decode, pool_snapshot, local_cluster, preempt, kill_prefill, handshake, bad_destination, transports, longctx, gpu, ...).
Exits 77 when the shared test data (or, for gpu, a CUDA device) is missing; TYCHO_BIN_DIR names
a folder holding every binary instead of the build tree. Expected token ids come from running `tycho generate` (the
monolithic engine loop), never from the cluster.
"""
import http.client
import json
import re
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../pylib"))
from tyports import free_port  # noqa: E402

BUILD = sys.argv[1]
CASE = sys.argv[2]
DATA = os.environ.get("TYCHO_TEST_DATA", "")
MODEL = os.path.join(DATA, "models/stories260K/stories260K.gguf")
# Sanitizer builds (CMake sets TYCHO_SANITIZER_SLOW=1) run the engine 10-20x slower: the long
# streams of kill_decode get fewer tokens, still seconds long, with the same checks.
SLOW = os.environ.get("TYCHO_SANITIZER_SLOW") == "1"
# TYCHO_BIN_DIR: every binary in one folder (scripts/gpu-check.sh, a prebuilt bundle)
BIN_DIR = os.environ.get("TYCHO_BIN_DIR")


def binary(rel):
    return os.path.join(BIN_DIR, os.path.basename(rel)) if BIN_DIR else os.path.join(BUILD, rel)


TYCHO = binary("src/cli/tycho")
CONDUCTOR = binary("src/conductor/tycho-conductor")
PREFILL = binary("src/prefill/tycho-prefill")
STORE = binary("src/store/tycho-store")
DECODE = binary("src/decode/tycho-decode")

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park",
           "One day, a big bear", "There was a girl named Sue", "The sun was hot",
           "Max had a red ball", "In a small town", "A bird sat on a tree", "Mom said",
           "The cat", "Tim wanted to play", "It was a rainy day", "The boy ran fast",
           "She saw a big box", "Once there was a fish", "The king was sad",
           "Ben and his dad",
           # longer than several KV pages (16 tokens) and prefill chunks (32 tokens)
           "Once upon a time, there was a little girl named Lily. She loved to play outside in "
           "the sun. One day, she saw a big tree in the park. She wanted to climb it, but her "
           "mom said no. Lily was sad, so she sat down and",
           "The little dog ran to the park with his friend the cat. They played with a red "
           "ball all day long until the sun went down and the sky was dark. Then they went "
           "home to eat and sleep"]


TMPDIRS = []  # removed by main() when the case ends


def read_ports(path, deadline, n=2):
    """The first n ports of a port file ("rpc transfer metrics" for a node)."""
    while time.time() < deadline:
        try:
            with open(path) as f:
                ports = [int(x) for x in f.read().split()]
                if len(ports) >= n:
                    return tuple(ports[:n])
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError("no port file " + path)


class Cluster:
    """The processes of one cluster. Every cluster a case starts is stopped by main() when
    the case ends, and its logs are printed when the case failed."""
    started = []

    def __init__(self, n_prefill, n_decode, hb_timeout="1500ms", model=MODEL, config=None,
                 node_args=(), kv_pool=False, conductor_pool=False, decode_args=()):
        Cluster.started.append(self)
        self.dir = tempfile.mkdtemp(prefix="tycho-cluster-")
        self.model = model
        self.node_args = list(node_args)
        self.decode_args = list(decode_args)
        self.procs = {}
        self.logs = {}
        extra = []
        if kv_pool:  # a tycho-store master with one 64 MiB pool node, for the prefill nodes
            self.start("store", [STORE, "--master=true", "--listen_port=0", "--dram_bytes=64M",
                                 "--name=pool-0"])
            self.node_args.append("--kv_pool.master=127.0.0.1:%d" % self.store_port())
            if conductor_pool:  # the Conductor follows the pool's blocks too
                extra.append("--kv_pool.master=127.0.0.1:%d" % self.store_port())
        if config:
            path = os.path.join(self.dir, "conductor.yaml")
            with open(path, "w") as f:
                f.write(config)
            extra.append("--config=" + path)
        self.conductor_argv = [CONDUCTOR, *extra, "--model_path=" + model,
                               "--heartbeat_interval=200ms", "--heartbeat_timeout=" + hb_timeout]
        self.start("conductor", self.conductor_argv + ["--listen_port=0", "--rpc_port=0"])
        self.http, self.rpc = read_ports(self.port_file("conductor"), time.time() + 20)
        for i in range(n_prefill):
            self.start_node("prefill", "p%d" % i)
        for i in range(n_decode):
            self.start_node("decode", "d%d" % i)
        self.wait_nodes(n_prefill + n_decode)

    def port_file(self, name):
        return os.path.join(self.dir, name + ".ports")

    def store_port(self):
        end = time.time() + 20
        while time.time() < end:
            try:
                with open(self.port_file("store")) as f:
                    return int(dict(kv.split("=") for kv in f.read().split())["master"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        raise RuntimeError("tycho-store did not start:\n" + self.dump())

    def start(self, name, argv, env=None):
        try:
            os.unlink(self.port_file(name))
        except OSError:
            pass
        log = open(os.path.join(self.dir, name + ".log"), "a")
        self.logs[name] = log.name
        self.procs[name] = subprocess.Popen(argv + ["--port_file=" + self.port_file(name)],
                                            stdout=log, stderr=log, env=env)

    def start_node(self, role, name, env=None, extra=()):
        self.start(name, [PREFILL if role == "prefill" else DECODE, "--model_path=" + self.model,
                          "--name=" + name, "--conductor_address=" +
                          getattr(self, "conductor_address", "127.0.0.1:%d" % self.rpc),
                          "--kv_block_tokens=16", "--heartbeat_interval=200ms",
                          "--chunk_tokens=32", *self.node_args,
                          *(self.decode_args if role == "decode" else []), *extra], env=env)

    def registered(self):
        out = []
        for name in self.procs:
            if name == "conductor":
                continue
            with open(self.logs[name]) as f:
                if "registered with the Conductor" in f.read():
                    out.append(name)
        return out

    def log_shows(self, name, text, secs=10):
        """Whether `text` appears in process `name`'s log within `secs`."""
        end = time.time() + secs
        while True:
            with open(self.logs[name]) as f:
                if text in f.read():
                    return True
            if time.time() > end:
                return False
            time.sleep(0.05)

    def wait_nodes(self, n, deadline=20):
        end = time.time() + deadline
        while time.time() < end:
            if len(self.registered()) >= n:
                return
            time.sleep(0.05)
        raise RuntimeError("nodes did not register:\n" + self.dump())

    def dump(self):
        text = ""
        for name, path in self.logs.items():
            with open(path) as f:
                text += "==== %s\n%s" % (name, f.read()[-3000:])
        return text

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a case may have left one stopped
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()

    def post(self, path, body, timeout=30, headers=None, key=None):
        c = http.client.HTTPConnection("127.0.0.1", self.http, timeout=timeout)
        send = {"Content-Type": "application/json"}
        if key:
            send["Authorization"] = "Bearer " + key
        c.request("POST", path, json.dumps(body), send)
        r = c.getresponse()
        data = r.read()
        if headers is not None:
            headers.update({k.lower(): v for k, v in r.getheaders()})
        c.close()
        return r.status, data

    def metrics(self):
        """The Conductor's /metrics as {"name{labels}": value}."""
        return scrape(self.http)


def scrape(port):
    """GET /metrics on a loopback port, as {"name{labels}": value}."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def get_status(port, path):
    """(status, body) of GET path on a loopback port."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    out = (r.status, r.read().decode())
    c.close()
    return out


def node_metrics(cl, name):
    """A node daemon's /metrics (the third port of its port file) as {"name{labels}": value}."""
    return scrape(read_ports(cl.port_file(name), time.time() + 5, 3)[2])


def kv_bytes(m, direction, transport):
    return m.get('tycho_node_kv_transfer_bytes_total{direction="%s",transport="%s"}' %
                 (direction, transport), -1)


def decisions(m, result, cls=None):
    """tycho_scheduler_decisions_total for one result, summed over the SLO classes (or of one)."""
    out = 0
    for k, v in m.items():
        if k.startswith("tycho_scheduler_decisions_total{") and 'result="%s"' % result in k and \
                (cls is None or 'class="%s"' % cls in k):
            out += v
    return out


def generate(prompt, n, model=MODEL, extra=()):
    """tycho generate's greedy answer (prompt None: the prompt is in extra, --prompt-ids)."""
    out = subprocess.run([TYCHO, "generate", "--model", model,
                          *(["--prompt", prompt] if prompt is not None else []), "-n", str(n),
                          "--temp", "0", "--json", *extra], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def stream(cl, prompt, n, result, key, timeout=30, extra=None, first=None):
    """Streaming completion; result[key] = (ids, text, finish, error, t_error); first[key]:
    when its first token arrived (first: a dict, or None)."""
    ids, text, finish, err = [], "", None, None
    try:
        c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=timeout)
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                "return_token_ids": True}
        body.update(extra or {})
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            result[key] = (ids, text, None, "http %d" % r.status, time.time())
            return
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                err = ev["error"].get("message", "error")
                break
            ch = ev["choices"][0]
            text += ch.get("text", "")
            ids += ch.get("token_ids") or []
            if ids and first is not None and key not in first:
                first[key] = time.time()
            finish = ch.get("finish_reason") or finish
        c.close()
    except Exception as e:  # a dropped connection is an error the client notices
        err = "exception: %r" % e
    result[key] = (ids, text, finish, err, time.time())


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    return bool(cond)


def case_equal():
    cl = Cluster(1, 1)
    ok = True
    for p in PROMPTS:
        ref = generate(p, 24)
        st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 24,
                                               "temperature": 0, "return_token_ids": True})
        got = json.loads(body)["choices"][0] if st == 200 else {}
        ok &= check(st == 200 and got.get("token_ids") == ref["output_ids"] and
                    got.get("text") == ref["text"],
                    "%r: %s vs generate %s" % (p, got.get("token_ids"), ref["output_ids"]))
    res = {}
    stream(cl, PROMPTS[0], 24, res, 0)
    ref = generate(PROMPTS[0], 24)
    ok &= check(res[0][0] == ref["output_ids"] and res[0][1] == ref["text"],
                "streaming ids and text equal generate's")
    # logprobs: token 1 comes from the prefill node, the rest from the decode node; each
    # must match tycho generate's (one process) for the same prompt
    ref = generate(PROMPTS[0], 8, extra=("--logprobs", "2"))
    st, body = cl.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 8,
                                           "temperature": 0, "logprobs": 2,
                                           "return_token_ids": True})
    lp = json.loads(body)["choices"][0].get("logprobs") or {} if st == 200 else {}
    got = lp.get("token_logprobs") or []
    want = [x["logprob"] for x in ref["logprobs"]]
    ok &= check(len(got) == len(want) and
                all(abs(a - b) < 1e-3 for a, b in zip(got, want)) and
                len((lp.get("top_logprobs") or [{}])[0]) == 2,
                "logprobs equal generate's, the first token's included: %s vs %s" %
                (got[:3], want[:3]))
    # the prefill node keeps full KV blocks after a request: the same long prompt again
    # reuses most of its KV (usage says how much), and the answer is still generate's
    long = " ".join(PROMPTS[:3] * 10)
    ref = generate(long, 16)
    cached = []
    for turn in range(2):
        st, body = cl.post("/v1/completions", {"prompt": long, "max_tokens": 16,
                                               "temperature": 0, "return_token_ids": True})
        b = json.loads(body) if st == 200 else {}
        ok &= check(st == 200 and b["choices"][0]["token_ids"] == ref["output_ids"],
                    "long prompt, turn %d: ids equal generate's" % turn)
        cached.append(b.get("usage", {}).get("prompt_tokens_details", {})
                      .get("cached_tokens", -1))
    n = len(ref["prompt_ids"])
    ok &= check(cached[0] == 0 and 0 < cached[1] < n,
                "cached prompt tokens: %s of %d (first, second turn)" % (cached, n))
    st, body = cl.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40,
                                           "temperature": 0, "stop": [" girl"]})
    want = generate("Once upon a time", 40)["text"].split(" girl")[0]
    ok &= check(st == 200 and json.loads(body)["choices"][0]["text"] == want and
                json.loads(body)["choices"][0]["finish_reason"] == "stop",
                "stop string cuts the text on the Conductor")
    return ok


def case_concurrent():
    cl = Cluster(2, 2)
    ok = True
    refs = {p: generate(p, 32) for p in PROMPTS}
    res, threads = {}, []
    for i in range(64):
        t = threading.Thread(target=stream, args=(cl, PROMPTS[i % len(PROMPTS)], 32, res, i))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(60)
    good = sum(1 for i in range(64) if i in res and res[i][3] is None and
               res[i][0] == refs[PROMPTS[i % len(PROMPTS)]]["output_ids"] and
               res[i][1] == refs[PROMPTS[i % len(PROMPTS)]]["text"])
    ok &= check(good == 64, "64 concurrent streams complete with generate's ids: %d" % good)
    for i in range(64):
        if i in res and (res[i][3] or res[i][0] != refs[PROMPTS[i % 20]]["output_ids"]):
            print("  stream %d: %s" % (i, res[i]))
            break
    logs = {n: open(cl.logs[n]).read() for n in ("conductor",)}
    ok &= check(logs["conductor"].count("registered:") >= 4, "4 nodes registered")
    return ok


def case_preempt():
    """A decode node reserves KV pages as answers grow, not prompt + max_tokens up front:
    12 answers of 120 tokens need ~96 pages of 16 tokens and the node has 24, so it runs more
    of them at once than a reservation would allow (one of 9 pages each: 2) and preempts the
    newest when the pool fills, recomputing it later. Every answer must still be generate's."""
    cl = Cluster(1, 1, decode_args=["--kv_pages=24"])
    ok = True
    n_tok = 120
    prompts = PROMPTS[:12]
    refs = {p: generate(p, n_tok, extra=("--ignore-eos",)) for p in prompts}
    res, threads = {}, []
    for i, p in enumerate(prompts):
        t = threading.Thread(target=stream, args=(cl, p, n_tok, res, i, 60,
                                                  {"ignore_eos": True}))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(90)
    good = [i for i, p in enumerate(prompts) if i in res and res[i][3] is None and
            res[i][0] == refs[p]["output_ids"] and res[i][2] == "length"]
    ok &= check(len(good) == len(prompts), "%d of %d answers equal generate's under preemption"
                % (len(good), len(prompts)))
    for i in range(len(prompts)):
        if i not in good:
            print("  stream %d: %s" % (i, res.get(i)))
            break
    end, node, total = time.time() + 5, 0, 0
    while time.time() < end and not (node > 0 and total > 0):
        m = cl.metrics()  # the decode node's count arrives with its next heartbeat
        node = m.get('tycho_node_preemptions_total{node="d0"}', 0)
        total = sum(v for k, v in m.items() if k.startswith("vllm:num_preemptions_total"))
        time.sleep(0.2)
    ok &= check(node > 0 and total == node,
                "preemptions counted: node d0 %d, cluster %d" % (node, total))
    st, body = cl.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 16,
                                           "temperature": 0, "return_token_ids": True})
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] ==
                generate(PROMPTS[0], 16)["output_ids"], "the node serves on afterwards")
    # 24 pages of 16 tokens hold less than one context: the node lowers its context to 384
    # tokens, registers it, and the Conductor (whose max_ctx is the model's) says so
    log = open(cl.logs["conductor"]).read()
    c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=10)
    c.request("GET", "/status")
    nodes = {n["id"]: n for n in json.loads(c.getresponse().read()).get("nodes", [])}
    ok &= check("node d0 holds sequences of at most 384 tokens" in log and
                nodes.get("d0", {}).get("max_ctx") == 384,
                "the decode node's smaller context is reported (status: %s)" %
                nodes.get("d0", {}).get("max_ctx"))
    return ok


def case_prefill_batch():
    """A prefill node runs the short prompts queued behind each other in one forward call
    (chunk_tokens 64 here: up to 64 prompt tokens per call), each prompt's KV going to the
    decode node and its first token sampled from its own row: 16 concurrent requests, twice
    (the second time with their full blocks in the page cache), every answer and first-token
    logprob equal to tycho generate's, and the node's log shows batches of several prompts.
    Prompts that start with the same block are not put in one call: 8 concurrent prompts
    sharing their first 16-token block compute it once, the other 7 find it cached."""
    cl = Cluster(1, 1, node_args=["--log_level=debug", "--chunk_tokens=64"])
    ok = True
    prompts = [p for p in PROMPTS if len(generate(p, 1)["prompt_ids"]) <= 16][:8]
    if len(generate(LONG_A, 1)["prompt_ids"]) <= 64:
        return check(False, "LONG_A should be longer than one call")
    prompts.append(LONG_A)  # longer than a call: runs alone, chunked
    refs = {p: generate(p, 6, extra=("--logprobs", "1")) for p in prompts}
    for rnd in range(2):
        res, threads = {}, []

        def one(i, prompt):
            st, body = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": 6,
                                                   "temperature": 0, "logprobs": 1,
                                                   "return_token_ids": True})
            res[i] = (st, json.loads(body)["choices"][0] if st == 200 else body)
        for i in range(16):
            t = threading.Thread(target=one, args=(i, prompts[i % len(prompts)]))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(60)
        good = 0
        for i in range(16):
            ref = refs[prompts[i % len(prompts)]]
            st, ch = res.get(i, (0, None))
            lp = (ch or {}).get("logprobs", {}).get("token_logprobs", []) if st == 200 else []
            if (st == 200 and ch["token_ids"] == ref["output_ids"] and len(lp) == 6 and
                    abs(lp[0] - ref["logprobs"][0]["logprob"]) < 1e-3):
                good += 1
            elif st:
                print("  round %d request %d: %s" % (rnd, i, str(ch)[:300]))
        ok &= check(good == 16, "round %d: 16 concurrent requests equal generate's ids and "
                    "first-token logprob: %d" % (rnd, good))
    head = generate(LONG_B, 1)["prompt_ids"][:16]  # not in the cache yet
    shared = [head + [300 + 7 * i + k for k in range(6)] for i in range(8)]
    want = [generate(None, 4, extra=("--prompt-ids", ",".join(map(str, s))))["output_ids"]
            for s in shared]
    res, threads = {}, []

    def ask_ids(i):
        st, body = cl.post("/v1/completions", {"prompt": shared[i], "max_tokens": 4,
                                               "temperature": 0, "return_token_ids": True})
        res[i] = (st, json.loads(body)["choices"][0]["token_ids"] if st == 200 else None,
                  cached_of(body) if st == 200 else -1)
    # the prefill node stopped while the 8 arrive: they are all queued when it goes on
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    for i in range(8):
        t = threading.Thread(target=ask_ids, args=(i,))
        t.start()
        threads.append(t)
    time.sleep(1.0)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    for t in threads:
        t.join(60)
    got = [res.get(i, (0, None, -1)) for i in range(8)]
    ok &= check(all(st == 200 and ids == want[i] for i, (st, ids, _) in enumerate(got)),
                "8 prompts sharing a first block: ids equal generate's")
    ok &= check(sorted(c for *_, c in got) == [0] + [16] * 7,
                "the shared block is computed once, the 7 others read it from the page cache: "
                "cached %s" % [c for *_, c in got])
    with open(cl.logs["p0"]) as f:
        sizes = [int(m) for m in re.findall(r"in a batch of (\d+)", f.read())]
    ok &= check(sizes and max(sizes) >= 2,
                "the prefill node ran several prompts per forward call (batch sizes %s)" %
                sorted(set(sizes)))
    return ok


def case_prefill_interleave():
    """A long prompt is computed in chunks of chunk_tokens (32 here), one forward call each, and
    a short prompt that arrives meanwhile joins the next call (in up to half of its tokens)
    instead of waiting for the long one's end: its answer comes first. Both answers equal
    generate's."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    mid = os.path.join(tmp, "mid.gguf")
    subprocess.run([TYCHO, "mkmodel", "--dims", "512,8,8,4,1536", "--vocab-from", MODEL,
                    "--out", mid], check=True, capture_output=True)
    cl = Cluster(1, 1, model=mid)
    ok = True
    # long enough to outlast the wait before the short prompt in every build (a 300-token one
    # took 1.1 s under ThreadSanitizer, less than that wait there); ~2.5 s here, ~6 s there
    n_long = 1500
    long_ids = [100 + (i * 37) % 400 for i in range(n_long)]
    short_ids = [300 + i for i in range(8)]
    want = {k: generate(None, 4, mid, ("--prompt-ids", ",".join(map(str, ids))))["output_ids"]
            for k, ids in (("long", long_ids), ("short", short_ids))}
    done = {}

    def ask(key, ids):
        st, body = cl.post("/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0,
                                               "return_token_ids": True}, timeout=120)
        got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else st
        done[key] = (time.time(), got)
    t0 = time.time()
    tl = threading.Thread(target=ask, args=("long", long_ids))
    tl.start()
    time.sleep(0.3)  # the long prompt is on its way (if the short one overtakes it, it still
    # finishes first: the assertion holds either way)
    ts = threading.Thread(target=ask, args=("short", short_ids))
    ts.start()
    tl.join(120)
    ts.join(120)
    ok &= check(done.get("long", (0, None))[1] == want["long"] and
                done.get("short", (0, None))[1] == want["short"],
                "both answers equal generate's (%s)" % {k: v[1] for k, v in done.items()})
    tlong, tshort = done.get("long", (0,))[0] - t0, done.get("short", (0,))[0] - t0
    ok &= check(0 < tshort < tlong, "the short prompt's answer came first: %.2f s vs the long "
                "one's %.2f s" % (tshort, tlong))
    return ok


def bad_stages(cl):
    """Malformed pipeline stages (PrefillAssign.stage, StageHidden) over raw RPC: errors that
    say what is wrong, and the node runs on."""
    ok = True
    p_rpc, _ = read_ports(cl.port_file("p1"), time.time() + 5)
    d_rpc, d_xfer = read_ports(cl.port_file("d0"), time.time() + 5)
    seg = "127.0.0.1:%d" % d_xfer
    msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN, prefill_assign(kv_destination(seg, [0, 1])))
    m = re.search(r"page bytes 0/(\d+)", msg)
    pb = int(m.group(1)) if m else 2048
    good = [(0x100000 + l * 0x100000, 0x180000 + l * 0x100000) for l in range(4)]
    dest = kv_destination(seg, [0, 1], pb, layers=good)

    def stage(lo, hi, s, n, nxt=""):
        return pb_bytes(11, pb_uint(1, lo) + pb_uint(2, hi) + pb_uint(3, s) + pb_uint(4, n) +
                        (pb_bytes(5, nxt.encode()) if nxt else b""))
    for what, st, want in [
            ("a group of one", stage(0, 4, 0, 1), "stage 0 of 1"),
            ("an empty range", stage(2, 2, 1, 2), "layers 2..2 for stage 1 of 2"),
            ("past the model", stage(2, 9, 1, 2), "layers 2..9"),
            ("a first stage past layer 0", stage(1, 2, 0, 2, "127.0.0.1:1"), "layers 1..2"),
            ("a last stage short of the end", stage(2, 3, 1, 2), "layers 2..3"),
            ("a last stage with a next node", stage(2, 4, 1, 2, "127.0.0.1:1"), "next_address"),
            ("a first stage without one", stage(0, 2, 0, 2), "next_address")]:
        msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN, prefill_assign(dest) + st)
        ok &= check(want in msg, "stage %s: %r" % (what, msg))
    sh = pb_uint(1, 7) + pb_uint(3, 0) + pb_uint(4, 1) + pb_uint(5, 7) + pb_bytes(6, b"\0" * 28)
    msg = rpc_error(p_rpc, METHOD_STAGE_HIDDEN, sh)
    ok &= check("StageHidden: 1 tokens of dim 7" in msg, "StageHidden of another dim: %r" % msg)
    sh = pb_uint(1, 7) + pb_uint(3, 0) + pb_uint(4, 2) + pb_uint(5, 128) + pb_bytes(6, b"\0" * 8)
    msg = rpc_error(p_rpc, METHOD_STAGE_HIDDEN, sh)
    ok &= check("in 8 bytes" in msg, "StageHidden shorter than its rows: %r" % msg)
    ok &= check(all(p.poll() is None for p in cl.procs.values()), "every node still runs")
    return ok


def cpp_stage_killed(model, args, ctx, long_ids, want_long, short_ids, want_short, ask):
    """A node of a 2-stage group killed while the long prompt is on it: the request either
    fails with an error (the first stage: its layers will not come) or is prefilled again on
    one node and gives one node's ids (the last stage: the usual re-arm); it never hangs, and
    the cluster then answers as before."""
    ok = True
    # the threshold from the cost model (threshold 0): a prompt past one chunk gains there
    conf = "max_ctx: %d\nrequest_timeout: 280s\npipeline:\n  stages: 2\n" % ctx
    cl = Cluster(4, 1, model=model, config=conf, node_args=args, hb_timeout="3s")
    st, body = get_status(cl.http, "/status")
    auto = json.loads(body).get("pipeline", {}).get("threshold", 0) if st == 200 else 0
    ok &= check(0 < auto < len(long_ids),
                "threshold from the cost model: %s tokens (the prompt: %d)" % (auto, len(long_ids)))
    res = {}

    def run():
        st, body = cl.post("/v1/completions", {"prompt": long_ids, "max_tokens": len(want_long),
                                               "temperature": 0, "return_token_ids": True},
                           timeout=280)
        res["r"] = (st, json.loads(body)["choices"][0]["token_ids"] if st == 200 else body)
    t = threading.Thread(target=run)
    t.start()
    busy, end = [], time.time() + 20
    while len(busy) < 2 and time.time() < end:
        busy = [k for k, n in status_nodes(cl).items()
                if n.get("role") == "prefill" and n.get("in_flight", 0) > 0]
        time.sleep(0.05)
    victim = busy[0] if busy else None
    if victim:
        cl.procs[victim].kill()
    t.join(280)
    st, out = res.get("r", (None, None))
    with open(cl.logs["conductor"]) as f:
        how = [w for w in ("pipeline stage on prefill node", "prefill sent again")
               if w in f.read()]
    ok &= check(len(busy) == 2 and not t.is_alive() and
                ((st == 200 and out == want_long) or (st is not None and st >= 400)),
                "stage node %s killed mid-prompt: %s (one node's ids %s; the Conductor: %s)" %
                (victim, (st, out if st == 200 else str(out)[:160]), want_long, how))
    short, _ = ask(cl, short_ids)
    ok &= check(short == want_short["output_ids"],
                "after the loss the cluster answers generate's ids (%s)" % short)
    cl.stop()
    return ok


def case_cpp():
    """Chunked pipeline parallelism: with pipeline.stages 2 or 4 the Conductor sends a long
    prompt through that many prefill nodes, each computing a range of the layers of every chunk
    and writing them to the decode node, the hidden states going from stage to stage; the
    answer is the one one node gives (a cluster with pipelining off) for a 16k-token prompt, and
    `tycho generate`'s for a prompt within the model's context. Under sanitizers: 2k tokens."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    model = os.path.join(tmp, "cpp.gguf")
    subprocess.run([TYCHO, "mkmodel", "--dims", "128,4,4,2,256", "--vocab-from", MODEL,
                    "--out", model], check=True, capture_output=True)
    n_long, n_short, chunk = (2048, 600, 256) if SLOW else (16384, 1500, 1024)
    ctx = n_long + 64
    pages = 2 * (ctx // 16 + 1)
    # every node: the same explicit context and KV budget (not the engine's default), 1 thread
    # (a loaded machine takes a minute or more over the one-node 16k prefill: the decode node
    # waits for the KV that long, and the Conductor does not take a busy node for dead)
    args = ["--max_ctx=%d" % ctx, "--kv_pages=%d" % pages, "--chunk_tokens=%d" % chunk,
            "--threads=1", "--max_batch_size=2", "--kv_wait_timeout=280s"]
    long_ids = [3 + (i * 37 + i // 7) % 500 for i in range(n_long)]
    short_ids = [3 + (i * 11 + 5) % 500 for i in range(n_short)]
    n_out = 8
    ok = True

    def ask(cl, ids):
        """(ids, logprobs) of the greedy answer: a stage's wrong hidden states or KV layers
        would move the logprobs even where the ids of a random model stay the same."""
        st, body = cl.post("/v1/completions", {"prompt": ids, "max_tokens": n_out,
                                               "temperature": 0, "return_token_ids": True,
                                               "logprobs": 1}, timeout=280)
        if st != 200:
            return (st, body[:300]), []
        ch = json.loads(body)["choices"][0]
        return ch["token_ids"], (ch.get("logprobs") or {}).get("token_logprobs") or []

    def same_lp(a, b):
        return 0 < len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b))

    want_short = generate(None, n_out, model, ("--prompt-ids", ",".join(map(str, short_ids)),
                                               "--logprobs", "1", "--batch-tokens", str(chunk)))
    got = {}
    for stages in (0, 2, 4):
        conf = "max_ctx: %d\nrequest_timeout: 280s\npipeline:\n  stages: %d\n  threshold: %d\n" % (
            ctx, stages, n_short // 2)
        cl = Cluster(4, 1, model=model, config=conf, node_args=args, hb_timeout="10s")
        t0 = time.time()
        got[stages] = ask(cl, long_ids)
        dt = time.time() - t0
        short, short_lp = ask(cl, short_ids)
        st, body = get_status(cl.http, "/status")
        status = json.loads(body) if st == 200 else {}
        pipe = status.get("pipeline", {})
        served = sorted(n.get("served", 0) for n in status.get("nodes", [])
                        if n.get("role") == "prefill")
        print("stages %d: %d-token prompt answered in %.1f s, %s" % (stages, n_long, dt,
                                                                   pipe), flush=True)
        ok &= check(short == want_short["output_ids"] and
                    same_lp(short_lp, [x["logprob"] for x in want_short["logprobs"]]),
                    "stages %d: %d-token prompt gives generate's ids and logprobs (%s vs %s)" %
                    (stages, n_short, short, want_short["output_ids"]))
        want_pipelined = 2 if stages else 0
        ok &= check(pipe.get("stages") == stages and pipe.get("requests") == want_pipelined,
                    "stages %d: the Conductor pipelined %s requests (status %s)" %
                    (stages, pipe.get("requests"), pipe))
        # a stage's pages hold some layers: no node caches a pipelined prompt's blocks, and
        # the scheduler's prefix index does not think one does (one node's does)
        blocks = status.get("scheduler", {}).get("index_blocks")
        ok &= check(blocks == 0 if stages else blocks > 0,
                    "stages %d: blocks in the scheduler's prefix index: %s" % (stages, blocks))
        # every stage of a group got the prompt: with 4 stages all 4 prefill nodes served both
        if stages == 4:
            ok &= check(len(served) == 4 and served[0] >= 2,
                        "stages 4: every prefill node took part (served %s)" % served)
            ok &= bad_stages(cl)
        cl.stop()
    ok &= cpp_stage_killed(model, args, ctx, long_ids, got[0][0], short_ids, want_short, ask)
    ok &= check(isinstance(got[0][0], list) and len(got[0][0]) == n_out,
                "one node: %d ids for the %d-token prompt (%s)" % (n_out, n_long, got[0][0]))
    for stages in (2, 4):
        ok &= check(got[stages][0] == got[0][0] and same_lp(got[stages][1], got[0][1]),
                    "%d stages: the %d-token prompt gives one node's ids and logprobs (%s vs "
                    "%s; %s vs %s)" % (stages, n_long, got[stages][0], got[0][0],
                                       got[stages][1][:3], got[0][1][:3]))
    return ok


def case_sliding_window():
    """A Mistral-style model (every layer attends to its last 32 tokens; mkmodel
    --sliding-window 32): prompts longer than the window and answers far past it, prefill and
    decode in separate nodes, give generate's ids (which release the pages before the window);
    the prefill node sends every page, and the decode node releases those before the window as
    the answer streams: during a 1,200-token answer it never holds more than a window's pages
    and two more (a user serving Mistral would see its KV memory bounded by the window)."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    swa = os.path.join(tmp, "swa.gguf")
    subprocess.run([TYCHO, "mkmodel", "--dims", "128,3,8,4,384", "--untied", "--sliding-window",
                    "32", "--vocab-from", MODEL, "--out", swa], check=True, capture_output=True)
    cl = Cluster(1, 1, model=swa)
    ok = True
    for n in (40, 90):
        ids = [100 + (i * 37 + n) % 400 for i in range(n)]
        want = generate(None, 64, swa, ("--prompt-ids", ",".join(map(str, ids)),
                                        "--ignore-eos"))["output_ids"]
        st, body = cl.post("/v1/completions", {"prompt": ids, "max_tokens": 64, "temperature": 0,
                                               "ignore_eos": True, "return_token_ids": True})
        got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else st
        ok &= check(got == want, "prompt of %d ids, 64 tokens: ids equal generate's (%s)" %
                    (n, "equal" if got == want else "%s vs %s" % (got, want)))
    # a long answer: the decode node's pages in use stay within the window (32 tokens: 2 pages
    # of 16, a third partly read, a fourth being filled, one reserved ahead), far under the
    # 78 pages its 1,240 tokens would take. (The prompt, 40 tokens past the window, arrives
    # whole: 3 pages until the first step releases what lies before the window.)
    ids = [100 + (i * 37) % 400 for i in range(40)]
    want = generate(None, 1200, swa, ("--prompt-ids", ",".join(map(str, ids)),
                                      "--ignore-eos"))["output_ids"]
    res, seen = {}, []
    t = threading.Thread(target=stream, args=(cl, ids, 1200, res, 0, 120,
                                              {"ignore_eos": True}))
    t.start()
    key = 'tycho_node_kv_pages{device="cpu:0",state="used"}'
    while t.is_alive():
        seen.append(node_metrics(cl, "d0").get(key, -1))
        time.sleep(0.02)
    t.join()
    got = res[0][0] if 0 in res else None
    ok &= check(got == want, "prompt of 40 ids, 1200 tokens streamed: ids equal generate's")
    ok &= check(seen and max(seen) >= 1 and max(seen) <= 5,
                "the decode node held at most 5 pages while streaming (max %s of %d samples)" %
                (max(seen) if seen else None, len(seen)))
    return ok


def case_moe():
    """A Qwen3-MoE model (mkmodel --arch qwen3moe: 8 experts, 2 per token), F32 and Q8_0
    (f16 KV pages, the 8-bit-input expert matmuls), prefill and decode in separate nodes: each
    prompt's ids equal generate's, alone, and with 8 streams decoding together (the decode
    node's batches route several sequences' tokens to each expert): all answered, and in F32
    all with generate's ids (moe_cluster says why not for Q8_0)."""
    return moe_cluster(["--arch", "qwen3moe"], ("f32", "q8_0"))


def case_gptoss():
    """gpt-oss (mkmodel --arch gpt-oss: attention sinks, even layers sliding over 8 tokens,
    YaRN, a biased router, biased SwiGLU-OAI experts), F32 and llama.cpp's MXFP4_MOE mix, as
    case_moe: prefill and decode nodes give generate's ids, alone and 8 streams together (the
    sliding layers' window passed within the 32 tokens). Seed 2: with seed 1 some of the 8
    streams part from generate's ids (a step of more than 8 rows, as the prefill node's batch
    of 8 prompts, multiplies Q8_0 matrices through dequantized f32 tiles instead of the
    8-bit-input path of a lone short prompt: a last-bit difference that can move a later
    8-bit input across a rounding step; see test_llamacpp_archs.mjs)."""
    return moe_cluster(["--arch", "gpt-oss", "--head-dim", "32", "--yarn", "4,64",
                        "--sliding-window", "8", "--seed", "2"], ("f32", "mxfp4_moe"))


def moe_cluster(arch_args, types):
    """case_moe's checks on mkmodel files of arch_args, one per type."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    ok = True
    for typ in types:
        moe = os.path.join(tmp, "moe-%s.gguf" % typ)
        subprocess.run([TYCHO, "mkmodel", *arch_args, "--dims", "128,3,8,4,384",
                        "--untied", "--type", typ, "--vocab-from", MODEL, "--out", moe],
                       check=True, capture_output=True)
        cl = Cluster(1, 1, model=moe)
        refs = {p: generate(p, 32, moe, ("--ignore-eos",)) for p in PROMPTS[:4]}
        for p in PROMPTS[:2]:
            st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 32,
                                                   "temperature": 0, "ignore_eos": True,
                                                   "return_token_ids": True})
            got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else st
            want = refs[p]["output_ids"]
            ok &= check(got == want and len(set(want)) >= 6,
                        "%s %r: ids equal generate's (%s)" %
                        (typ, p, "equal" if got == want else "%s vs %s" % (got, want)))
        res, threads = {}, []
        for i in range(8):
            t = threading.Thread(target=stream, args=(cl, PROMPTS[i % 4], 32, res, i, 30,
                                                      {"ignore_eos": True}))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(60)
        answered = sum(1 for i in range(8) if i in res and res[i][3] is None and
                       len(res[i][0]) == 32)
        good = sum(1 for i in range(8) if i in res and res[i][3] is None and
                   res[i][0] == refs[PROMPTS[i % 4]]["output_ids"])
        # F32: a batch changes only the order of f32 sums, far below any gap between logits,
        # so every stream is generate's. A quantized file's steps of more than 8 rows (the
        # prefill node's batch of 8 prompts) take the dense matrices through dequantized f32
        # tiles instead of the 8-bit-input path a lone short prompt takes: a last-bit
        # difference that now and then moves a later 8-bit input across a rounding step and
        # one stream off generate's ids (llama.cpp's batches differ from its single runs the
        # same way). There every stream must be answered in full; the lone requests above
        # already matched generate's ids exactly.
        ok &= check(answered == 8 and (typ != "f32" or good == 8),
                    "%s: 8 concurrent streams answered %d, with generate's ids %d" %
                    (typ, answered, good))
        cl.stop()
    return ok


def case_longctx():
    """Long context in the cluster: a model of 128k context (mkmodel --ctx 131072, a tiny shape)
    and a 32,000-token prompt (8,000 under sanitizers), prefill and decode in separate nodes,
    answers with the ids of tycho generate. The decode node's KV cache holds 40,960 tokens
    (10,240 under sanitizers), less than the model's context: the Conductor takes the least of
    its nodes' limits, so a prompt over it, and a prompt + max_tokens over the model's context,
    get a 400 naming the limits before anything is placed; the cluster answers the next one."""
    ctx, n_prompt, kv_pages = 131072, (8000 if SLOW else 32000), (160 if SLOW else 640)
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    model = os.path.join(tmp, "long.gguf")
    subprocess.run([TYCHO, "mkmodel", "--dims", "32,2,2,1,64", "--ctx", str(ctx), "--seed", "7",
                    "--vocab-from", "bytes", "--out", model], check=True, capture_output=True)
    ids = [3 + (i * 7919 + i // 256) % 256 for i in range(n_prompt)]
    idfile = os.path.join(tmp, "ids.txt")
    with open(idfile, "w") as f:
        f.write(",".join(map(str, ids)))
    want = generate(None, 8, model, ("--prompt-ids", "@" + idfile, "--ignore-eos",
                                     "--threads", "2"))["output_ids"]
    # the Conductor's CPU cost model counts attention FLOPs only; on this tiny shape (head_dim
    # 16) softmax and copies make a 32k prefill several times slower than predicted (a loaded
    # machine or a sanitizer slower still), past the KV deadline set at placement: with the
    # default node_answer_timeout the prefill node's progress reports keep it going
    cl = Cluster(1, 1, model=model,
                 node_args=("--chunk_tokens=512", "--kv_block_tokens=64", "--threads=2"),
                 decode_args=("--kv_pages=%d" % kv_pages,))
    ok = True
    t0 = time.time()
    st, body = cl.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                           "ignore_eos": True, "return_token_ids": True},
                       timeout=280)
    got = json.loads(body) if st == 200 else {}
    ok &= check(st == 200 and got["choices"][0]["token_ids"] == want and
                got["usage"]["prompt_tokens"] == n_prompt,
                "%d-token prompt answered in %.1f s with generate's ids (%s vs %s)" %
                (n_prompt, time.time() - t0, got and got["choices"][0]["token_ids"], want))

    def limit_error(st, body, *words):
        err = json.loads(body).get("error", {}) if st == 400 else {}
        msg = err.get("message", "")
        return (err.get("type") == "invalid_request_error" and
                err.get("code") == "context_length_exceeded" and
                all(str(w) in msg for w in words)), "%d %s" % (st, msg or body[:200])

    kv_tokens = kv_pages * 64
    good, msg = limit_error(*cl.post("/v1/completions", {"prompt": ids[:100], "max_tokens": ctx}))
    ok &= check(good and str(kv_tokens) in msg, "prompt + max_tokens over the context: " + msg)
    long_ids = (ids * 2)[:kv_tokens + 100]
    good, msg = limit_error(*cl.post("/v1/completions", {"prompt": long_ids, "max_tokens": 4},
                                     timeout=60), kv_tokens, kv_tokens + 100,
                            "the KV cache holds %d tokens" % kv_tokens, ctx)
    ok &= check(good, "a prompt over the decode node's KV cache: " + msg)
    st, body = cl.post("/v1/completions", {"prompt": ids[:200], "max_tokens": 4,
                                           "temperature": 0, "return_token_ids": True})
    ok &= check(st == 200 and len(json.loads(body)["choices"][0]["token_ids"]) == 4,
                "the cluster answers the next request (%d)" % st)
    return ok


def case_slow_prefill():
    """A prefill node far slower than the Conductor's cost model predicts (test hook
    TYCHO_TEST_SLOW_CHUNK_MS: every 32-token chunk takes 450 ms more) with node_answer_timeout
    2s and the decode node's kv_wait_timeout 1s: the prompt's ~6 s prefill outlasts both
    deadlines as set at placement, yet its node's progress reports (Heartbeat.prefill_progress)
    move the Conductor's KV deadline and the decode node's wait on, and the answer is tycho
    generate's. A node that hangs in the middle of the prompt (TYCHO_TEST_HANG_FORWARD) stops
    reporting progress: the request fails within node_answer_timeout and two chunks of its
    last progress, with the Conductor saying why."""
    long = " ".join(PROMPTS[:3] * 23)  # 437 tokens: 14 chunks
    ref = generate(long, 8)
    n_chunks = (len(ref["prompt_ids"]) + 31) // 32
    conf = "node_answer_timeout: 2s\n"
    ok = True
    slow = dict(os.environ, TYCHO_TEST_SLOW_CHUNK_MS="450")
    cl = Cluster(0, 0, config=conf)
    cl.start_node("prefill", "p0", env=slow)
    cl.start_node("decode", "d0", extra=["--kv_wait_timeout=1s"])
    cl.wait_nodes(2)
    t0 = time.time()
    st, body = cl.post("/v1/completions", {"prompt": long, "max_tokens": 8, "temperature": 0,
                                           "return_token_ids": True}, timeout=60)
    dt = time.time() - t0
    got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else body[:300]
    ok &= check(st == 200 and got == ref["output_ids"],
                "a %d-token prompt (%d slow chunks) answered in %.1f s with generate's ids "
                "(%s vs %s)" % (len(ref["prompt_ids"]), n_chunks, dt, got, ref["output_ids"]))
    ok &= check(dt > 5.0, "its prefill took far longer than node_answer_timeout + the "
                "decode node's kv_wait_timeout (%.1f s)" % dt)
    with open(cl.logs["d0"]) as f:
        dlog = f.read()
    ok &= check("KV did not arrive in time" not in dlog and
                "did not deliver the KV" not in open(cl.logs["conductor"]).read(),
                "neither the Conductor nor the decode node gave up on it")
    cl.stop()
    # the same node hangs in its 6th forward call: no progress from then on
    hang = dict(slow, TYCHO_TEST_HANG_FORWARD="6")
    cl = Cluster(0, 0, config=conf)
    cl.start_node("prefill", "p0", env=hang)
    cl.start_node("decode", "d0", extra=["--kv_wait_timeout=1s"])
    cl.wait_nodes(2)
    t0 = time.time()
    st, body = cl.post("/v1/completions", {"prompt": long, "max_tokens": 8, "temperature": 0},
                       timeout=60)
    dt = time.time() - t0
    ok &= check(cl.log_shows("p0", "TYCHO_TEST_HANG_FORWARD", 1),
                "the prefill node hung in the middle of the prompt")
    log = open(cl.logs["conductor"]).read()
    # 5 chunks (~2.3 s) went through, then the hang: failed 2 s + 2 chunks + a heartbeat later
    ok &= check(st == 503 and "did not deliver the KV in time" in log and 3.0 < dt < 8.0,
                "the hung prefill failed in %.1f s: %d %s" % (dt, st, body[:200]))
    cl.stop()
    return ok


def case_deepseek2():
    """A DeepSeek-V3-shaped model (mkmodel --arch deepseek2: MLA with a 64-wide latent + 16-wide
    rope part, a dense first layer, 8 sigmoid-routed experts in groups and a shared expert),
    F32 (f32 KV pages) and Q8_0 (f16 pages), prefill and decode in separate nodes: each prompt's
    ids equal generate's, and what the decode node received is the latent: per layer and token
    (kv_lora_rank + rope) elements, 80 x 4 or 2 bytes, for every whole page of 16 tokens."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    ok = True
    layers, latent, block = 3, 64 + 16, 16
    for typ, esize in (("f32", 4), ("q8_0", 2)):
        model = os.path.join(tmp, "ds2-%s.gguf" % typ)
        subprocess.run([TYCHO, "mkmodel", "--arch", "deepseek2", "--dims", "128,3,8,4,384",
                        "--head-dim", "32", "--untied", "--type", typ, "--vocab-from", MODEL,
                        "--out", model], check=True, capture_output=True)
        cl = Cluster(1, 1, model=model)
        want_bytes = 0
        for p in PROMPTS[:2]:
            ref = generate(p, 32, model, ("--ignore-eos",))
            st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 32,
                                                   "temperature": 0, "ignore_eos": True,
                                                   "return_token_ids": True})
            got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else st
            want = ref["output_ids"]
            ok &= check(got == want and len(set(want)) >= 6,
                        "%s %r: ids equal generate's (%s)" %
                        (typ, p, "equal" if got == want else "%s vs %s" % (got, want)))
            pages = (ref["n_prompt"] + block - 1) // block
            want_bytes += pages * block * layers * latent * esize
        dm, pm = node_metrics(cl, "d0"), node_metrics(cl, "p0")
        end = time.time() + 3  # the prefill node counts a handoff after its KvReady went out
        while time.time() < end and kv_bytes(pm, "sent", "local") != kv_bytes(dm, "received",
                                                                                "local"):
            time.sleep(0.1)
            dm, pm = node_metrics(cl, "d0"), node_metrics(cl, "p0")
        got_bytes = kv_bytes(dm, "received", "local")
        ok &= check(got_bytes == want_bytes,
                    "%s: the decode node received %s KV bytes, the latent of the prompts' pages "
                    "(%d per token and layer) is %d" % (typ, got_bytes, latent * esize,
                                                        want_bytes))
        cl.stop()
    return ok


RR_CONFIG = """
scheduler:
  policy: round_robin
"""


def case_kill_prefill():
    """A prefill node lost with prompts queued on it: they are sent again to another prefill
    node (the decode node still holds their pages and their streams are open), and every
    answer is still generate's. Lost by a kill (the connection drops), then by hanging (SIGSTOP:
    declared down after the heartbeat timeout); the hung node, resumed, must not disturb what
    runs on (it drops the jobs of the connection the Conductor closed).
    The state is arranged, not raced for: the Conductor places round robin (every node gets
    some of the 8 prompts, whatever the timing), the victim is stopped before the prompts come,
    and it is lost only once all 8 have been sent to prefill nodes (the nodes' `served` in
    /status), so that what is queued on it then is all it will ever get."""
    cl = Cluster(3, 1, config=RR_CONFIG, hb_timeout="3s")
    ok = True
    refs = {p: generate(p, 16)["output_ids"] for p in PROMPTS[:8]}

    def status_nodes():
        c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=10)
        c.request("GET", "/status")
        return {n["id"]: n for n in json.loads(c.getresponse().read()).get("nodes", [])}

    def sent_to_prefill(nodes):
        return sum(n.get("served", 0) for n in nodes.values() if n.get("role") == "prefill")

    def burst(victim, kill):
        sent0 = sent_to_prefill(status_nodes())
        cl.procs[victim].send_signal(signal.SIGSTOP)
        res, threads = {}, []
        for i, p in enumerate(PROMPTS[:8]):
            t = threading.Thread(target=stream, args=(cl, p, 16, res, i, 30))
            t.start()
            threads.append(t)
        # the stopped victim answers nothing: its in_flight only grows until all 8 are sent
        queued, sent, end = 0, 0, time.time() + 20
        while time.time() < end:
            nodes = status_nodes()
            v = nodes.get(victim, {})
            if v.get("alive"):
                queued = max(queued, v.get("in_flight", 0))
            sent = sent_to_prefill(nodes) - sent0
            if sent >= 8:
                break
            time.sleep(0.02)
        ok_sent = check(sent >= 8, "%s: all 8 prompts sent to prefill nodes before it was "
                        "lost (%d)" % (victim, sent))
        if kill:
            cl.procs[victim].send_signal(signal.SIGKILL)
            cl.procs[victim].wait()
        for t in threads:
            t.join(40)
        good = sum(1 for i, p in enumerate(PROMPTS[:8]) if res.get(i) and
                   res[i][3] is None and res[i][0] == refs[p])
        for i in range(8):
            if not (res.get(i) and res[i][3] is None and res[i][0] == refs[PROMPTS[i]]):
                print("  stream %d: %s" % (i, res.get(i)))
        return ok_sent, queued, good

    before = 0
    for victim, kill in (("p0", True), ("p1", False)):
        ok_sent, queued, good = burst(victim, kill)
        ok &= ok_sent
        how = "killed" if kill else "hung"
        ok &= check(queued >= 1, "%s: prompts were queued on it (%d)" % (victim, queued))
        ok &= check(good == 8, "%s %s: %d of 8 answers equal generate's" % (victim, how, good))
        retried = cl.metrics().get("tycho_prefill_retries_total", 0)
        ok &= check(8 >= retried - before >= queued,
                    "%s: prefills sent again: %d (queued there when it was lost: %d)"
                    % (victim, retried - before, queued))
        before = retried
    cl.procs["p1"].send_signal(signal.SIGCONT)  # the hung node comes back
    time.sleep(1.0)
    res, threads = {}, []
    for i, p in enumerate(PROMPTS[:8]):
        t = threading.Thread(target=stream, args=(cl, p, 16, res, i, 30))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(40)
    good = sum(1 for i, p in enumerate(PROMPTS[:8]) if res.get(i) and res[i][3] is None and
               res[i][0] == refs[p])
    ok &= check(good == 8, "after p1 resumed: %d of 8 answers equal generate's" % good)
    return ok


def case_kill_decode():
    # a random-weight model big enough (8 layers, d512) that 300-token streams last seconds
    # (60 tokens under a sanitizer: as many seconds there)
    n_long = 60 if SLOW else 300
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    mid = os.path.join(tmp, "mid.gguf")
    subprocess.run([TYCHO, "mkmodel", "--dims", "512,8,8,4,1536", "--vocab-from", MODEL,
                    "--out", mid], check=True, capture_output=True)
    cl = Cluster(1, 2, model=mid)
    ok = True
    ref = generate(PROMPTS[0], n_long, mid, ["--ignore-eos"])
    res, threads, first = {}, [], {}
    for i in range(8):  # long streams spread over both decode nodes (least-loaded)
        t = threading.Thread(target=stream, args=(cl, PROMPTS[0], n_long, res, i, 60,
                                                  {"ignore_eos": True}, first))
        t.start()
        threads.append(t)
    # every stream has tokens before the kill (300 take ~7 s here): the case is a decode node
    # lost mid-stream (a request a node had not started is placed again: the mute cases). A
    # fixed 3 s was not always enough on a loaded machine.
    end = time.time() + 20
    while len(first) < 8 and time.time() < end and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    time.sleep(0.5)
    victim = cl.procs["d0"]
    t_kill = time.time()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for t in threads:
        t.join(60)
    for i in range(8):
        r = res.get(i)
        print("  stream %d: %s" % (i, r and (len(r[0]), r[2], r[3], round(r[4] - t_kill, 2))))
    failed = [res[i] for i in range(8) if res.get(i) and res[i][3] is not None]
    done = [res[i] for i in range(8) if res.get(i) and res[i][3] is None]
    # a stream that had tokens from d0 ends with an error that says so; one that had none yet
    # is placed again on d1 and finishes
    replaced = open(cl.logs["conductor"]).read().count("placed again as")
    ok &= check(len(failed) + replaced >= 1, "the killed node's requests were failed (%d) or "
                "placed again (%d)" % (len(failed), replaced))
    ok &= check(all(f[4] - t_kill < 5 for f in failed), "errors within 5 s: %s" %
                [round(f[4] - t_kill, 2) for f in failed])
    ok &= check(all("decode node d0 went down" in f[3] for f in failed),
                "the errors say what failed: %s" % [f[3] for f in failed])
    ok &= check(len(done) >= 1 and all(d[0] == ref["output_ids"][:len(d[0])] and
                                       d[2] == "length" for d in done),
                "the other node's requests finish correctly (%d)" % len(done))
    time.sleep(2.0)  # beyond the heartbeat timeout: only d1 is used
    for i in range(6):
        st, body = cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8,
                                               "temperature": 0})
        ok &= check(st == 200, "request %d after the kill served (%d)" % (i, st))
    cl.start_node("decode", "d0")  # restart under the same node id
    end = time.time() + 15
    while time.time() < end and open(cl.logs["conductor"]).read().count(
            "node d0 registered") < 2:
        time.sleep(0.05)
    ok &= check(open(cl.logs["conductor"]).read().count("node d0 registered") >= 2,
                "d0 registered again after its restart")
    # with d1 gone too, requests can only succeed if the restarted d0 is used
    cl.procs["d1"].send_signal(signal.SIGKILL)
    cl.procs["d1"].wait()
    time.sleep(2.0)
    res2, threads = {}, []
    for i in range(6):
        t = threading.Thread(target=stream, args=(cl, PROMPTS[2], 16, res2, i, 30,
                                                  {"ignore_eos": True}))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(30)
    ref2 = generate(PROMPTS[2], 16, mid, ["--ignore-eos"])
    ok &= check(all(res2.get(i) and res2[i][3] is None and res2[i][0] == ref2["output_ids"]
                    for i in range(6)), "the restarted d0 serves requests correctly")
    return ok


def case_hung_decode():
    """A decode node that stops answering (SIGSTOP: socket open, no heartbeats) is taken out
    of routing within the heartbeat timeout and taken back after it resumes."""
    cl = Cluster(1, 2)
    ok = True
    cl.procs["d0"].send_signal(signal.SIGSTOP)
    t = time.time()
    while time.time() - t < 5 and "heartbeat timeout" not in open(cl.logs["conductor"]).read():
        time.sleep(0.05)
    ok &= check(time.time() - t < 1.5 + 0.5, "hung d0 marked down after %.2f s (timeout 1.5 s)"
                % (time.time() - t))
    codes = [cl.post("/v1/completions", {"prompt": "The cat", "max_tokens": 4}, 5)[0]
             for _ in range(6)]
    ok &= check(codes == [200] * 6, "requests go to d1 meanwhile: %s" % codes)
    cl.procs["d0"].send_signal(signal.SIGCONT)
    end = time.time() + 5
    while time.time() < end and open(cl.logs["conductor"]).read().count(
            "node d0 registered") < 2:
        time.sleep(0.05)
    ok &= check(open(cl.logs["conductor"]).read().count("node d0 registered") >= 2,
                "d0 registers again once it resumes")
    return ok


def breaker_state(cl, node):
    st, body = get_status(cl.http, "/status")
    for n in json.loads(body).get("nodes", []):
        if n["id"] == node:
            return n.get("breaker"), n.get("failed_in_a_row")
    return None, None


def mute_case(role):
    """A node that registers and heartbeats but never answers its requests (test hook
    TYCHO_TEST_MUTE_FILE: while the file exists its DecodeAssign / PrefillAssign calls are
    left unanswered): each client request that meets it costs one internal retry on the other
    node (after node_answer_timeout) and no error; within breaker_failures (3) failed requests
    its circuit breaker opens and it leaves placement; once it answers again a probe request
    puts it back."""
    cl = Cluster(1, 1, config="node_answer_timeout: 1s\nbreaker_open: 3s\n")
    mute = os.path.join(cl.dir, "mute")
    open(mute, "w").close()
    env = dict(os.environ, TYCHO_TEST_MUTE_FILE=mute)
    cl.start_node(role, "mute0", env=env)
    cl.wait_nodes(3)
    ok = True
    ref = generate(PROMPTS[1], 6)
    want = ref["text"] if "text" in ref else None
    t0 = time.time()
    lat, codes, texts, res = [], [], [], {}

    def one(i):
        t = time.time()
        st, body = cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 6,
                                               "temperature": 0, "return_token_ids": True}, 30)
        res[i] = (st, body, time.time() - t)

    # concurrent pairs, so that the scheduler spreads them over both nodes of the role, until
    # the node's breaker opened (the scheduler may prefer the other node for a while)
    for rnd in range(10):
        ths = [threading.Thread(target=one, args=(2 * rnd + k,)) for k in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(40)
        if rnd >= 3 and "node mute0 is out of placement" in open(cl.logs["conductor"]).read():
            break
    for i in sorted(res):
        st, body, dt = res[i]
        codes.append(st)
        lat.append(round(dt, 2))
        if st == 200:
            texts.append(json.loads(body)["choices"][0].get("token_ids"))
    print("  muted %s: codes %s, latencies %s" % (role, codes, lat))
    ok &= check(codes == [200] * len(codes), "every request answered 200 despite the muted node: %s"
                % codes)
    ok &= check(all(t == ref["output_ids"] for t in texts), "answers are the greedy reference")
    ok &= check(max(lat) < 1.0 + 6.0, "at most one internal retry each (latencies %s)" % lat)
    log = open(cl.logs["conductor"]).read()
    fails = log.count("node mute0 failed a request")
    ok &= check("node mute0 is out of placement" in log,
                "the muted node's circuit breaker opened")
    before_open = log[:log.find("node mute0 is out of placement")].count(
        "node mute0 failed a request")
    ok &= check(before_open <= 3, "it left placement within 3 failed requests (%d)" % before_open)
    ok &= check("placed again as" in log, "its requests were placed again elsewhere")
    m = cl.metrics()
    ok &= check(m.get("tycho_requests_replaced_total", 0) >= 1,
                "tycho_requests_replaced_total counts the re-placements")
    brk = [v for k, v in m.items() if k.startswith("tycho_node_breaker_state{") and
           'node="mute0"' in k]
    ok &= check(brk and brk[0] in (1, 2), "tycho_node_breaker_state of the node: %s" % brk)
    # out of placement: requests now go to the healthy node at once
    t = time.time()
    for _ in range(4):
        st, _b = cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 4}, 10)
        ok &= check(st == 200, "request with the node out of placement: %d" % st)
    ok &= check(time.time() - t < 4.0, "no request waits on the open node (%.2f s for 4)" %
                (time.time() - t))
    # it answers again: after breaker_open a request probes it and it is back
    os.unlink(mute)
    end = time.time() + 25
    while time.time() < end and "mute0 answered its probe" not in open(cl.logs["conductor"]).read():
        res.clear()
        ths = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(40)
        ok &= check(all(v[0] == 200 for v in res.values()), "requests while probing: %s" %
                    [v[0] for v in res.values()])
        time.sleep(0.3)
    ok &= check("mute0 answered its probe" in open(cl.logs["conductor"]).read(),
                "the node came back after answering a probe")
    ok &= check(breaker_state(cl, "mute0")[0] == "closed", "its breaker is closed again: %s" %
                (breaker_state(cl, "mute0"),))
    print("  %d failures counted, took %.1f s" % (fails, time.time() - t0))
    return ok


def case_mute_decode():
    return mute_case("decode")


def case_mute_prefill():
    return mute_case("prefill")


# ---- raw RPC (docs/arch/rpc.md) with a minimal protobuf encoder, for inputs no node sends ----

def pb_varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b, n = n & 0x7f, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def pb_uint(num, v):
    return pb_varint(num << 3) + pb_varint(v) if v else b""


def pb_bytes(num, b):
    return pb_varint(num << 3 | 2) + pb_varint(len(b)) + b


def pb_packed(num, vals):
    return pb_bytes(num, b"".join(pb_varint(v) for v in vals)) if vals else b""


def pb_fields(buf):
    """{field number: [value]} of a protobuf message (varints and length-delimited only)."""
    out, i = {}, 0

    def varint():
        nonlocal i
        v, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                return v
    while i < len(buf):
        key = varint()
        if key & 7 == 0:
            val = varint()
        elif key & 7 == 2:
            n = varint()
            val, i = buf[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % (key & 7))
        out.setdefault(key >> 3, []).append(val)
    return out


RPC_ERROR_KIND = 5


def cluster_secret():
    """The secret every daemon of the tests proves (TYCHO_CLUSTER_SECRET_FILE, set by CMake)."""
    path = os.environ.get("TYCHO_CLUSTER_SECRET_FILE")
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read().rstrip(b" \t\r\n")


def auth_handshake(sk, secret, expect_ok=True):
    """The client half of the cluster handshake (docs/arch/security.md), written from the
    protocol's description: 72-byte messages magic 'TYAU', version 1, type, flags (1: insecure),
    reason, nonce[32], mac[32]; mac = HMAC-SHA256(secret, label | nonce | nonce). Returns True
    when the server proved itself and accepted us; False when it refused or closed."""
    import hashlib
    import hmac

    def take(n):
        data = b""
        while len(data) < n:
            more = sk.recv(n - len(data))
            if not more:
                return None
            data += more
        return data
    ch = take(72)
    if ch is None or ch[:4] != b"TYAU" or ch[5] != 1:
        return False
    ns = ch[8:40]
    nc = os.urandom(32)
    if secret is None:
        msg = b"TYAU" + bytes([1, 2, 1, 0]) + nc + bytes(32)
    else:
        proof = hmac.new(secret, b"tycho-auth-1 client" + ns + nc, hashlib.sha256).digest()
        msg = b"TYAU" + bytes([1, 2, 0, 0]) + nc + proof
    sk.sendall(msg)
    ack = take(72)
    if ack is None or ack[5] != 3:
        return False
    want = hmac.new(secret or b"", b"tycho-auth-1 server" + nc + ns, hashlib.sha256).digest()
    return secret is None or hmac.compare_digest(ack[40:72], want)


def rpc_call(port, method, payload, rid=7, timeout=10, secret=None):
    """One request frame on a fresh connection, after the cluster handshake with `secret` (the
    tests' own when None); (kind, payload) of the first frame back."""
    with socket.create_connection(("127.0.0.1", port), timeout) as sk:
        if not auth_handshake(sk, secret if secret is not None else cluster_secret()):
            raise RuntimeError("cluster handshake refused")
        sk.sendall(struct.pack("<IBBHQI", 0x50525954, 1, 1, method, rid, len(payload)) + payload)

        def take(n):
            data = b""
            while len(data) < n:
                more = sk.recv(n - len(data))
                if not more:
                    raise RuntimeError("connection closed")
                data += more
            return data
        _, _, kind, _, _, n = struct.unpack("<IBBHQI", take(20))
        return kind, take(n)


def rpc_error(port, method, payload):
    """The message of the error frame a call gets ("" when it got something else)."""
    kind, body = rpc_call(port, method, payload)
    if kind != RPC_ERROR_KIND:
        return ""
    return pb_fields(body).get(2, [b""])[0].decode()


METHOD_PREFILL_ASSIGN, METHOD_DECODE_ASSIGN, METHOD_TOKEN_STREAM = 3, 4, 6
METHOD_STAGE_HIDDEN = 11


def kv_destination(segment, page_ids, page_bytes=0, stride=None, pool_pages=64, layers=(),
                   block_tokens=16):
    """A KvDestination: layers is a list of (k_base, v_base)."""
    ls = b"".join(pb_bytes(4, pb_uint(1, l) + pb_uint(4, k) + pb_uint(5, v))
                  for l, (k, v) in enumerate(layers))
    return (pb_bytes(1, b"d0") + pb_bytes(2, segment.encode()) + pb_packed(3, page_ids) + ls +
            pb_uint(5, block_tokens) + pb_uint(6, page_bytes) +
            pb_uint(7, page_bytes if stride is None else stride) + pb_uint(8, pool_pages))


def prefill_assign(dest, n_prompt=20, rid=7):
    return pb_uint(1, rid) + pb_packed(2, range(1, n_prompt + 1)) + pb_bytes(4, dest)


def proc_wakeups(pid):
    """Voluntary context switches of every thread of process pid, so far."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            pass  # the thread ended
    return total


def status_nodes(cl):
    c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=10)
    c.request("GET", "/status")
    nodes = {n["id"]: n for n in json.loads(c.getresponse().read()).get("nodes", [])}
    c.close()
    return nodes


def case_handshake():
    """One call to the decode node per request: its DecodeAssign is also its token stream
    (`rpc_calls` of the node in /status counts the Conductor's calls), and the decode node
    sleeps while its requests wait for their KV (KvReady wakes it: it does not poll); every
    answer is still generate's."""
    cl = Cluster(1, 1, hb_timeout="10s")
    ok = True
    refs = {p: generate(p, 12) for p in PROMPTS[:6]}
    before = status_nodes(cl)
    for p in PROMPTS[:3]:
        st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 12,
                                               "temperature": 0, "return_token_ids": True})
        ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] ==
                    refs[p]["output_ids"], "%r: plain answer equals generate's" % p)
    res = {}
    for i, p in enumerate(PROMPTS[3:5]):
        stream(cl, p, 12, res, i)
        ok &= check(res[i][3] is None and res[i][0] == refs[p]["output_ids"],
                    "%r: streamed answer equals generate's" % p)
    # the prefill node stopped: the decode node holds 4 requests waiting for their KV
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    threads = []
    for i in range(4):
        t = threading.Thread(target=stream, args=(cl, PROMPTS[5], 12, res, 10 + i, 30))
        t.start()
        threads.append(t)
    end, sent = time.time() + 10, 0
    while time.time() < end and sent < 4:  # sent to p0: the decode node reserved their pages
        sent = status_nodes(cl)["p0"]["served"] - before["p0"]["served"] - 5
        time.sleep(0.05)
    ok &= check(sent == 4, "4 requests wait at the decode node for their KV (%d)" % sent)
    pid = cl.procs["d0"].pid
    w0, t0 = proc_wakeups(pid), time.time()
    time.sleep(1.0)
    rate = (proc_wakeups(pid) - w0) / (time.time() - t0)
    # polling every millisecond was ~1000 wakeups a second; heartbeats and the transfer
    # engine's watchdog are ~10
    ok &= check(rate < 200, "the decode node sleeps while its requests wait for KV: %.0f "
                "wakeups/s" % rate)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    for t in threads:
        t.join(30)
    ok &= check(all(res.get(10 + i) and res[10 + i][3] is None and
                    res[10 + i][0] == refs[PROMPTS[5]]["output_ids"] for i in range(4)),
                "once the prefill node resumes their answers equal generate's: %s" %
                [res.get(10 + i, (None,))[0] for i in range(4)])
    after = status_nodes(cl)
    calls = {n: after[n]["rpc_calls"] - before[n]["rpc_calls"] for n in ("d0", "p0")}
    ok &= check(calls == {"d0": 9, "p0": 9}, "one call per request to each node, 9 requests: "
                "%s" % calls)
    return ok


def case_bad_destination():
    """A prefill node answers a malformed PrefillAssign (bad KV destination, undecodable) with
    an error that says what is wrong and keeps serving; a decode node refuses a DecodeAssign
    that is not a stream and the retired TokenStreamOpen."""
    cl = Cluster(1, 1)
    ok = True
    p_rpc, _ = read_ports(cl.port_file("p0"), time.time() + 5)
    d_rpc, d_xfer = read_ports(cl.port_file("d0"), time.time() + 5)
    seg = "127.0.0.1:%d" % d_xfer
    # the node's geometry, from its own answers to a destination that has none
    msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN, prefill_assign(kv_destination(seg, [0, 1])))
    m = re.search(r"page bytes 0/(\d+)", msg)
    ok &= check(m, "geometry refused: %r" % msg)
    pb = int(m.group(1)) if m else 2048
    msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN,
                    prefill_assign(kv_destination(seg, [0, 1], pb)))
    m = re.search(r"has 0 layers, the model (\d+)", msg)
    ok &= check(m, "layers refused: %r" % msg)
    n_layers = int(m.group(1)) if m else 5
    # low addresses, far below any memory a process registers (its heap and mappings)
    good = [(0x100000 + l * 0x100000, 0x180000 + l * 0x100000) for l in range(n_layers)]
    cases = [
        ("stride 0", kv_destination(seg, [0, 1], pb, stride=0, layers=good),
         "page_stride 0 is below page_bytes"),
        ("stride below the page", kv_destination(seg, [0, 1], pb, stride=pb - 1, layers=good),
         "is below page_bytes"),
        ("page id out of range", kv_destination(seg, [0, 99], pb, layers=good),
         "page_ids[1] = 99 is not a page of the destination (pool_pages 64)"),
        ("a page twice", kv_destination(seg, [3, 3], pb, layers=good), "page 3 appears twice"),
        ("too few pages", kv_destination(seg, [0], pb, layers=good),
         "1 page ids, the prompt needs 2"),
        ("no pool size", kv_destination(seg, [0, 1], pb, pool_pages=0, layers=good),
         "pool_pages is 0"),
        ("address overflow", kv_destination(seg, [0, 1], pb, layers=[((1 << 64) - 4096, 0)] +
                                            good[1:]), "overflow"),
        ("outside the segment", kv_destination(seg, [0, 1], pb, layers=good),
         "are outside segment %s's registered memory" % seg)]
    for what, dest, want in cases:
        msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN, prefill_assign(dest))
        ok &= check(want in msg, "%s: %r" % (what, msg))
    msg = rpc_error(p_rpc, METHOD_PREFILL_ASSIGN, b"\xff\xff\xff")
    ok &= check("undecodable" in msg, "undecodable PrefillAssign: %r" % msg)
    # a DecodeAssign that is not its request's stream, and TokenStreamOpen, are gone
    da = pb_uint(1, 5) + pb_uint(3, 3) + pb_packed(7, [1, 2, 3])
    msg = rpc_error(d_rpc, METHOD_DECODE_ASSIGN, da)
    ok &= check("TokenStreamOpen is gone" in msg, "DecodeAssign without stream: %r" % msg)
    msg = rpc_error(d_rpc, METHOD_TOKEN_STREAM, pb_uint(1, 5))
    ok &= check("no handler" in msg, "TokenStreamOpen: %r" % msg)
    ok &= check(cl.procs["p0"].poll() is None and cl.procs["d0"].poll() is None,
                "both nodes still run")
    ref = generate(PROMPTS[0], 16)
    st, body = cl.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 16,
                                           "temperature": 0, "return_token_ids": True})
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] ==
                ref["output_ids"], "the cluster serves on: the answer equals generate's")
    return ok


def port_try(port, secret, request):
    """Connect, run the cluster handshake with `secret` (None: as an insecure process), then send
    `request` whatever the handshake said. (proved, reply bytes): an unproven connection must be
    closed with nothing of the protocol answered."""
    with socket.create_connection(("127.0.0.1", port), 10) as sk:
        sk.settimeout(8)
        try:
            proved = auth_handshake(sk, secret)
        except OSError:
            proved = False
        data = b""
        try:
            sk.sendall(request)
            while len(data) < 20:
                more = sk.recv(4096)
                if not more:
                    break
                data += more
        except OSError:
            pass
        return proved, data


def rpc_frame(method, payload=b"", rid=9):
    return struct.pack("<IBBHQI", 0x50525954, 1, 1, method, rid, len(payload)) + payload


def xfer_hello(name=b"outsider"):
    """The transfer engine's HELLO (64-byte header, 'TYXF', type 1, addr = version 1)."""
    return struct.pack("<IBBHIIQQQQQQ", 0x46585954, 1, 0, 0, 0, 0, 0, 1, len(name), 0, 0,
                       0) + name


def case_auth():
    """Every cluster port (the Conductor's RPC, a node's RPC and transfer ports, the pool
    master's) refuses a peer without the cluster secret or with a wrong one, before any of its
    protocol: no registration, no pool listing or deletion, no region list from a transfer
    HELLO. With the secret each is served. A second process cannot take a live node's name;
    a restarted one gets it back. check-config refuses a missing or world-readable secret."""
    cl = Cluster(1, 1, kv_pool=True, hb_timeout="1500ms")
    ok = True
    good = cluster_secret()
    ok &= check(good is not None, "the tests run with a cluster secret")
    wrong = b"0123456789abcdef-not-the-secret"
    p_rpc, _ = read_ports(cl.port_file("p0"), time.time() + 5)
    d_rpc, d_xfer = read_ports(cl.port_file("d0"), time.time() + 5)
    ports = [("Conductor RPC (RegisterNode)", cl.rpc, rpc_frame(1), "rpc"),
             ("pool master (keys: list/delete)", cl.store_port(), rpc_frame(2003), "rpc"),
             ("pool master (put)", cl.store_port(), rpc_frame(2000), "rpc"),
             ("prefill RPC (PrefillAssign)", p_rpc, rpc_frame(3), "rpc"),
             ("decode transfer (HELLO: the region list)", d_xfer, xfer_hello(), "xfer")]
    before = cl.metrics().get("tycho_auth_failures_total", 0)
    for what, port, req, kind in ports:
        for label, sec in (("no secret", None), ("a wrong secret", wrong)):
            proved, data = port_try(port, sec, req)
            ok &= check(not proved and data == b"", "%s with %s: refused, nothing answered "
                        "(%d bytes)" % (what, label, len(data)))
        proved, data = port_try(port, good, req)
        if kind == "rpc":
            served = len(data) >= 20 and struct.unpack("<I", data[:4])[0] == 0x50525954 and \
                data[5] in (2, 5)
        else:
            served = len(data) >= 20 and struct.unpack("<I", data[:4])[0] == 0x46585954 and \
                data[4] == 2
        ok &= check(proved and served, "%s with the secret: served" % what)
    time.sleep(0.3)  # the tick that publishes the counter
    after = cl.metrics().get("tycho_auth_failures_total", 0)
    ok &= check(after - before >= 2, "the Conductor counts the refused handshakes on its "
                "port: %d" % (after - before))
    ok &= check(cl.log_shows("conductor", "cluster authentication failed", 0), "and logs them")

    # a second decode node under a live node's name is refused; the real one keeps serving
    ref = generate(PROMPTS[0], 12)
    cl.start_node("decode", "d0-impostor", extra=["--name=d0"])
    refused = cl.log_shows("d0-impostor", "is held by a live node")
    ok &= check(refused, "a second --name=d0 is refused: the name is held by a live node")
    time.sleep(2.0)  # past the heartbeat timeout: no flapping between the two
    m = cl.metrics()
    ok &= check(m.get("tycho_registrations_refused_total", 0) >= 1 and
                m.get('tycho_node_up{node="d0",role="decode"}') == 1,
                "counted (%s), and d0 stays up" % m.get("tycho_registrations_refused_total"))
    with open(cl.logs["conductor"]) as f:
        ok &= check("registered again" not in f.read(), "the real d0 was never evicted")
    st, body = cl.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12,
                                           "temperature": 0, "return_token_ids": True})
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == ref["output_ids"],
                "the cluster serves on: the answer equals generate's")
    # the real d0 dies: the impostor (a restart, as far as anyone can tell) gets the name
    cl.procs["d0"].kill()
    took = cl.log_shows("d0-impostor", "registered with the Conductor")
    ok &= check(took, "once d0 is gone its name is free: the new process registers")

    # check-config: the secret file is checked where the daemon would read it
    def cc(args, env):
        r = subprocess.run([TYCHO, "check-config", "--role", "decode",
                            "--model_path=" + MODEL, "--conductor_address=127.0.0.1:1", *args],
                           capture_output=True, text=True, env=env)
        return r.returncode, r.stdout + r.stderr
    env = dict(os.environ)
    loose = os.path.join(cl.dir, "loose.secret")
    with open(loose, "w") as f:
        f.write("0123456789abcdef0123456789abcdef\n")
    os.chmod(loose, 0o644)
    for what, args, want in (("missing", ["--cluster_secret_file=/nonexistent/secret"],
                              "cannot open"),
                             ("world-readable", ["--cluster_secret_file=" + loose], "chmod 600")):
        rc, out = cc(args, env)
        ok &= check(rc == 2 and "cluster_secret_file" in out and want in out,
                    "check-config, %s secret: exit %d %r" % (what, rc, out.strip()))
    bare = {k: v for k, v in env.items() if k != "TYCHO_CLUSTER_SECRET_FILE"}
    rc, out = cc([], bare)
    ok &= check(rc == 2 and "insecure: true" in out, "no secret and not insecure: exit %d %r" %
                (rc, out.strip()))
    rc, out = cc(["--insecure=true"], bare)
    ok &= check(rc == 0, "insecure: true is accepted: exit %d %r" % (rc, out.strip()))
    return ok


def proc_fds_rss(pid):
    """(open descriptors, resident KiB) of a process."""
    fds = len(os.listdir("/proc/%d/fd" % pid))
    with open("/proc/%d/status" % pid) as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return fds, rss


def case_flood():
    """10,000 half-open connections (connected, never a handshake) to each RPC port: the
    Conductor's, a prefill and a decode node's and the pool master's. Each daemon keeps serving
    meanwhile (an answer equal to generate's, the pool's stats), and once they close its
    descriptors and RSS come back to within 5% of their idle level."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cl = Cluster(1, 1, kv_pool=True, hb_timeout="5s")
    ok = True
    p_rpc, _ = read_ports(cl.port_file("p0"), time.time() + 5)
    d_rpc, _ = read_ports(cl.port_file("d0"), time.time() + 5)
    ref = generate(PROMPTS[1], 8)
    targets = [("conductor", cl.rpc), ("p0", p_rpc), ("d0", d_rpc), ("store", cl.store_port())]
    n = 10000 if hard >= 12000 else hard - 2000
    for name, port in targets:
        pid = cl.procs[name].pid
        # warm: one request through the cluster, so the idle level is a serving daemon's
        cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0})
        store_stats(cl)
        time.sleep(0.5)
        fd0, rss0 = proc_fds_rss(pid)
        socks, peak_fd, peak_rss = [], fd0, rss0
        t0 = time.time()
        for i in range(n):
            sk = socket.socket()
            sk.setblocking(False)
            sk.connect_ex(("127.0.0.1", port))
            socks.append(sk)
            if i % 1000 == 999:
                fd, rss = proc_fds_rss(pid)
                peak_fd, peak_rss = max(peak_fd, fd), max(peak_rss, rss)
        st, body = cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8,
                                               "temperature": 0, "return_token_ids": True},
                           timeout=30)
        served = st == 200 and json.loads(body)["choices"][0]["token_ids"] == ref["output_ids"]
        pool = store_stats(cl)
        ok &= check(served and "objects" in pool and cl.procs[name].poll() is None,
                    "%s: %d half-open connections in %.1f s; meanwhile the cluster answers as "
                    "generate does and the pool answers (peak %d descriptors, %d KiB; idle %d, "
                    "%d KiB)" % (name, n, time.time() - t0, peak_fd, peak_rss, fd0, rss0))
        for sk in socks:
            sk.close()
        end = time.time() + 15
        while True:
            fd1, rss1 = proc_fds_rss(pid)
            # a sanitizer's allocator keeps freed memory in quarantine: descriptors only there
            back = fd1 <= fd0 * 1.05 + 1 and (rss1 <= rss0 * 1.05 or SLOW)
            if back or time.time() > end:
                break
            time.sleep(0.25)
        ok &= check(back, "%s: after they closed: %d descriptors (idle %d), %d KiB (idle %d)" %
                    (name, fd1, fd0, rss1, rss0))
    ok &= check(cl.log_shows("conductor", "dropping connection", 0),
                "the Conductor logged what it dropped")
    return ok


def case_fence():
    """A prefill node hangs in the middle of a prompt's KV writes (SIGSTOP, after layer 2; test
    hook TYCHO_TEST_STOP_AFTER_LAYER), is given up after the heartbeat timeout and the prompt is
    prefilled again on another node. Resumed, it writes the rest of its layers as if nothing
    happened (over tcp): the decode node's write fence refuses every one of them and counts
    them, and every answer, then and after, equals generate's."""
    cl = Cluster(0, 1, hb_timeout="1500ms", node_args=["--transfer.transport=tcp"])
    ok = True
    refs = {p: generate(p, 16)["output_ids"] for p in PROMPTS[:4]}
    cl.start_node("prefill", "p0", env=dict(os.environ, TYCHO_TEST_STOP_AFTER_LAYER="2"))
    cl.wait_nodes(2)
    res = {}
    t = threading.Thread(target=stream, args=(cl, PROMPTS[0], 16, res, 0, 40))
    t.start()
    stopped = cl.log_shows("p0", "stops the process after layer 2")
    ok &= check(stopped, "p0 stopped in the middle of the prompt's KV writes")
    cl.start_node("prefill", "p1")
    cl.wait_nodes(3)
    t.join(40)
    ok &= check(res.get(0) and res[0][3] is None and res[0][0] == refs[PROMPTS[0]],
                "p0 given up, the prompt prefilled again on p1: the answer equals generate's "
                "(%s)" % (res.get(0),))
    before = node_metrics(cl, "d0").get("tycho_kv_writes_fenced_total", 0)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    end, fenced = time.time() + 10, 0
    while time.time() < end and fenced < 1:
        fenced = node_metrics(cl, "d0").get("tycho_kv_writes_fenced_total", 0) - before
        time.sleep(0.1)
    logged = cl.log_shows("d0", "is not a live assignment's", 0)
    ok &= check(fenced >= 1 and logged, "resumed, p0's late writes are refused by d0's fence "
                "and counted: %d (logged: %s)" % (fenced, logged))
    for i, p in enumerate(PROMPTS[:4]):
        st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 16,
                                               "temperature": 0, "return_token_ids": True})
        ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == refs[p],
                    "after: %r equals generate's" % p)
    return ok


# Two long prompts, each several 16-token blocks, that share nothing (different first block).
LONG_A = PROMPTS[18]
LONG_B = PROMPTS[19]


def cached_of(body):
    return json.loads(body).get("usage", {}).get("prompt_tokens_details", {}).get(
        "cached_tokens", -1)


def case_prefix_routing():
    """The live Conductor places each request with the KVCache-centric scheduler: a prompt
    seen before goes to the prefill node holding its blocks (least-in-flight routing sent
    every second request to the other, empty node), and its KV is reused there."""
    cl = Cluster(2, 1)
    ok = True
    n_a = len(generate(LONG_A, 1)["prompt_ids"])
    n_b = len(generate(LONG_B, 1)["prompt_ids"])
    seen = []
    for turn, prompt in enumerate([LONG_A, LONG_A, LONG_B, LONG_B, LONG_A, LONG_B]):
        st, body = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                               "temperature": 0})
        seen.append(cached_of(body) if st == 200 else -1)
    # full blocks of the prompt, the last token always computed
    want_a, want_b = (n_a - 1) // 16 * 16, (n_b - 1) // 16 * 16
    ok &= check(seen[0] == 0 and seen[2] == 0, "first sight of each prompt: nothing "
                "cached (%s)" % seen)
    ok &= check(seen[1] == want_a and seen[4] == want_a and seen[3] == want_b and
                seen[5] == want_b,
                "every repeat found all its full blocks on its prefill node: %s "
                "(want %d / %d)" % (seen, want_a, want_b))
    m = cl.metrics()
    ok &= check(decisions(m, "accepted") == 6,
                "the scheduler placed all 6 requests")
    blocks = m.get("tycho_scheduler_cached_blocks_total", 0)
    want = 2 * (n_a // 16) + 2 * (n_b // 16)  # each repeat: all its full blocks
    ok &= check(blocks == want, "the scheduler predicted that reuse: %s cached blocks "
                "(want %d)" % (blocks, want))
    return ok


PEER_CONFIG = """cost:
  refit: false
  prefill: [200000, 1000, 0]   # 200 ms per forward call: a muted request keeps p0 busy
node_answer_timeout: 6s
"""


def peer_case(stop_source):
    """Reuse from another prefill node's page cache (no KV pool). Turn 1 of a conversation is
    computed on p0; then p0 looks busy to the Conductor (a request it is muted on, test hook
    TYCHO_TEST_MUTE_FILE) and turn 2, which shares turn 1's full blocks, is planned on p1 with
    its prefix fetched from p0 (PrefillAssign.cached_prefix names p0). stop_source False: p1
    reads the blocks from p0's pinned pages through the transfer engine (usage cached_tokens,
    p1's peer fetch bytes, p0's pins, the Conductor's planned == used peer blocks). True: p0
    is stopped (SIGSTOP) first, its pin never comes, p1 computes the prompt after
    peer_fetch_timeout, and the Conductor's counters show the planned blocks unused. Either
    way the answer is tycho generate's."""
    cl = Cluster(0, 1, config=PEER_CONFIG, hb_timeout="20s",
                 node_args=["--log_level=debug", "--peer_fetch_timeout=500ms"])
    mute = os.path.join(cl.dir, "mute")
    cl.start_node("prefill", "p0", env=dict(os.environ, TYCHO_TEST_MUTE_FILE=mute))
    cl.wait_nodes(2)
    ok = True
    t1, t2 = LONG_A, LONG_A + " Then they went home."
    ids1, ref2 = generate(t1, 1)["prompt_ids"], generate(t2, 6)
    ids2 = ref2["prompt_ids"]
    common = 0
    while common < min(len(ids1), len(ids2)) and ids1[common] == ids2[common]:
        common += 1
    k = min(common // 16, (len(ids1) - 1) // 16, (len(ids2) - 1) // 16)
    st, body = cl.post("/v1/completions", {"prompt": t1, "max_tokens": 4, "temperature": 0})
    ok &= check(st == 200 and cached_of(body) == 0, "turn 1 on p0: %d, cached %s" %
                (st, cached_of(body) if st == 200 else body[:200]))
    cl.start_node("prefill", "p1")
    cl.wait_nodes(3)
    time.sleep(0.5)  # heartbeats: p0's blocks are indexed
    open(mute, "w").close()
    held = {}

    def muted():  # placed on p0 (ties go to the first node), left unanswered there
        held["r"] = cl.post("/v1/completions", {"prompt": LONG_B, "max_tokens": 2,
                                                "temperature": 0}, timeout=40)
    th = threading.Thread(target=muted)
    th.start()
    ok &= check(cl.log_shows("p0", "is left unanswered", 10), "p0 holds a request (muted)")
    if stop_source:
        cl.procs["p0"].send_signal(signal.SIGSTOP)
    m0, n0 = cl.metrics(), node_metrics(cl, "p1")
    t = time.time()
    st, body = cl.post("/v1/completions", {"prompt": t2, "max_tokens": 6, "temperature": 0,
                                           "return_token_ids": True})
    took = time.time() - t
    if stop_source:
        cl.procs["p0"].send_signal(signal.SIGCONT)
    os.unlink(mute)
    got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else body[:300]
    ok &= check(st == 200 and got == ref2["output_ids"],
                "turn 2 answered as tycho generate does: %d %s" % (st, got))
    # the prefill node's reply (what it reused) may come after the answer's last token
    end = time.time() + 5
    while True:
        m, n1 = cl.metrics(), node_metrics(cl, "p1")
        if m.get('tycho_prefix_planned_blocks_total{source="peer"}', 0) > \
                m0.get('tycho_prefix_planned_blocks_total{source="peer"}', 0) or time.time() > end:
            break
        time.sleep(0.05)
    log = open(cl.logs["p1"]).read()

    def delta(name, mm=m, mb=m0):
        return mm.get(name, 0) - mb.get(name, 0)
    planned = delta('tycho_prefix_planned_blocks_total{source="peer"}')
    used = delta('tycho_prefix_used_blocks_total{source="peer"}')
    failed = delta("tycho_prefix_fetch_failed_blocks_total")
    peer_bytes = sum(n1.get('tycho_node_peer_fetch_bytes_total{transport="%s"}' % x, 0) -
                     n0.get('tycho_node_peer_fetch_bytes_total{transport="%s"}' % x, 0)
                     for x in ("tcp", "local", "rdma", "cuda_ipc"))
    read = delta('tycho_node_peer_fetch_blocks_total{result="read"}', n1, n0)
    nfail = delta('tycho_node_peer_fetch_blocks_total{result="failed"}', n1, n0)
    print("  %d shared blocks; turn 2 in %.2f s: cached %s, planned %d peer blocks, used %d, "
          "failed %d; p1 read %d blocks (%d bytes), failed %d" %
          (k, took, cached_of(body) if st == 200 else "-", planned, used, failed, read,
           peer_bytes, nfail))
    ok &= check(k >= 3, "turn 2 shares %d full blocks with turn 1 (want >= 3)" % k)
    ok &= check(planned == k, "the Conductor planned turn 2's %d blocks from p0's cache (%d)"
                % (k, planned))
    st_s, sbody = get_status(cl.http, "/status")
    plan = json.loads(sbody).get("scheduler", {}).get("prefix_plan", {})
    if not stop_source:
        ok &= check(cached_of(body) == 16 * k, "usage cached_tokens %s = the %d blocks read "
                    "from p0" % (cached_of(body) if st == 200 else "-", k))
        ok &= check(used == k and failed == 0, "the Conductor: %d peer blocks used of %d "
                    "planned, %d failed" % (used, planned, failed))
        ok &= check(read == k and peer_bytes > 0, "p1 read %d blocks (%d bytes) from p0's "
                    "cache" % (read, peer_bytes))
        pins = node_metrics(cl, "p0").get('tycho_node_peer_pins_total{result="pinned"}', 0)
        ok &= check(pins >= 1, "p0 pinned the blocks for p1's read (%d pins)" % pins)
        ok &= check(plan.get("used_blocks", {}).get("peer") == plan.get("planned_blocks", {}).get(
            "peer") == k and plan.get("used_ratio", {}).get("peer") == 1.0,
            "/status scheduler.prefix_plan: %s" % plan)
        ok &= check("pin request to peer" not in log, "no failed pin on p1")
    else:
        ok &= check(cached_of(body) == 0, "nothing reused: cached_tokens %s" %
                    (cached_of(body) if st == 200 else "-"))
        ok &= check(used == 0 and failed == k, "the Conductor's counters show the miss: %d of "
                    "%d planned peer blocks used, %d failed" % (used, planned, failed))
        ok &= check(read == 0 and nfail == k and peer_bytes == 0,
                    "p1 counted %d failed peer blocks, read %d" % (nfail, read))
        ok &= check("pin request to peer" in log, "p1 logged the failed pin at debug")
        ok &= check(plan.get("used_ratio", {}).get("peer") == 0.0 and
                    plan.get("fetch_failed_blocks") == k, "/status scheduler.prefix_plan: %s"
                    % plan)
    th.join(40)
    ok &= check(held.get("r", (0,))[0] == 200, "the muted request was placed again and "
                "answered: %s" % (held.get("r", (0,))[0],))
    return ok


def case_peer_fetch():
    return peer_case(False)


def case_peer_fetch_miss():
    return peer_case(True)


def case_cache_events():
    """A prefill node tells the Conductor which blocks its page cache evicted: with room for
    only 12 pages, after many distinct prompts the Conductor's prefix index holds no more
    blocks than the node can (without the node's events it would keep all of them), and a
    prompt whose blocks were evicted is predicted uncached."""
    cl = Cluster(1, 1, node_args=["--kv_pages=12"])
    ok = True
    prompts = ["%s %s" % (w, LONG_A) for w in
               ["Red.", "Blue.", "Green.", "Gold.", "Pink.", "Gray."]]
    for p in prompts:
        st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 2,
                                               "temperature": 0})
        ok &= check(st == 200, "distinct prompt served (%d)" % st)
    blocks = None
    deadline = time.time() + 5
    while time.time() < deadline:  # heartbeats every 200 ms carry the events
        blocks = cl.metrics().get("tycho_scheduler_index_blocks")
        if blocks is not None and blocks <= 12:
            break
        time.sleep(0.2)
    ok &= check(blocks is not None and 0 < blocks <= 12,
                "prefix index follows the node's 12-page cache (%s blocks indexed; %d "
                "prompts of >= 3 blocks went through)" % (blocks, len(prompts)))
    # the first prompt's blocks were evicted long ago: computed again, nothing reused,
    # and the scheduler knew it (it predicted no cached block)
    before = cl.metrics().get("tycho_scheduler_cached_blocks_total", 0)
    st, body = cl.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 2,
                                           "temperature": 0})
    after = cl.metrics().get("tycho_scheduler_cached_blocks_total", 0)
    ok &= check(st == 200 and cached_of(body) == 0 and after == before,
                "evicted prompt is recomputed (cached %s) and was predicted so (%s "
                "blocks)" % (cached_of(body), after - before))
    return ok


SLO_CONFIG = """
scheduler:
  admission: predicted
  models:
    - name: stories260K
      slo:
        - {class: default, ttft: 300ms, tbt: 0s}
        - {class: flex, ttft: 10s, tbt: 0s}
cost:
  refit: false
  prefill: [1000, 10000, 0]   # 1 ms + 10 ms per uncached token: a 50-token prompt is 0.5 s
"""


def case_slo_reject():
    """Admission at arrival: while a prefill node has a queue, a request whose predicted TTFT
    breaks its class's TTFT SLO is refused with 429, an OpenAI-shaped error naming the reason
    and, its prefill alone being over the SLO too, x-should-retry: false instead of a
    Retry-After (case overload_answers: one refused for the queue only gets Retry-After),
    before any work is done; on an idle node the same request is served
    best-effort (refusing could never help it); a laxer class (service_tier) is admitted; the
    Conductor keeps serving."""
    cl = Cluster(1, 1, config=SLO_CONFIG, hb_timeout="10s")
    ok = True
    probe = "Blue. " + LONG_A  # shares no block with LONG_A: nothing of it is cached
    st, _ = cl.post("/v1/completions", {"prompt": LONG_B, "max_tokens": 4,
                                        "temperature": 0})
    ok &= check(st == 200, "alone on an idle node a long prompt is served (%d)" % st)
    # hold the prefill node so that the next request's predicted work stays queued there
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    res = {}
    t = threading.Thread(target=lambda: res.update(
        flex=cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 4,
                                         "temperature": 0, "service_tier": "flex"})))
    t.start()
    time.sleep(0.1)  # placed: ~0.5 s of predicted prefill queued on p0
    hdr = {}
    st, body = cl.post("/v1/completions", {"prompt": probe, "max_tokens": 4,
                                           "temperature": 0}, headers=hdr)
    stream(cl, probe, 4, res, "stream")
    cl.procs["p0"].send_signal(signal.SIGCONT)
    t.join(30)
    err = json.loads(body).get("error", {}) if body else {}
    ok &= check(st == 429 and err.get("code") == "ttft_slo" and
                err.get("type") == "rate_limit_exceeded" and "SLO" in err.get("message", ""),
                "long prompt behind a queue refused: %d %s" % (st, err))
    ok &= check(hdr.get("x-should-retry") == "false" and "retry-after" not in hdr,
                "over the SLO even alone: x-should-retry: false, no Retry-After (%s)" % hdr)
    ok &= check(res["stream"][3] == "http 429", "streamed long prompt refused before the "
                "stream (%s)" % (res["stream"][3],))
    ok &= check(res.get("flex", (0,))[0] == 200,
                "the same prompt in service_tier flex (TTFT SLO 10 s) was admitted and "
                "served once the node resumed (%s)" % (res.get("flex", (None,))[0],))
    st, body = cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 4,
                                           "service_tier": "gold"})
    ok &= check(st == 400 and json.loads(body)["error"]["param"] == "service_tier",
                "unknown service_tier is a 400 naming it (%d)" % st)
    ref = generate("The cat", 8)
    st, body = cl.post("/v1/completions", {"prompt": "The cat", "max_tokens": 8,
                                           "temperature": 0, "return_token_ids": True})
    got = json.loads(body)["choices"][0]["token_ids"] if st == 200 else None
    ok &= check(got == ref["output_ids"], "short prompt served as generate does (%d)" % st)
    m = cl.metrics()
    ok &= check(decisions(m, "ttft") == 2 and
                decisions(m, "accepted") == 3 and
                m.get("tycho_scheduler_admitted_over_slo_total") == 1,
                "decisions counted by reason (ttft %s, accepted %s, over SLO on an idle "
                "node %s)" % (decisions(m, "ttft"),
                              decisions(m, "accepted"),
                              m.get("tycho_scheduler_admitted_over_slo_total")))
    ok &= check(m.get('tycho_scheduler_cost_coefficient{stage="prefill",term="1"}') == 10000,
                "the configured cost model is the one in use (refit off)")
    return ok


BATCH_SLO_CONFIG = """
scheduler:
  models:
    - name: stories260K
      slo:
        - {class: default, ttft: 1s, tbt: 0s}
cost:
  refit: false
  prefill: [200000, 1000, 0]   # 200 ms per forward call + 1 ms per uncached token
"""


def case_batch_admission():
    """The Conductor knows that a prefill node runs the short prompts queued behind each
    other in one forward call (it registers prefill_batch): 10 short prompts arriving at
    once behind a held node are predicted to need 3 calls, not 10 prompts' worth of fixed
    cost, so a 1 s TTFT SLO admits all of them (one prompt at a time, 200 ms each, the 5th
    would be predicted over it and refused). The node's calls of several prompts are timing
    samples for the cost model (one per call)."""
    cl = Cluster(1, 1, config=BATCH_SLO_CONFIG, hb_timeout="10s",
                 node_args=["--log_level=debug", "--chunk_tokens=128"])
    ok = True
    N = 10  # the node's debug line per prompt is rate-limited past 10 a second
    prompts = [p for p in PROMPTS if len(generate(p, 1)["prompt_ids"]) <= 16][:6]
    refs = {p: generate(p, 3)["output_ids"] for p in prompts}
    time.sleep(0.5)  # the nodes' first heartbeats: nothing queued anywhere
    m0 = cl.metrics()
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    res, threads = {}, []

    def one(i):
        st, body = cl.post("/v1/completions", {"prompt": prompts[i % len(prompts)],
                                               "max_tokens": 3, "temperature": 0,
                                               "return_token_ids": True})
        res[i] = (st, json.loads(body)["choices"][0]["token_ids"] if st == 200 else body)
    for i in range(N):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    time.sleep(1.0)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    for t in threads:
        t.join(60)
    got = [res.get(i, (0, None)) for i in range(N)]
    bad = [(i, st, str(b)[:200]) for i, (st, b) in enumerate(got)
           if st != 200 or b != refs[prompts[i % len(prompts)]]]
    ok &= check(not bad, "%d short prompts behind a held node: all admitted and answered as "
                "generate does (%s)" % (N, bad))
    time.sleep(0.6)  # three heartbeats: the calls' timing samples
    m = cl.metrics()
    acc = decisions(m, "accepted") - \
        decisions(m0, "accepted")
    ttft = decisions(m, "ttft")
    ok &= check(acc == N and ttft == 0, "decisions: %d accepted, %d refused for TTFT" %
                (acc, ttft))
    with open(cl.logs["p0"]) as f:
        sizes = [int(x) for x in re.findall(r"in a batch of (\d+)", f.read())]
    calls = round(sum(1.0 / n for n in sizes))
    samples = m.get('tycho_scheduler_cost_samples_total{stage="prefill"}', 0) - \
        m0.get('tycho_scheduler_cost_samples_total{stage="prefill"}', 0)
    ok &= check(sizes and max(sizes) >= 2 and samples == calls,
                "one prefill timing sample per forward call, several prompts per call: %d "
                "samples, %d calls (batch sizes %s)" % (samples, calls, sorted(sizes)))
    return ok


def case_slo_reload():
    """An operator retunes the SLOs of a running Conductor: the new config file and a SIGHUP.
    A long prompt refused behind a queue under a 300 ms TTFT SLO is admitted once the SLO is
    60 s, with nothing restarted; the SLOs in force are on /metrics; a class renamed away
    leaves the output; a broken file is refused with a log line and the running settings
    stay."""
    cl = Cluster(1, 1, config=SLO_CONFIG, hb_timeout="10s")
    ok = True
    path = os.path.join(cl.dir, "conductor.yaml")
    key = 'tycho_scheduler_slo_seconds{class="%s",slo="%s"}'
    m = cl.metrics()
    ok &= check(m.get(key % ("default", "ttft")) == 0.3 and m.get(key % ("flex", "ttft")) == 10,
                "SLOs in force on /metrics: default %s s, flex %s s" %
                (m.get(key % ("default", "ttft")), m.get(key % ("flex", "ttft"))))
    probe = "Blue. " + LONG_A

    def held_probe():
        """The probe's status while p0 holds LONG_A's predicted work."""
        cl.procs["p0"].send_signal(signal.SIGSTOP)
        res = {}
        t = threading.Thread(target=lambda: res.update(
            first=cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 2,
                                              "temperature": 0, "service_tier": "flex"})))
        t.start()
        time.sleep(0.2)
        out = {}
        t2 = threading.Thread(target=lambda: out.update(
            probe=cl.post("/v1/completions", {"prompt": probe, "max_tokens": 2,
                                              "temperature": 0})))
        t2.start()
        time.sleep(0.3)
        cl.procs["p0"].send_signal(signal.SIGCONT)
        t.join(30)
        t2.join(30)
        return out.get("probe", (0,))[0], res.get("first", (0,))[0]

    def reload(text, want):
        with open(path, "w") as f:
            f.write(text)
        cl.procs["conductor"].send_signal(signal.SIGHUP)
        end = time.time() + 10
        while time.time() < end:
            if cl.metrics().get(key % want[0]) == want[1]:
                return True
            time.sleep(0.1)
        return False

    st, first = held_probe()
    ok &= check(st == 429 and first == 200, "under a 300 ms TTFT SLO the probe behind a queue "
                "is refused (%d; queued request %d)" % (st, first))
    ok &= check(reload(SLO_CONFIG.replace("ttft: 300ms", "ttft: 60s"), (("default", "ttft"), 60)),
                "SIGHUP with a 60 s TTFT SLO: in force within 10 s")
    st, first = held_probe()
    ok &= check(st == 200 and first == 200, "the same probe behind the same queue is admitted "
                "after the reload (%d; queued request %d)" % (st, first))
    renamed = SLO_CONFIG.replace("ttft: 300ms", "ttft: 60s").replace("class: flex",
                                                                      "class: batch")
    ok &= check(reload(renamed, (("batch", "ttft"), 10)), "class flex renamed to batch")
    m = cl.metrics()
    ok &= check(key % ("flex", "ttft") not in m and not decisions(m, "accepted", "flex") and
                decisions(m, "ttft", "default") == 1 and
                decisions(m, "accepted", "default") == 1,
                "the class renamed away left /metrics; the default class's decisions went on "
                "counting across the reloads (refused %s, accepted %s)" %
                (decisions(m, "ttft", "default"), decisions(m, "accepted", "default")))
    dup = SLO_CONFIG.replace("ttft: 300ms", "ttft: 60s").replace("class: flex", "class: default")
    with open(path, "w") as f:
        f.write(dup)
    cl.procs["conductor"].send_signal(signal.SIGHUP)
    time.sleep(0.5)
    ok &= check(key % ("batch", "ttft") in cl.metrics(),
                "two classes of one name are refused; the running ones stay")
    with open(path, "w") as f:
        f.write("scheduler:\n  admission: [not, an, enum]\n")
    cl.procs["conductor"].send_signal(signal.SIGHUP)
    time.sleep(0.5)
    m = cl.metrics()
    with open(cl.logs["conductor"]) as f:
        log = f.read()
    ok &= check(m.get(key % ("default", "ttft")) == 60 and "reload failed" in log,
                "a broken file is refused (logged) and the running SLOs stay")
    st, _ = cl.post("/v1/completions", {"prompt": "The cat", "max_tokens": 2})
    ok &= check(st == 200 and cl.procs["conductor"].poll() is None,
                "the Conductor goes on serving (%d)" % st)
    return ok


# SLO_CONFIG with its second class renamed batch (60 s), and keys: one open, two bound to a class
CLASS_CONFIG = """
api_keys: [sk-open]
api_key_classes:
  - {key: sk-batch, class: batch}
  - {key: sk-fast, class: default}
""" + SLO_CONFIG.replace("{class: flex, ttft: 10s", "{class: batch, ttft: 60s")


def case_slo_class():
    """A request picks any SLO class the operator configured by name (`slo_class`, Tycho's
    extension), an API key bound to a class serves every request of its holder in that class
    whatever the request asks for, and a class that does not exist is a 400 naming the ones
    that do (before any work). Behind a held prefill node a long prompt is refused in the
    300 ms class and admitted in the 60 s one."""
    cl = Cluster(1, 1, config=CLASS_CONFIG, hb_timeout="10s")
    ok = True
    body = {"prompt": "The cat", "max_tokens": 2, "temperature": 0}
    st, _ = cl.post("/v1/completions", body)
    ok &= check(st == 401, "no key: 401 (%d)" % st)
    st, raw = cl.post("/v1/completions", dict(body, slo_class="gold"), key="sk-open")
    err = json.loads(raw).get("error", {}) if raw else {}
    ok &= check(st == 400 and err.get("param") == "slo_class" and
                err.get("code") == "unknown_slo_class" and "default, batch" in
                err.get("message", ""), "unknown class: 400 naming the classes (%d %s)" %
                (st, err))
    st, raw = cl.post("/v1/completions", dict(body, slo_class=7), key="sk-open")
    ok &= check(st == 400 and json.loads(raw)["error"]["param"] == "slo_class",
                "a class that is not a string: 400 (%d)" % st)
    probe = dict(body, prompt="Blue. " + LONG_A)
    # hold the prefill node with a long prompt's predicted work queued on it
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    res = {}
    t = threading.Thread(target=lambda: res.update(first=cl.post(
        "/v1/completions", dict(body, prompt=LONG_A), key="sk-batch")))
    t.start()
    time.sleep(0.2)
    runs = {"open, no class": ("sk-open", None), "open, slo_class batch": ("sk-open", "batch"),
            "sk-batch, no class": ("sk-batch", None),
            "sk-fast, slo_class batch": ("sk-fast", "batch")}
    threads = []
    for name, (k, c) in runs.items():
        b = dict(probe, slo_class=c) if c else probe
        th = threading.Thread(target=lambda n=name, k=k, b=b: res.update(
            {n: cl.post("/v1/completions", b, key=k)}))
        th.start()
        threads.append(th)
        time.sleep(0.1)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    for th in threads + [t]:
        th.join(30)
    got = {n: res.get(n, (0,))[0] for n in list(runs) + ["first"]}
    ok &= check(got == {"first": 200, "open, no class": 429, "open, slo_class batch": 200,
                        "sk-batch, no class": 200, "sk-fast, slo_class batch": 429},
                "behind the queue: default class refused, batch admitted, a key's class wins "
                "over the request's (%s)" % got)
    m = cl.metrics()
    by = {(c, r): decisions(m, r, c) for c in ("default", "batch") for r in ("accepted", "ttft")}
    ok &= check(by == {("default", "accepted"): 0, ("default", "ttft"): 2,
                       ("batch", "accepted"): 3, ("batch", "ttft"): 0},
                "decisions counted by class (%s)" % by)
    # a default-class request on a node the Conductor thinks idle (admitted) that is held
    # 0.6 s: its TTFT misses the 300 ms SLO, and the metrics say so
    cl.procs["p0"].send_signal(signal.SIGSTOP)
    t = threading.Thread(target=lambda: res.update(late=cl.post(
        "/v1/completions", dict(body, max_tokens=4), key="sk-open")))
    t.start()
    time.sleep(0.6)
    cl.procs["p0"].send_signal(signal.SIGCONT)
    t.join(30)
    m = cl.metrics()
    slo = 'tycho_slo_requests_total{class="%s",slo="ttft",result="%s"}'
    seen = {k: m.get(slo % k, 0) for k in (("batch", "met"), ("batch", "missed"),
                                           ("default", "met"), ("default", "missed"))}
    n_ttft = m.get('tycho_request_ttft_seconds_count{class="batch"}', 0)
    ok &= check(res.get("late", (0,))[0] == 200 and
                seen == {("batch", "met"): 3, ("batch", "missed"): 0, ("default", "met"): 0,
                         ("default", "missed"): 1} and n_ttft == 3,
                "SLO attainment per class: the 3 batch requests met 60 s, the held default one "
                "missed 300 ms (%s; batch TTFT observed %s)" % (seen, n_ttft))
    return ok


def case_status():
    """`tycho status` shows an operator the running cluster: requests, the SLO classes and
    cost model in force and every node with its load, as a table and as JSON; it needs the API
    key when keys are set (a wrong one exits 1 naming the HTTP error), says so when the server
    is not there, and a node that died shows as down."""
    cl = Cluster(1, 1, config=CLASS_CONFIG, hb_timeout="1s")
    ok = True
    url = "http://127.0.0.1:%d" % cl.http
    st, _ = cl.post("/v1/completions", {"prompt": "The cat", "max_tokens": 3}, key="sk-open")
    ok &= check(st == 200, "a request served (%d)" % st)

    def status(*args, env_key=None):
        env = dict(os.environ)
        env.pop("TYCHO_API_KEY", None)
        if env_key:
            env["TYCHO_API_KEY"] = env_key
        return subprocess.run([TYCHO, "status", "--url", url, *args], capture_output=True,
                              text=True, timeout=20, env=env)
    r = status("--api-key", "sk-open")
    table = r.stdout
    ok &= check(r.returncode == 0 and "kvcache_centric" in table and "batch" in table and
                "p0" in table and "d0" in table and "60.000" in table and
                "100.0% of 1" in table,
                "table: policy, classes with their SLOs, both nodes (rc %d)\n%s%s" %
                (r.returncode, table, r.stderr))
    r = status("--json", env_key="sk-open")  # the key from the environment
    try:
        d = json.loads(r.stdout)
    except ValueError:
        d = {}
    nodes = {n["id"]: n for n in d.get("nodes", [])}
    classes = [(c["name"], c["ttft_s"]) for c in d.get("scheduler", {}).get("classes", [])]
    c0 = (d.get("scheduler", {}).get("classes") or [{}])[0]
    ok &= check(c0.get("accepted") == 1 and c0.get("refused") == 0 and
                c0.get("ttft_met") == 1 and c0.get("ttft_missed") == 0,
                "JSON: the default class's decisions and SLO attainment (%s)" % c0)
    ok &= check(r.returncode == 0 and d.get("model") == "stories260K" and
                nodes.get("p0", {}).get("role") == "prefill" and
                nodes.get("d0", {}).get("alive") is True and
                nodes.get("d0", {}).get("served") == 1 and
                classes == [("default", 0.3), ("batch", 60.0)],
                "JSON: model, nodes with role, state and requests served, classes %s" % classes)
    r = status("--api-key", "sk-wrong")
    ok &= check(r.returncode == 1 and "HTTP 401" in r.stderr,
                "a wrong key: exit 1, %s" % r.stderr.strip())
    cl.procs["d0"].kill()
    cl.procs["d0"].wait()
    end, alive = time.time() + 10, True
    while time.time() < end and alive:
        time.sleep(0.2)
        d = json.loads(status("--json", "--api-key", "sk-open").stdout or "{}")
        alive = any(n["id"] == "d0" and n["alive"] for n in d.get("nodes", []))
    r = status("--api-key", "sk-open")
    ok &= check(not alive and re.search(r"d0 +decode +\S+ +down", r.stdout),
                "the killed decode node shows as down:\n%s" % r.stdout)
    cl.procs["conductor"].terminate()
    cl.procs["conductor"].wait()
    r = status("--api-key", "sk-open", "--timeout-ms", "2000")
    ok &= check(r.returncode == 1 and "cannot connect" in r.stderr,
                "no server: exit 1, %s" % r.stderr.strip())
    return ok


OVERLOAD_CONFIG = """
scheduler:
  models:
    - name: stories260K
      slo:
        - {class: default, ttft: 2s, tbt: 0s}
cost:
  refit: false
  prefill: [1000, 50000, 0]   # 1 ms + 50 ms per uncached token
"""


def case_overload_answers():
    """A 429 says whether retrying can help. Behind a held prefill node (a queue), a prompt
    whose prefill alone is predicted over the 2 s TTFT SLO (45 tokens: 2.25 s) is refused with
    x-should-retry: false and no Retry-After (the OpenAI SDKs would retry it twice for
    nothing), its message saying so; one that fits alone (20 tokens: 1 s) but not behind the
    queue gets Retry-After. With x_should_retry: false every refusal carries Retry-After."""
    ok = True
    a_ids = list(range(10, 40))     # 30 tokens: 1.5 s alone, admitted on the idle node
    never = list(range(100, 145))   # 45 tokens: 2.25 s even alone
    later = list(range(200, 220))   # 20 tokens: 1 s alone, 2.5 s behind a_ids
    for knob in (True, False):
        cfg = OVERLOAD_CONFIG + ("" if knob else "x_should_retry: false\n")
        cl = Cluster(1, 1, config=cfg, hb_timeout="10s")
        cl.procs["p0"].send_signal(signal.SIGSTOP)
        res = {}
        t = threading.Thread(target=lambda: res.update(a=cl.post(
            "/v1/completions", {"prompt": a_ids, "max_tokens": 2, "temperature": 0})))
        t.start()
        time.sleep(0.1)  # placed: 1.5 s of predicted prefill queued on p0
        h_never, h_later = {}, {}
        st_n, body_n = cl.post("/v1/completions", {"prompt": never, "max_tokens": 2},
                               headers=h_never)
        st_l, body_l = cl.post("/v1/completions", {"prompt": later, "max_tokens": 2},
                               headers=h_later)
        cl.procs["p0"].send_signal(signal.SIGCONT)
        t.join(30)
        err_n = json.loads(body_n).get("error", {}) if body_n else {}
        err_l = json.loads(body_l).get("error", {}) if body_l else {}
        tag = "x_should_retry %s: " % ("true" if knob else "false")
        ok &= check(res.get("a", (0,))[0] == 200, tag + "the first prompt, on the idle node, "
                    "served (%s)" % (res.get("a", (None,))[0],))
        ok &= check(st_n == 429 and err_n.get("code") == "ttft_slo" and
                    "retrying will not help" in err_n.get("message", ""),
                    tag + "a prompt over the SLO even alone refused, saying retrying will not "
                    "help: %d %s" % (st_n, err_n))
        if knob:
            ok &= check(h_never.get("x-should-retry") == "false" and
                        "retry-after" not in h_never,
                        tag + "x-should-retry: false and no Retry-After (%s)" % h_never)
        else:
            ok &= check("x-should-retry" not in h_never and
                        int(h_never.get("retry-after", "0")) >= 1,
                        tag + "Retry-After and no x-should-retry (%s)" % h_never)
        ok &= check(st_l == 429 and err_l.get("code") == "ttft_slo" and
                    "retry later" in err_l.get("message", "") and
                    "x-should-retry" not in h_later and
                    int(h_later.get("retry-after", "0")) >= 1,
                    tag + "a prompt refused for the queue only gets Retry-After: %d %s %s" %
                    (st_l, err_l, h_later))
        cl.stop()
    return ok


# Under a sanitizer (a Debug build, 10-20x slower: about 11 ms a stories260K step) every
# time here is ten times longer, so the stale model still predicts twice the SLO and the
# measured steps still fit well under it.
STALE_SCALE = 10 if SLOW else 1
STALE_CONFIG = """
scheduler:
  models:
    - name: stories260K
      slo:
        - {class: default, ttft: 0s, tbt: %dms}
cost:
  refit: true
  decode: [%d, %d, 0]   # what a burst taught: 11 ms + 0.24 ms per sequence
""" % (5 * STALE_SCALE, 11000 * STALE_SCALE, 240 * STALE_SCALE)


def case_stale_model():
    """A decode model that predicts 11 ms a step against a 5 ms TBT SLO (the real steps of
    stories260K take well under a millisecond): the first request on the idle cluster is
    admitted all the same (alone on idle nodes), its steps' timings refit the model, and
    requests arriving together are admitted afterwards. The prediction error is on /metrics
    (predicted / measured TBT far above 1 for the first) and in GET /status."""
    cl = Cluster(1, 1, config=STALE_CONFIG)
    ok = True
    st, body = cl.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24,
                                           "temperature": 0, "ignore_eos": True})
    ok &= check(st == 200, "alone on the idle cluster, admitted despite a predicted 11 ms "
                "step (%d %s)" % (st, body[:200]))
    # its steps' timing samples arrive with the decode node's heartbeats (later under a
    # sanitizer on a slow machine: poll for up to 8 s)
    deadline = time.time() + 8
    while True:
        time.sleep(0.2)
        m = cl.metrics()
        d0 = m.get('tycho_scheduler_cost_coefficient{stage="decode",term="0"}', -1)
        d1 = m.get('tycho_scheduler_cost_coefficient{stage="decode",term="1"}', -1)
        if 0 <= d0 + 3 * d1 < 5000 * STALE_SCALE or time.time() > deadline:
            break
    ok &= check(0 <= d0 + 3 * d1 < 5000 * STALE_SCALE, "the decode model follows the measured steps: "
                "%.1f us + %.2f us per sequence" % (d0, d1))
    res, threads = {}, []
    for i in range(3):
        t = threading.Thread(target=lambda i=i: res.update({i: cl.post(
            "/v1/completions", {"prompt": PROMPTS[i], "max_tokens": 8, "temperature": 0})}))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(30)
    codes = [res.get(i, (0,))[0] for i in range(3)]
    ok &= check(codes == [200] * 3, "three requests together admitted afterwards (%s)" % codes)
    m = cl.metrics()
    n_tbt = m.get('tycho_scheduler_prediction_ratio_count{slo="tbt"}', 0)
    under2 = m.get('tycho_scheduler_prediction_ratio_bucket{slo="tbt",le="2"}', -1)
    n_ttft = m.get('tycho_scheduler_prediction_ratio_count{slo="ttft"}', 0)
    ok &= check(n_tbt >= 4 and n_ttft >= 4 and 0 <= under2 < n_tbt,
                "prediction ratios on /metrics: %d TTFT, %d TBT, %d TBT within 2x" %
                (n_ttft, n_tbt, under2))
    st, text = get_status(cl.http, "/status")
    pred = json.loads(text).get("scheduler", {}).get("cost", {}).get("prediction", {}) \
        if st == 200 else {}
    ok &= check(pred.get("tbt", {}).get("requests", 0) >= 4 and
                pred.get("tbt", {}).get("median_ratio") is not None,
                "GET /status shows the prediction error: %s" % pred)
    return ok


def case_phantom_credit():
    """The Conductor credits a prefill node with a prompt's blocks when it places the prompt
    there; a request that fails before its prefill (its decode node hung and was declared
    dead) must take that credit back, or the scheduler keeps predicting a cache hit that the
    node never had."""
    cl = Cluster(1, 1)
    ok = True
    time.sleep(0.6)  # past p0's first heartbeat, whose reset would wipe any credit anyway
    cl.procs["d0"].send_signal(signal.SIGSTOP)
    st, _ = cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 2,
                                        "temperature": 0})
    ok &= check(st != 200, "request to a hung decode node failed (%d)" % st)
    cl.procs["d0"].send_signal(signal.SIGCONT)
    deadline = time.time() + 10
    blocks = None
    while time.time() < deadline:  # d0 registers again; p0's heartbeats go on
        blocks = cl.metrics().get("tycho_scheduler_index_blocks")
        st, body = cl.post("/v1/completions", {"prompt": "The cat", "max_tokens": 1})
        if st == 200:
            break
        time.sleep(0.2)
    ok &= check(blocks == 0, "no block of the failed prompt left in the index (%s)" % blocks)
    before = cl.metrics().get("tycho_scheduler_cached_blocks_total", 0)
    st, body = cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 2,
                                           "temperature": 0})
    after = cl.metrics().get("tycho_scheduler_cached_blocks_total", 0)
    ok &= check(st == 200 and cached_of(body) == 0 and after == before,
                "the prompt again: nothing predicted (%s) or found (%s) cached" %
                (after - before, cached_of(body) if st == 200 else st))
    return ok


def case_cost_refit():
    """The Conductor refits its cost model from the timings the nodes measure: after some
    traffic it has prefill and decode samples, and the coefficients in use moved away from the
    deliberately wrong starting point (1 s per prompt token) to non-negative values that
    predict this machine's prefill within a factor of 20."""
    cl = Cluster(1, 1, config="cost:\n  prefill: [0, 1000000, 0]\n")
    ok = True
    t_prefill = []
    for i, p in enumerate(PROMPTS[:14]):
        t0 = time.time()
        st, _ = cl.post("/v1/completions", {"prompt": p, "max_tokens": 3,
                                            "temperature": 0})
        t_prefill.append(time.time() - t0)
        ok &= check(st == 200, "request %d served (%d)" % (i, st))
    time.sleep(0.6)  # three heartbeats
    m = cl.metrics()
    n_pre = m.get('tycho_scheduler_cost_samples_total{stage="prefill"}', 0)
    n_dec = m.get('tycho_scheduler_cost_samples_total{stage="decode"}', 0)
    ok &= check(n_pre >= 8 and n_dec >= 1, "timing samples received: %d prefill, %d "
                "decode" % (n_pre, n_dec))
    c = [m.get('tycho_scheduler_cost_coefficient{stage="prefill",term="%d"}' % k, -1)
         for k in range(3)]
    ok &= check(all(x >= 0 for x in c) and c[1] < 1000000,
                "prefill coefficients refitted: %s" % c)
    pred = (c[0] + c[1] * 8 + c[2] * 64) / 1e6  # an 8-token prompt, seconds
    worst = max(t_prefill)
    ok &= check(pred < 20 * worst, "predicted prefill of 8 tokens %.4f s vs measured "
                "whole requests <= %.4f s" % (pred, worst))
    # what a first token takes beyond the model (RPCs, the handoff) was learned from the
    # measured TTFTs: more than nothing, less than a whole request
    over = m.get("tycho_scheduler_ttft_overhead_seconds", -1)
    ok &= check(0 < over < worst, "TTFT overhead learned: %.4f s (whole requests <= %.4f s)" %
                (over, worst))
    return ok


def pool_objects(cl):
    """Blocks committed in cl's KV pool, as `tycho store-stats` reports them (-1: no answer)."""
    out = subprocess.run([TYCHO, "store-stats", "--master=127.0.0.1:%d" % cl.store_port(),
                          "--json"], capture_output=True, text=True)
    return json.loads(out.stdout)["objects"] if out.returncode == 0 else -1


def store_stats(cl):
    """`tycho store-stats --json` of cl's KV pool ({} when it does not answer)."""
    out = subprocess.run([TYCHO, "store-stats", "--master=127.0.0.1:%d" % cl.store_port(),
                          "--json"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def store_metrics(cl):
    """cl's tycho-store /metrics (the metrics= port of its port file)."""
    with open(cl.port_file("store")) as f:
        port = int(dict(kv.split("=") for kv in f.read().split())["metrics"])
    return scrape(port)


def case_kv_f16():
    """f16 and bf16 KV pages (kv_cache_dtype) through the whole disaggregated path: prefill
    computes them, the transfer engine moves them to decode, the KV pool stores them and the
    other prefill node reads them back, and every answer equals `tycho generate --kv-dtype`
    of the same type. A pool block of 16-bit pages is half an f32 one. A decode node with f32 pages is refused
    at registration with a message naming both types, so is a node with another model (other
    geometry), and the cluster keeps serving."""
    ok = True
    refs = {dt: generate(LONG_A, 8, extra=("--kv-dtype", dt)) for dt in ("f16", "bf16")}
    ref = refs["f16"]
    want = (len(ref["prompt_ids"]) - 1) // 16 * 16
    per_block = {}
    for dt in ("f32", "f16", "bf16"):
        cl = Cluster(2, 1, config="scheduler:\n  policy: round_robin\n", kv_pool=True,
                     node_args=["--kv_cache_dtype=" + dt])
        seen = []
        for turn in range(1 if dt == "f32" else 2):
            st, body = cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 8,
                                                   "temperature": 0, "return_token_ids": True})
            seen.append((st, json.loads(body)["choices"][0]["token_ids"] if st == 200 else None,
                         cached_of(body) if st == 200 else -1))
            stored = (len(ref["prompt_ids"]) + len(ref["output_ids"]) - 1) // 16
            end = time.time() + 10
            while pool_objects(cl) < stored and time.time() < end:
                time.sleep(0.05)
        stats = store_stats(cl)
        per_block[dt] = stats.get("dram_used", 0) / max(stats.get("objects", 0), 1)
        if dt != "f32":
            ok &= check(all(st == 200 and ids == refs[dt]["output_ids"] for st, ids, _ in seen),
                        "%s cluster: both turns equal generate --kv-dtype %s: %s vs %s" %
                        (dt, dt, [ids for _, ids, _ in seen], refs[dt]["output_ids"]))
            ok &= check(seen[0][2] == 0 and seen[1][2] == want,
                        "the second turn (other prefill node) reads all %d full blocks' tokens "
                        "of %s pages from the pool: cached %s" % (want, dt,
                                                                  [c for *_, c in seen]))
        if dt == "f16":
            cl.node_args = [a for a in cl.node_args if not a.startswith("--kv_cache_dtype")]
            cl.node_args.append("--kv_cache_dtype=f32")
            cl.start_node("decode", "d1")
            end = time.time() + 10
            text = ""
            while time.time() < end and "refused" not in text:
                with open(cl.logs["conductor"]) as f:
                    text = f.read()
                time.sleep(0.1)
            ok &= check("kv_cache_dtype f32 differs from node" in text and "f16" in text,
                        "the Conductor refused the f32 decode node, naming both types")
            ok &= check("d1" not in cl.registered(), "d1 never registered")
            other = os.path.join(DATA, "models/llama-2-tiny-random/llama-2-tiny-random.gguf")
            cl.start("d2", [DECODE, "--model_path=" + other, "--name=d2",
                            "--conductor_address=127.0.0.1:%d" % cl.rpc, "--kv_block_tokens=16",
                            "--heartbeat_interval=200ms", "--kv_cache_dtype=f16"])
            end = time.time() + 10
            while time.time() < end and "refused a registration of 'd2'" not in text:
                with open(cl.logs["conductor"]) as f:
                    text = f.read()
                time.sleep(0.1)
            ok &= check("refused a registration of 'd2': model llama-2-tiny-random" in text and
                        "layers" in text and "d2" not in cl.registered(),
                        "a decode node with another model is refused, naming both geometries")
            st, body = cl.post("/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 8,
                                                   "temperature": 0, "return_token_ids": True})
            ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] ==
                        generate(PROMPTS[2], 8, extra=("--kv-dtype", "f16"))["output_ids"],
                        "still served by the f16 nodes")
        cl.stop()
    for dt in ("f16", "bf16"):
        ok &= check(per_block[dt] > 0 and abs(per_block["f32"] / per_block[dt] - 2) < 0.05,
                    "pool bytes per block: f32 %.0f, %s %.0f (half)" %
                    (per_block["f32"], dt, per_block[dt]))
    return ok


def case_kv_pool():
    """Prefill nodes share prefixes through the cluster KV pool (tycho-store): with
    round-robin placement a repeated prompt lands on the other prefill node, which has never
    seen it, and reads its full blocks from the pool instead of computing them; the answer is
    still tycho generate's. Without the pool that node computes everything; with the pool
    killed, requests are still served (computed)."""
    cl = Cluster(2, 1, config="scheduler:\n  policy: round_robin\n", kv_pool=True,
                 node_args=["--kv_pool.timeout=500ms", "--kv_pool.retry=300ms"])
    ok = True
    refs = {p: generate(p, 8) for p in (LONG_A, LONG_B)}
    want = {p: (len(r["prompt_ids"]) - 1) // 16 * 16 for p, r in refs.items()}

    def ask(prompt):
        st, body = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                               "temperature": 0, "return_token_ids": True})
        if st != 200:
            return st, None, -1
        return st, json.loads(body)["choices"][0]["token_ids"], cached_of(body)

    stored = by_prefill = 0
    for prompt in (LONG_A, LONG_B):
        seen = [ask(prompt)]
        # the first node writes the prompt's full blocks to the pool after it answered, the
        # decode node those its answer filled: wait for them before the second turn (round
        # robin: on the other prefill node)
        r = refs[prompt]
        stored += (len(r["prompt_ids"]) + len(r["output_ids"]) - 1) // 16
        by_prefill += len(r["prompt_ids"]) // 16
        end = time.time() + 10
        while pool_objects(cl) < stored and time.time() < end:
            time.sleep(0.05)
        ok &= check(pool_objects(cl) == stored, "the pool holds the %d full blocks computed so "
                    "far (tycho store-stats: %d)" % (stored, pool_objects(cl)))
        seen.append(ask(prompt))
        ok &= check(all(st == 200 and ids == refs[prompt]["output_ids"] for st, ids, _ in seen),
                    "both turns equal generate's ids: %s vs %s" %
                    ([ids for _, ids, _ in seen], refs[prompt]["output_ids"]))
        ok &= check(seen[0][2] == 0 and seen[1][2] == want[prompt],
                    "first turn computes everything, the second (other node) reads all %d full "
                    "blocks' tokens from the pool: cached %s" %
                    (want[prompt], [c for _, _, c in seen]))
    # the prefill nodes' heartbeats carry their pool counters to the Conductor's /metrics

    def pool_metric(kind):
        m = cl.metrics()
        if kind == "errors":
            return sum(m.get('tycho_node_kv_pool_errors_total{node="%s"}' % n, 0)
                       for n in ("p0", "p1"))
        return sum(m.get('tycho_node_kv_pool_blocks_total{node="%s",kind="%s"}' % (n, kind), 0)
                   for n in ("p0", "p1"))

    end = time.time() + 5
    while time.time() < end and (pool_metric("read") < 8 or pool_metric("written") < by_prefill):
        time.sleep(0.1)
    ok &= check(pool_metric("read") == 8 and pool_metric("written") == by_prefill,
                "tycho_node_kv_pool_blocks_total of the prefill nodes: %d read (want 8), %d "
                "written (want %d)" % (pool_metric("read"), pool_metric("written"), by_prefill))
    up = cl.metrics()
    ok &= check(all(up.get('tycho_node_up{node="%s",role="%s"}' % nr) == 1 for nr in
                    (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))),
                "tycho_node_up is 1 for every node")
    # the pool's own /metrics (master and pool node in one tycho-store here) agree with
    # tycho store-stats and show the blocks the prefill nodes wrote
    ss = store_stats(cl)
    sm = store_metrics(cl)
    ok &= check(sm.get("tycho_store_master_serving") == 1 and
                sm.get("tycho_pool_node_registered") == 1, "the store serves and is registered")
    ok &= check(ss and sm.get("tycho_store_objects") == ss.get("objects") and
                ss.get("objects", 0) > 0,
                "tycho_store_objects %s = store-stats objects %s" %
                (sm.get("tycho_store_objects"), ss.get("objects")))
    ok &= check(sm.get('tycho_pool_node_blocks{tier="dram"}') == ss.get("objects") and
                sm.get('tycho_pool_node_dram_bytes{state="used"}', 0) > 0 and
                sm.get('tycho_pool_node_dram_bytes{state="capacity"}') == 64 << 20,
                "the pool node holds them in its 64 MiB DRAM: %s" %
                {k: v for k, v in sm.items() if k.startswith("tycho_pool_node_")})
    ok &= check(all('tycho_pool_node_transfer_bytes_total{direction="%s"}' % d in sm
                    for d in ("in", "out")),
                "the pool node's network transfer series are there (on one host the prefill "
                "nodes reach its DRAM through shared memory, not counted)")
    # the pool dies: prompts are computed, nothing fails
    cl.procs["store"].kill()
    cl.procs["store"].wait()
    fresh = PROMPTS[3] + " " + LONG_B
    ref = generate(fresh, 8)["output_ids"]
    for turn in range(3):
        st, ids, cached = ask(fresh)
        ok &= check(st == 200 and ids == ref,
                    "pool gone, turn %d: served, ids equal generate's (cached %d)" %
                    (turn, cached))
    end = time.time() + 5
    while time.time() < end and pool_metric("errors") < 1:
        time.sleep(0.1)
    ok &= check(pool_metric("errors") >= 1, "tycho_node_kv_pool_errors_total counted the "
                "failure (%d)" % pool_metric("errors"))
    cl.stop()
    logs = ""
    for name in ("p0", "p1"):
        with open(cl.logs[name]) as f:
            logs += f.read()
    ok &= check("KV pool lookup failed" in logs or "KV pool read failed" in logs,
                "a prefill node logged that the pool failed")
    # control: the same two turns without a pool compute the second turn too
    bare = Cluster(2, 1, config="scheduler:\n  policy: round_robin\n")
    seen = []
    for _ in range(2):
        st, body = bare.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 8,
                                                 "temperature": 0})
        seen.append(cached_of(body) if st == 200 else -1)
    ok &= check(seen == [0, 0], "without a pool the other node computes it all: %s" % seen)
    return ok


def case_pool_sched():
    """The Conductor follows the KV pool's blocks (kv_pool.master): a prompt whose blocks the
    prefill node's 12-page cache evicted long ago, but the pool still holds, is predicted
    cached (the scheduler plans its prefix read from the pool), and it is read from there.
    With a Conductor that does not follow the pool, the node still reads it, unforeseen."""
    prompts = ["%s %s" % (w, LONG_A) for w in
               ["Red.", "Blue.", "Green.", "Gold.", "Pink.", "Gray."]]
    ok = True
    want = {p: len(generate(p, 1)["prompt_ids"]) for p in prompts}
    deltas = []
    for follow in (True, False):
        cl = Cluster(1, 1, node_args=["--kv_pages=12"], kv_pool=True, conductor_pool=follow)
        for p in prompts:
            st, _ = cl.post("/v1/completions", {"prompt": p, "max_tokens": 2,
                                                "temperature": 0})
            ok &= check(st == 200, "distinct prompt served (%d)" % st)
        stored = sum(n // 16 for n in want.values())
        end = time.time() + 10
        while pool_objects(cl) < stored and time.time() < end:
            time.sleep(0.05)
        # the node's heartbeats tell the Conductor what its 12 pages evicted (200 ms apart:
        # slower under a sanitizer); until then its index may still hold the first prompt
        while time.time() < end:
            node_blocks = cl.metrics().get("tycho_scheduler_index_blocks", 0)
            if node_blocks <= 12 + (stored if follow else 0):
                break
            time.sleep(0.1)
        if follow:
            while time.time() < end:
                events = cl.metrics().get('tycho_kv_pool_events_total{kind="stored"}', 0)
                if events >= stored:
                    break
                time.sleep(0.1)
            ok &= check(events >= stored, "the Conductor heard of the %d blocks the node "
                        "wrote to the pool (%s events)" % (stored, events))
            time.sleep(0.5)  # the Conductor's 100 ms tick applies them to the scheduler
        before = cl.metrics().get("tycho_scheduler_cached_blocks_total", 0)
        st, body = cl.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 2,
                                               "temperature": 0})
        deltas.append(cl.metrics().get("tycho_scheduler_cached_blocks_total", 0) - before)
        full = (want[prompts[0]] - 1) // 16 * 16
        ok &= check(st == 200 and cached_of(body) == full,
                    "evicted prompt read from the pool: cached %s of %d (Conductor follows "
                    "the pool: %s)" % (cached_of(body) if st == 200 else st, full, follow))
        cl.stop()
    ok &= check(deltas == [full // 16, 0], "the scheduler predicted the pool's %d blocks only "
                "when it followed the pool: %s" % (full // 16, deltas))
    return ok


def case_pool_decode():
    """A decode node writes the blocks its answer filled to the KV pool when the request ends:
    the conversation's next turn (prompt, answer and a new message, as token ids) lands on the
    other prefill node (round robin), which never saw either, and reads prompt and answer from
    the pool; both answers equal tycho generate's."""
    cl = Cluster(2, 1, config="scheduler:\n  policy: round_robin\n", kv_pool=True)
    ok = True
    ref = generate(LONG_A, 40, extra=("--ignore-eos",))
    prompt, answer = ref["prompt_ids"], ref["output_ids"]
    st, body = cl.post("/v1/completions", {"prompt": LONG_A, "max_tokens": 40, "temperature": 0,
                                           "ignore_eos": True, "return_token_ids": True})
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == answer,
                "turn 1 equals generate's ids")
    kv = len(prompt) + len(answer) - 1  # the last answer token has no KV yet
    end = time.time() + 10
    while pool_objects(cl) < kv // 16 and time.time() < end:
        time.sleep(0.05)
    ok &= check(pool_objects(cl) == kv // 16, "the pool holds the %d full blocks of prompt and "
                "answer (%d from the prefill node, the rest from the decode node): %d" %
                (kv // 16, len(prompt) // 16, pool_objects(cl)))
    turn2 = prompt + answer + prompt[1:9]
    ref2 = generate(None, 8, extra=("--prompt-ids", ",".join(map(str, turn2))))
    st, body = cl.post("/v1/completions", {"prompt": turn2, "max_tokens": 8, "temperature": 0,
                                           "return_token_ids": True})
    got = json.loads(body) if st == 200 else {}
    want = min(kv // 16, (len(turn2) - 1) // 16) * 16
    ok &= check(st == 200 and got["choices"][0]["token_ids"] == ref2["output_ids"],
                "turn 2 equals generate's ids")
    ok &= check(cached_of(body) == want, "turn 2 read %d tokens of prompt and answer from the "
                "pool (want %d)" % (cached_of(body), want))
    return ok


def case_pool_streaming():
    """A decode node publishes its answer's full blocks to the KV pool as it streams: the
    conversation's next turn (prompt, the answer so far, a new message), sent while the first
    answer is still streaming, lands on the other prefill node, which reads prompt and answer
    blocks from the pool (usage cached_tokens); both answers equal tycho generate's."""
    tmp = tempfile.mkdtemp(prefix="tycho-model-")
    TMPDIRS.append(tmp)
    mid = os.path.join(tmp, "mid.gguf")  # slow enough that 300 tokens stream for seconds
    subprocess.run([TYCHO, "mkmodel", "--dims", "512,8,8,4,1536", "--vocab-from", MODEL,
                    "--out", mid], check=True, capture_output=True)
    cl = Cluster(2, 1, model=mid, config="scheduler:\n  policy: round_robin\n", kv_pool=True)
    ok = True
    n_long = 300
    ref = generate(LONG_A, n_long, mid, ["--ignore-eos"])
    prompt, answer = ref["prompt_ids"], ref["output_ids"]
    m = 48 - len(prompt) % 16  # answer tokens taken: prompt + m ends on a block boundary
    got, done = [], threading.Event()

    def turn1():
        c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=120)
        c.request("POST", "/v1/completions", json.dumps(
            {"prompt": LONG_A, "max_tokens": n_long, "temperature": 0, "ignore_eos": True,
             "stream": True, "return_token_ids": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        for line in r:
            line = line.strip()
            if line.startswith(b"data: {"):
                got.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
        done.set()

    t = threading.Thread(target=turn1)
    t.start()
    end = time.time() + 60
    while len(got) < m + 1 and time.time() < end and not done.is_set():
        time.sleep(0.01)
    want_blocks = (len(prompt) + m) // 16
    end = time.time() + 10
    while pool_objects(cl) < want_blocks and time.time() < end and not done.is_set():
        time.sleep(0.02)
    turn2 = prompt + answer[:m] + prompt[1:9]
    st, body = cl.post("/v1/completions", {"prompt": turn2, "max_tokens": 8, "temperature": 0,
                                           "return_token_ids": True}, timeout=60)
    streaming = not done.is_set()
    n_then = len(got)
    ref2 = generate(None, 8, mid, ["--prompt-ids", ",".join(map(str, turn2))])
    ok &= check(streaming and n_then < n_long,
                "turn 2 answered while turn 1 was still streaming (%d of %d tokens)" %
                (n_then, n_long))
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == ref2["output_ids"],
                "turn 2 equals generate's ids")
    ok &= check(cached_of(body) == want_blocks * 16,
                "turn 2 read the prompt's and the streaming answer's %d full blocks from the "
                "pool: cached %d tokens (want %d)" % (want_blocks, cached_of(body),
                                                      want_blocks * 16))
    t.join(120)
    ok &= check(got == answer, "turn 1 streamed generate's %d ids" % len(answer))
    return ok


def case_pool_snapshot():
    """A Conductor restarted after the pool filled learns what the pool holds from its
    subscription's snapshot, not only from blocks written later."""
    cl = Cluster(1, 1, kv_pool=True, conductor_pool=True)
    ok = True
    for p in (LONG_A, LONG_B):
        st, _ = cl.post("/v1/completions", {"prompt": p, "max_tokens": 2, "temperature": 0})
        ok &= check(st == 200, "served (%d)" % st)
    end = time.time() + 10
    want = sum((len(generate(p, 2)["prompt_ids"]) + 1) // 16 for p in (LONG_A, LONG_B))
    while pool_objects(cl) < want and time.time() < end:
        time.sleep(0.05)
    held = pool_objects(cl)
    ok &= check(held >= want, "the pool holds %d blocks (want >= %d)" % (held, want))
    old = cl.procs["conductor"]
    old.send_signal(signal.SIGTERM)
    old.wait(10)
    cl.start("conductor", cl.conductor_argv + ["--listen_port=%d" % cl.http,
                                               "--rpc_port=%d" % cl.rpc])
    read_ports(cl.port_file("conductor"), time.time() + 20)
    seen, end = 0, time.time() + 10
    while seen < held and time.time() < end:
        try:
            seen = cl.metrics().get('tycho_kv_pool_events_total{kind="stored"}', 0)
        except OSError:
            pass
        time.sleep(0.1)
    ok &= check(seen == held, "the restarted Conductor knows the pool's %d blocks from the "
                "snapshot (%d stored events)" % (held, seen))
    return ok


def case_local_cluster():
    """deploy/local-cluster.sh, as an operator runs it: a Conductor, 2 prefill and 2 decode
    nodes and a KV pool; answers equal tycho generate's, the prefill nodes write their blocks
    to the pool, `stop` leaves no process behind."""
    import socket
    sk = socket.socket()
    sk.bind(("127.0.0.1", 0))
    port = sk.getsockname()[1]
    sk.close()
    state = tempfile.mkdtemp(prefix="tycho-local-cluster-")
    TMPDIRS.append(state)
    env = dict(os.environ, TYCHO_BIN_DIR=BUILD, TYCHO_CLUSTER_DIR=state)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../deploy/"
                          "local-cluster.sh")
    ok = True
    out = subprocess.run(["sh", script, "start", "--model", MODEL, "--port", str(port)],
                         env=env, capture_output=True, text=True, timeout=120)
    ok &= check(out.returncode == 0 and "KV pool 256M" in out.stdout,
                "local-cluster.sh start: %s %s" % (out.stdout.strip(), out.stderr.strip()))
    pids = []
    try:
        for f in os.listdir(state):
            if f.endswith(".pid"):
                with open(os.path.join(state, f)) as fh:
                    pids.append(int(fh.read()))
        ok &= check(len(pids) == 6, "6 processes (conductor, 2 prefill, 2 decode, store): %d" %
                    len(pids))
        ref = generate(LONG_A, 8)
        for turn in range(2):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/completions",
                      json.dumps({"prompt": LONG_A, "max_tokens": 8, "temperature": 0,
                                  "return_token_ids": True}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            body = json.loads(r.read())
            c.close()
            ok &= check(r.status == 200 and body["choices"][0]["token_ids"] ==
                        ref["output_ids"], "turn %d equals generate's ids" % turn)
        with open(os.path.join(state, "store.ports")) as fh:
            master = dict(kv.split("=") for kv in fh.read().split())["master"]
        blocks = (len(ref["prompt_ids"]) + len(ref["output_ids"]) - 1) // 64  # prompt, answer
        objects, end = -1, time.time() + 10
        while objects < blocks and time.time() < end:
            st = subprocess.run([TYCHO, "store-stats", "--master=127.0.0.1:" + master,
                                 "--json"], capture_output=True, text=True)
            objects = json.loads(st.stdout)["objects"] if st.returncode == 0 else -1
            time.sleep(0.1)
        ok &= check(objects == blocks, "the pool holds the %d full 64-token blocks of "
                    "prompt and answer (%d)" % (blocks, objects))
    finally:
        out = subprocess.run(["sh", script, "stop"], env=env, capture_output=True, text=True,
                             timeout=60)
    alive = []
    for pid in pids:  # the script's daemons are not our children: a zombie counts as gone
        try:
            with open("/proc/%d/stat" % pid) as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    ok &= check(out.returncode == 0 and not alive, "stop: nothing left running (%s)" % alive)
    return ok


def case_transports():
    """transfer.transport: auto gives two daemons on one host the local (shared memory)
    transport, tcp forces tcp; the answers equal generate's either way, and the decode node's
    /metrics say which transport brought how many bytes. A setting that cannot work here
    (rdma without an RDMA device, a CUDA device that is absent) stops start-up with exit 2 and
    a message naming the setting."""
    ok = True
    for xport in ("auto", "tcp"):
        cl = Cluster(1, 1, node_args=["--transfer.transport=" + xport])
        for p in PROMPTS[:2]:
            ref = generate(p, 16)
            st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": 16,
                                                   "temperature": 0, "return_token_ids": True})
            got = json.loads(body)["choices"][0] if st == 200 else {}
            ok &= check(st == 200 and got.get("token_ids") == ref["output_ids"],
                        "transport %s, %r: ids equal generate's" % (xport, p))
        want, other = ("local", "tcp") if xport == "auto" else ("tcp", "local")
        dm, pm = node_metrics(cl, "d0"), node_metrics(cl, "p0")
        end = time.time() + 3  # the prefill node counts a handoff after its KvReady went out
        while time.time() < end and kv_bytes(pm, "sent", want) != kv_bytes(dm, "received", want):
            time.sleep(0.1)
            dm, pm = node_metrics(cl, "d0"), node_metrics(cl, "p0")
        n = dm.get('tycho_node_kv_handoffs_total{direction="received",transport="%s"}' % want)
        ok &= check(kv_bytes(dm, "received", want) > 0 and n == 2 and
                    kv_bytes(dm, "received", other) == 0,
                    "transport %s: the decode node received %s bytes in %s handoffs over %s, %s "
                    "over %s" % (xport, kv_bytes(dm, "received", want), n, want,
                                 kv_bytes(dm, "received", other), other))
        ok &= check(kv_bytes(pm, "sent", want) == kv_bytes(dm, "received", want),
                    "the prefill node sent as many bytes over %s (%s) as the decode node got" %
                    (want, kv_bytes(pm, "sent", want)))
        info = [k for k in dm if k.startswith("tycho_node_info{")]
        ok &= check(len(info) == 1 and 'role="decode"' in info[0] and
                    'transport="%s"' % xport in info[0] and 'backend="cpu"' in info[0],
                    "tycho_node_info names role, backend and transport: %s" % info)
        ok &= check(dm.get("tycho_node_step_seconds_count", 0) > 0 and
                    pm.get("tycho_node_step_seconds_count", 0) > 0 and
                    dm.get('tycho_node_kv_pages{device="cpu:0",state="free"}', -1) > 0,
                    "step times and free pages on both nodes' /metrics")
        mport = read_ports(cl.port_file("d0"), time.time() + 5, 3)[2]
        ok &= check(get_status(mport, "/health")[0] == 200 and
                    get_status(mport, "/ready")[0] == 200 and
                    get_status(cl.http, "/ready")[0] == 200 and
                    get_status(mport, "/nope")[0] == 404,
                    "the decode node's /health and /ready and the Conductor's /ready say 200")
        if xport == "auto":
            with open(cl.logs["d0"]) as f:
                log = f.read()
            if not os.path.isdir("/sys/class/infiniband") or not os.listdir(
                    "/sys/class/infiniband"):
                ok &= check("transport auto: no RDMA device" in log,
                            "auto without an RDMA device says so in the log")
            st, body = cl.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 1})
            c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=10)
            c.request("GET", "/status")
            r = c.getresponse()
            status = json.loads(r.read()) if r.status == 200 else {}
            c.close()
            nodes = {n["id"]: n for n in status.get("nodes", [])}
            ok &= check(nodes.get("d0", {}).get("backend") == "cpu" and
                        "local" in nodes.get("d0", {}).get("transports", ""),
                        "the Conductor's status shows each node's backend and transports: %s" %
                        {k: (v.get("backend"), v.get("kv_device"), v.get("transports"))
                         for k, v in nodes.items()})
        cl.stop()
    cl = Cluster(0, 0)  # a Conductor with no node: alive, not ready for traffic
    ok &= check(get_status(cl.http, "/health")[0] == 200 and
                get_status(cl.http, "/ready")[0] == 503,
                "a Conductor without nodes: /health 200, /ready %s" % (get_status(cl.http,
                                                                             "/ready"),))
    cl.stop()
    bad = []
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        bad.append((["--transfer.transport=rdma"], "transfer.transport: rdma"))
    bad.append((["--backend=cuda", "--cuda_device=250"], "cuda"))
    for args, want in bad:
        r = subprocess.run([DECODE, "--model_path=" + MODEL, "--conductor_address=127.0.0.1:9",
                            "--listen_port=0", *args], capture_output=True, text=True, timeout=60)
        line = [l for l in r.stderr.splitlines() if l.startswith("tycho-decode: ") and want in l]
        ok &= check(r.returncode == 2 and line and
                    ("cuda_device: 250" in line[0] or "backend: cuda" in line[0] or
                     "rdma" in want),
                    "%s: exit %d, %s" % (" ".join(args), r.returncode, line or r.stderr[-300:]))
    return ok


def notify_reader():
    """A stand-in for systemd's notification socket: (socket, path)."""
    d = tempfile.mkdtemp(prefix="tycho-notify-")
    TMPDIRS.append(d)
    path = os.path.join(d, "notify")
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sk.bind(path)
    sk.settimeout(0.05)
    return sk, path


def notices(sk, secs):
    """The notifications that arrive within the next secs (older ones are dropped first), as
    a list of strings."""
    try:
        while True:
            sk.recv(4096)
    except socket.timeout:
        pass
    out, end = [], time.time() + secs
    while time.time() < end:
        try:
            out.append(sk.recv(4096).decode())
        except socket.timeout:
            pass
    return out


def case_watchdog():
    """The systemd watchdog sees the engine: with WATCHDOG_USEC set, a node daemon and tycho
    serve send WATCHDOG=1 while their engine is idle or making progress; a forward call that
    hangs (test hook TYCHO_TEST_HANG_FORWARD) past engine_stall_timeout stops the keep-alives
    (read from a stand-in NOTIFY_SOCKET, as systemd would) and says why in the log. Killed and
    restarted as systemd would, the node serves again with generate's answer."""
    ok = True
    sk, path = notify_reader()
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000",
               TYCHO_TEST_HANG_FORWARD="1")
    cl = Cluster(1, 0)
    cl.start_node("decode", "d0", env=env, extra=["--engine_stall_timeout=1s"])
    cl.wait_nodes(2)
    before = notices(sk, 1.5)
    ok &= check(before.count("WATCHDOG=1") >= 4,
                "an idle decode node sends keep-alives: %d in 1.5 s" % before.count("WATCHDOG=1"))
    res = {}
    t = threading.Thread(target=stream, args=(cl, PROMPTS[0], 16, res, 0, 30))
    t.start()
    time.sleep(2.0)  # the hook hangs the first decode step; the stall limit is 1 s
    hung = notices(sk, 2.0)
    with open(cl.logs["d0"]) as f:
        log = f.read()
    ok &= check(hung.count("WATCHDOG=1") == 0 and
                "holding back the systemd watchdog keep-alive" in log,
                "a hung forward call stops the keep-alives (%d in 2 s) and says why" %
                hung.count("WATCHDOG=1"))
    cl.procs["d0"].send_signal(signal.SIGKILL)  # what systemd does at WatchdogSec
    cl.procs["d0"].wait()
    t.join(30)
    ok &= check(res.get(0) and res[0][3] is not None,
                "the client of the hung node got an error: %s" % (res.get(0) and res[0][3]))
    cl.start_node("decode", "d0")  # restarted, as Restart=on-watchdog would
    end = time.time() + 15
    while time.time() < end and open(cl.logs["conductor"]).read().count(
            "node d0 registered") < 2:
        time.sleep(0.05)
    time.sleep(0.5)
    ref = generate(PROMPTS[1], 12)
    st, body = cl.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12,
                                           "temperature": 0, "return_token_ids": True})
    ok &= check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == ref["output_ids"],
                "the restarted node serves generate's answer")
    cl.stop()
    # tycho serve: the same check over its one engine
    d = tempfile.mkdtemp(prefix="tycho-serve-")
    TMPDIRS.append(d)
    pf = os.path.join(d, "ports")
    log = open(os.path.join(d, "serve.log"), "w")
    p = subprocess.Popen([TYCHO, "serve", "--model", MODEL, "--listen_port=0",
                          "--port_file=" + pf, "--engine.engine_stall_timeout=1s"],
                         stdout=log, stderr=log, env=env)
    try:
        port = read_ports(pf, time.time() + 20, 1)[0]
        before = notices(sk, 1.0)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        try:
            c.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 4}),
                      {"Content-Type": "application/json"})
            c.getresponse()
        except (socket.timeout, OSError):
            pass
        time.sleep(1.0)
        hung = notices(sk, 2.0)
        ok &= check(before.count("WATCHDOG=1") >= 2 and hung.count("WATCHDOG=1") == 0,
                    "tycho serve: keep-alives %d in 1 s idle, %d in 2 s hung" %
                    (before.count("WATCHDOG=1"), hung.count("WATCHDOG=1")))
    finally:
        p.kill()
        p.wait()
    return ok


def case_request_id():
    """x-request-id: the client's id comes back on the response (streamed or not) and is in
    the Conductor's and the prefill node's log lines about the request; a request without one,
    or with one that is not a plain token, gets an id made by the API."""
    cl = Cluster(1, 1, config="log_level: debug\n", node_args=["--log_level=debug"])
    ok = True
    hdrs = {}
    c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[0], "max_tokens": 4}),
              {"Content-Type": "application/json", "X-Request-Id": "trace-abc.123"})
    r = c.getresponse()
    r.read()
    ok &= check(r.status == 200 and r.getheader("x-request-id") == "trace-abc.123",
                "the client's id comes back: %s" % r.getheader("x-request-id"))
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[1], "max_tokens": 4,
                                                     "stream": True}),
              {"Content-Type": "application/json", "X-Request-Id": "stream-7"})
    r = c.getresponse()
    r.read()
    ok &= check(r.getheader("x-request-id") == "stream-7", "and on a stream: %s" %
                r.getheader("x-request-id"))
    made = []
    for h in ({}, {"X-Request-Id": "has spaces and {braces}"}):
        c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[2], "max_tokens": 2}),
                  {"Content-Type": "application/json", **h})
        r = c.getresponse()
        r.read()
        made.append(r.getheader("x-request-id") or "")
    c.close()
    ok &= check(all(re.fullmatch(r"[0-9a-f]{16}", m) for m in made) and made[0] != made[1],
                "ids made by the API where the client gave none or a bad one: %s" % made)
    time.sleep(0.3)
    for name in ("conductor", "p0"):
        with open(cl.logs[name]) as f:
            log = f.read()
        ok &= check("[trace-abc.123]" in log and "[%s]" % made[0] in log,
                    "the %s's log lines name the requests by their ids" % name)
    return ok


def case_json_logs():
    """log_format json: every line every daemon writes is one JSON object (time, level,
    subsystem, process, message), and lines about a request carry its ids as fields."""
    cl = Cluster(1, 1, config="log_level: debug\nlog_format: json\n",
                 node_args=["--log_level=debug", "--log_format=json"])
    ok = True
    c = http.client.HTTPConnection("127.0.0.1", cl.http, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[0], "max_tokens": 4}),
              {"Content-Type": "application/json", "X-Request-Id": "json-7"})
    r = c.getresponse()
    r.read()
    c.close()
    ok &= check(r.status == 200, "served: %d" % r.status)
    time.sleep(0.3)
    for name in ("conductor", "p0", "d0"):
        objs, bad = [], []
        with open(cl.logs[name]) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    objs.append(json.loads(line))
                except ValueError:
                    bad.append(line)
        ok &= check(objs and not bad, "%s: %d JSON lines, not JSON: %s" % (name, len(objs), bad[:2]))
        ok &= check(all({"time", "level", "subsystem", "process", "message"} <= set(o)
                        for o in objs), "%s: every line has the fields" % name)
        if name != "d0":
            tagged = [o for o in objs if o.get("request_id") == "json-7"]
            ok &= check(tagged and all(isinstance(o.get("request"), int) for o in tagged),
                        "%s: lines about the request carry request_id and request (%d)" %
                        (name, len(tagged)))
    return ok


def case_dashboard():
    """deploy/grafana/tycho-dashboard.json: every metric its queries name is exported by a
    running cluster (Conductor, prefill and decode nodes, tycho-store with the KV pool), and
    every label it selects or groups by is one those metrics carry (a renamed metric or label
    would leave a panel empty without an error)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "deploy",
                        "grafana", "tycho-dashboard.json")
    with open(path) as f:
        dash = json.load(f)
    cl = Cluster(1, 1, kv_pool=True, conductor_pool=True)
    ok = True
    for i in range(3):
        st, _ = cl.post("/v1/completions", {"prompt": PROMPTS[i] + " " + LONG_A, "max_tokens": 8})
        ok &= check(st == 200, "request %d served" % i)
    time.sleep(1.0)  # heartbeats carry the nodes' figures to the Conductor
    series = {}
    for m in (cl.metrics(), node_metrics(cl, "p0"), node_metrics(cl, "d0"), store_metrics(cl)):
        series.update(m)
    labels = {}  # metric name -> label names seen
    for k in series:
        name, _, rest = k.partition("{")
        labels.setdefault(name, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest))
    base = {}  # histogram samples answer for their family name too
    for name in labels:
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf):
                base.setdefault(name[:-len(suf)], set()).update(labels[name])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    ok &= check(len(exprs) >= 20 and all(p.get("datasource", {}).get("uid") == "${datasource}"
                                         for p in dash["panels"] if p["type"] != "row"),
                "the dashboard has %d queries on the datasource variable" % len(exprs))
    missing, bad_labels = set(), set()
    for e in exprs:
        names = set(re.findall(r"\b((?:tycho_|vllm:)[a-zA-Z0-9_:]*)", e))
        for n in names:
            if n not in labels and n not in base:
                missing.add(n)
        have = set()
        for n in names:
            have |= labels.get(n, set()) | base.get(n, set())
        used = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=~?"', e))
        for grp in re.findall(r"by \(([^)]*)\)", e):
            used |= {x.strip() for x in grp.split(",") if x.strip()}
        for lab in used - {"le", "instance", "job"}:
            if lab not in have:
                bad_labels.add((lab, e[:60]))
    ok &= check(not missing, "every metric the dashboard queries is exported: missing %s" %
                sorted(missing))
    ok &= check(not bad_labels, "every label it uses is on its metrics: %s" % sorted(bad_labels))
    return ok


def post_port(port, body, timeout=30):
    """(status, parsed body or None) of POST /v1/completions on a loopback HTTP port; status 0
    when the connection fails."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, (json.loads(data) if r.status == 200 else None)
    except (OSError, http.client.HTTPException):
        return 0, None


def case_two_conductors():
    """Two Conductors side by side, every node registered with both (conductor_address lists
    them): SIGKILL one under load; the other serves every request correctly and no node
    registers with it again; the killed one, restarted on its ports, gets every node back and
    serves."""
    cl = Cluster(0, 0)
    cl.start("conductor2", cl.conductor_argv + ["--listen_port=0", "--rpc_port=0"])
    http2, rpc2 = read_ports(cl.port_file("conductor2"), time.time() + 20)
    http1, rpc1 = cl.http, cl.rpc
    cl.conductor_address = "127.0.0.1:%d,127.0.0.1:%d" % (rpc1, rpc2)
    cl.start_node("prefill", "p0")
    cl.start_node("decode", "d0")
    ok = True
    for name in ("conductor", "conductor2"):
        for node in ("p0", "d0"):
            ok &= check(cl.log_shows(name, "node %s registered" % node, 20),
                        "%s registered with %s" % (node, name))
    # each Conductor learns the prefill node's cached blocks through its own event stream,
    # whichever of them sent the prompt
    st, _ = post_port(http1, {"prompt": LONG_A, "max_tokens": 2})
    ok &= check(st == 200, "a long prompt through the first Conductor")
    end = time.time() + 5
    idx = {}
    while time.time() < end:
        for port in (http1, http2):
            nodes = json.loads(get_status(port, "/status")[1]).get("nodes", [])
            idx[port] = [n.get("index_blocks", 0) for n in nodes if n["id"] == "p0"]
        if all(v and v[0] > 0 for v in idx.values()):
            break
        time.sleep(0.1)
    ok &= check(all(v and v[0] > 0 for v in idx.values()),
                "both Conductors index p0's blocks: %s" % idx)
    ref = generate(PROMPTS[0], 8)["output_ids"]
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    res, stop = [], [False]
    t_kill = [None]

    def load(k):
        i = 0
        while not stop[0]:
            port = (http1, http2)[(i + k) % 2]
            t = time.time()
            st, out = post_port(port, body, 20)
            res.append((port, t, st, out["choices"][0].get("token_ids") if out else None))
            i += 1
            if st == 0:
                time.sleep(0.05)  # refused: do not spin

    ths = [threading.Thread(target=load, args=(k,)) for k in range(2)]
    for t in ths:
        t.start()
    time.sleep(2.0)
    cl.procs["conductor"].send_signal(signal.SIGKILL)
    cl.procs["conductor"].wait()
    t_kill[0] = time.time()
    time.sleep(6.0 if SLOW else 3.0)
    stop[0] = True
    for t in ths:
        t.join(30)
    on2 = [r for r in res if r[0] == http2]
    after1 = [r for r in res if r[0] == http1 and r[1] > t_kill[0]]
    print("  %d requests: %d to the survivor (%d after the kill), %d to the dead one after it" %
          (len(res), len(on2), len([r for r in on2 if r[1] > t_kill[0]]), len(after1)))
    ok &= check(len([r for r in on2 if r[1] > t_kill[0]]) >= 2,
                "the survivor got requests after the kill")
    ok &= check(all(r[2] == 200 and r[3] == ref for r in on2),
                "every request to the survivor answered 200 with the greedy ids: %s" %
                [(r[2], r[3] == ref) for r in on2 if r[2] != 200 or r[3] != ref][:5])
    ok &= check(all(r[2] == 0 for r in after1), "the dead one refuses connections")
    log2 = open(cl.logs["conductor2"]).read()
    ok &= check(log2.count("node p0 registered") == 1 and log2.count("node d0 registered") == 1,
                "no node registered again with the survivor")
    # the killed one comes back on its ports; the nodes register with it again
    cl.start("conductor", cl.conductor_argv + ["--listen_port=%d" % http1,
                                               "--rpc_port=%d" % rpc1])
    end = time.time() + 20
    while time.time() < end and not all(
            open(cl.logs["conductor"]).read().count("node %s registered" % n) >= 2
            for n in ("p0", "d0")):
        time.sleep(0.1)
    ok &= check(all(open(cl.logs["conductor"]).read().count("node %s registered" % n) >= 2
                    for n in ("p0", "d0")), "both nodes registered with the restarted Conductor")
    st, out = post_port(http1, body)
    ok &= check(st == 200 and out["choices"][0].get("token_ids") == ref,
                "the restarted Conductor serves (%d)" % st)
    st, out = post_port(http2, body)
    ok &= check(st == 200 and out["choices"][0].get("token_ids") == ref, "and so does the other")
    log2 = open(cl.logs["conductor2"]).read()
    ok &= check(log2.count("node p0 registered") == 1 and log2.count("node d0 registered") == 1,
                "still no node registered again with the survivor")
    return ok


def case_decode_same_port():
    """A decode node restarted on the same ports (as systemd restarts a unit with fixed ports)
    has its KV memory elsewhere: the prefill node, which knew the segment by that name, opens
    it afresh instead of refusing the new destination."""
    cl = Cluster(1, 0)
    ports = ["--listen_port=%d" % free_port(), "--transfer_port=%d" % free_port()]
    cl.start_node("decode", "d0", extra=ports)
    cl.wait_nodes(2)
    ok = True
    ref = generate(PROMPTS[0], 8)["output_ids"]
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    for turn in range(3):
        st, data = cl.post("/v1/completions", body)
        ids = json.loads(data)["choices"][0].get("token_ids") if st == 200 else None
        ok &= check(st == 200 and ids == ref, "turn %d: served with the greedy ids (%d)" %
                    (turn, st))
        cl.procs["d0"].send_signal(signal.SIGKILL)
        cl.procs["d0"].wait()
        cl.start_node("decode", "d0", extra=ports)
        end = time.time() + 15
        while time.time() < end and open(cl.logs["conductor"]).read().count(
                "node d0 registered") < turn + 2:
            time.sleep(0.05)
    st, data = cl.post("/v1/completions", body)
    ok &= check(st == 200 and json.loads(data)["choices"][0].get("token_ids") == ref,
                "after the last restart too (%d)" % st)
    return ok


def case_gpu():
    """The cluster on a GPU (scripts/gpu-check.sh runs it; exit 77 without a CUDA device):
    Conductor + prefill (cuda) + decode (cuda) as separate processes on one GPU give the ids of
    `tycho generate --backend cuda` (the engine `tycho serve --backend cuda` runs) and of the
    CPU engine: stories260K, 8 prompts x 256 tokens, the KV handed off by CUDA IPC (what
    transport auto picks between two cuda nodes on one host); a 1.1B random model
    (TYCHO_GPU_1B_MODEL), 4 prompts x 64; the handoff forced over tcp; a KV pool hit on a new prefill node; a decode
    node killed mid-stream (an error within 5 s, the prefill node keeps serving)."""
    probe = subprocess.run([TYCHO, "generate", "--model", MODEL, "--prompt", "Hi", "-n", "1",
                            "--backend", "cuda", "--json"], capture_output=True, text=True)
    if probe.returncode != 0:
        print("skip: no CUDA device (%s)" % probe.stderr.strip()[-200:])
        return 77
    cuda = ["--backend=cuda"]
    ok = True

    def run(cl, prompts, n, model, label, ref_extra=("--backend", "cuda")):
        nonlocal ok
        bad = 0
        for p in prompts:
            ref = generate(p, n, model, ["--ignore-eos", *ref_extra])
            st, body = cl.post("/v1/completions", {"prompt": p, "max_tokens": n,
                                                   "temperature": 0, "ignore_eos": True,
                                                   "return_token_ids": True}, timeout=120)
            got = json.loads(body)["choices"][0].get("token_ids") if st == 200 else None
            bad += got != ref["output_ids"]
        ok &= check(bad == 0, "%s: %d of %d prompts x %d tokens differ from generate %s" %
                    (label, bad, len(prompts), n, " ".join(ref_extra) or "(cpu)"))

    cl = Cluster(1, 1, node_args=cuda)
    run(cl, PROMPTS[:8], 256, MODEL, "stories260K, cuda nodes")
    run(cl, PROMPTS[:8], 256, MODEL, "stories260K, cuda nodes vs the CPU engine", ())
    dm = node_metrics(cl, "d0")
    info = [k for k in dm if k.startswith("tycho_node_info{")]
    ok &= check(info and 'backend="cuda"' in info[0] and 'device="cuda:0"' in info[0],
                "the decode node runs on cuda:0: %s" % info)
    xp = {t: kv_bytes(dm, "received", t) for t in ("tcp", "local", "rdma", "cuda_ipc")}
    print("  KV received by transport:", xp)
    ok &= check(xp["cuda_ipc"] > 0 and xp["tcp"] == 0,
                "two cuda nodes on one host hand KV off by CUDA IPC (transport auto): %s" % xp)
    cl.stop()
    big = os.environ.get("TYCHO_GPU_1B_MODEL")
    if big and os.path.exists(big):
        cl = Cluster(1, 1, model=big, node_args=cuda + ["--kv_cache_memory=4G"])
        run(cl, PROMPTS[:4], 64, big, "1.1B random, cuda nodes")
        cl.stop()
    else:
        print("  (no TYCHO_GPU_1B_MODEL: the 1.1B part is left out)")
    cl = Cluster(1, 1, node_args=cuda + ["--transfer.transport=tcp"])
    run(cl, PROMPTS[8:12], 64, MODEL, "stories260K, handoff forced over tcp")
    ok &= check(kv_bytes(node_metrics(cl, "d0"), "received", "tcp") > 0,
                "the forced handoff came over tcp")
    cl.stop()
    # a pool hit: the prompt's blocks written by p0, read by p1 that never saw it
    cl = Cluster(1, 1, kv_pool=True, node_args=cuda)
    long = PROMPTS[18]
    ref = generate(long, 32, MODEL, ["--ignore-eos", "--backend", "cuda"])
    cached = []
    for turn in range(2):
        if turn:
            cl.procs["p0"].send_signal(signal.SIGTERM)
            cl.procs["p0"].wait(10)
            cl.start_node("prefill", "p1")
            cl.wait_nodes(2)
            time.sleep(1.0)  # the Conductor drops p0 after its heartbeat timeout
        st, body = cl.post("/v1/completions", {"prompt": long, "max_tokens": 32,
                                               "temperature": 0, "ignore_eos": True,
                                               "return_token_ids": True}, timeout=120)
        b = json.loads(body) if st == 200 else {}
        ok &= check(st == 200 and b["choices"][0]["token_ids"] == ref["output_ids"],
                    "pool turn %d: ids equal generate --backend cuda" % turn)
        cached.append(b.get("usage", {}).get("prompt_tokens_details", {})
                      .get("cached_tokens", -1))
    ok &= check(cached[0] == 0 and cached[1] > 0, "the new prefill node read the prompt's "
                "blocks from the pool into device pages: cached tokens %s" % cached)
    cl.stop()
    # decode killed mid-stream
    cl = Cluster(1, 1, node_args=cuda)
    res = {}
    t = threading.Thread(target=stream, args=(cl, PROMPTS[0], 4000, res, 0, 60,
                                              {"ignore_eos": True}))
    t.start()
    time.sleep(1.5)
    t_kill = time.time()
    cl.procs["d0"].send_signal(signal.SIGKILL)
    cl.procs["d0"].wait()
    t.join(30)
    r = res.get(0)
    ok &= check(r and r[3] is not None and r[4] - t_kill < 5,
                "the client of the killed decode node got an error within 5 s: %s" %
                (r and (len(r[0]), r[3], round(r[4] - t_kill, 2))))
    cl.start_node("decode", "d1")
    cl.wait_nodes(3)
    time.sleep(2.0)
    run(cl, PROMPTS[1:3], 32, MODEL, "after the kill, the prefill node serves a new decode node")
    return ok


def ensure_cluster_secret():
    """The daemons prove a cluster secret to each other (docs/arch/security.md): ctest gives
    one (TYCHO_CLUSTER_SECRET_FILE); run by hand, a throwaway one is made."""
    if os.environ.get("TYCHO_CLUSTER_SECRET_FILE"):
        return
    d = tempfile.mkdtemp(prefix="tycho-secret-")
    path = os.path.join(d, "cluster.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    os.environ["TYCHO_CLUSTER_SECRET_FILE"] = path


def main():
    ensure_cluster_secret()
    if not os.path.exists(MODEL):
        print("skip: no " + MODEL)
        return 77
    case = {"equal": case_equal, "concurrent": case_concurrent,
            "kill_decode": case_kill_decode, "hung_decode": case_hung_decode,
            "prefix_routing": case_prefix_routing, "cache_events": case_cache_events,
            "slo_reject": case_slo_reject, "cost_refit": case_cost_refit,
            "slow_prefill": case_slow_prefill,
            "overload_answers": case_overload_answers, "stale_model": case_stale_model,
            "phantom_credit": case_phantom_credit, "kv_pool": case_kv_pool,
            "pool_sched": case_pool_sched, "pool_decode": case_pool_decode,
            "pool_streaming": case_pool_streaming,
            "pool_snapshot": case_pool_snapshot, "kv_f16": case_kv_f16,
            "prefill_batch": case_prefill_batch,
            "batch_admission": case_batch_admission,
            "slo_reload": case_slo_reload,
            "slo_class": case_slo_class,
            "status": case_status, "preempt": case_preempt,
            "kill_prefill": case_kill_prefill, "prefill_interleave": case_prefill_interleave,
            "sliding_window": case_sliding_window, "moe": case_moe, "gptoss": case_gptoss,
            "deepseek2": case_deepseek2, "longctx": case_longctx, "cpp": case_cpp,
            "local_cluster": case_local_cluster, "handshake": case_handshake,
            "bad_destination": case_bad_destination, "transports": case_transports,
            "gpu": case_gpu, "watchdog": case_watchdog,
            "request_id": case_request_id, "auth": case_auth, "flood": case_flood, "fence": case_fence,
            "mute_decode": case_mute_decode, "mute_prefill": case_mute_prefill,
            "json_logs": case_json_logs, "dashboard": case_dashboard,
            "two_conductors": case_two_conductors, "decode_same_port": case_decode_same_port,
            "peer_fetch": case_peer_fetch, "peer_fetch_miss": case_peer_fetch_miss}[CASE]
    ok = False
    try:
        ok = case()
    finally:
        for cl in Cluster.started:
            cl.stop()
        if not ok:
            for cl in Cluster.started:
                print(cl.dump())
        for d in TMPDIRS + [cl.dir for cl in Cluster.started]:
            shutil.rmtree(d, ignore_errors=True)
    if not isinstance(ok, bool) and ok == 77:  # the case skipped itself
        return 77
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

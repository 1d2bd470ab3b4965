#!/usr/bin/env python3
"""The README's run command, scripts/serve.sh, as a user runs it (less the install and build:
SERVE_NO_BUILD=1 with this build's binaries): it starts the disaggregated cluster (a Conductor,
one prefill and one decode daemon, a KV-pool node, each its own process) on a free port, prints
the API's URL, the `tycho status --url` command and "Ctrl-C stops all"; a streamed and a plain
/v1/completions request answer what `tycho generate` does; the printed status command shows the
nodes; SIGINT (Ctrl-C) to the script leaves none of the four daemons running.

Usage: test_serve_script.py BUILD_DIR. Exits 77 when the shared test data (stories260K) is
missing.
"""
import http.client
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BUILD = os.path.abspath(sys.argv[1])
DATA = os.environ.get("TYCHO_TEST_DATA", "")
MODEL = os.path.join(DATA, "models/stories260K/stories260K.gguf")
TYCHO = os.path.join(BUILD, "src/cli/tycho")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
SCRIPT = os.path.join(ROOT, "scripts/serve.sh")
PROMPT = "Once upon a time"
N = 24


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    return bool(cond)


def read_until(proc, marker, deadline):
    """The script's output up to and including the line holding marker ("" when it ended or
    the deadline passed first)."""
    out = ""
    fd = proc.stdout.fileno()
    while time.time() < deadline:
        if not select.select([fd], [], [], 0.2)[0]:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 4096).decode(errors="replace")
        if not chunk:
            break
        out += chunk
        if marker in out:
            rest = out[out.index(marker):]
            if "\n" in rest:
                return out
    print(out)
    return ""


def running(pid):
    """Whether pid is a live process (a zombie, exited but not yet reaped by whoever adopted
    it, is not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def processes_naming(text):
    """Live processes whose command line holds text (the daemons name the cluster folder in
    their --port_file)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and running(int(d)):
            out.append("%s %s" % (d, cmd.strip()))
    return out


def completion(port, stream):
    """Greedy completion of PROMPT: (token ids, text, error)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions",
              json.dumps({"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                          "return_token_ids": True, "stream": stream}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return None, None, "http %d %s" % (r.status, r.read()[:200])
    if not stream:
        ch = json.loads(r.read())["choices"][0]
        return ch.get("token_ids"), ch.get("text"), None
    ids, text = [], ""
    while True:
        line = r.readline()
        if not line:
            return ids, text, "stream ended without [DONE]"
        line = line.strip()
        if line == b"data: [DONE]":
            return ids, text, None
        if line.startswith(b"data: "):
            ev = json.loads(line[6:])
            if "error" in ev:
                return ids, text, ev["error"].get("message", "error")
            ch = ev["choices"][0]
            ids += ch.get("token_ids") or []
            text += ch.get("text", "")


def main():
    if not os.path.exists(MODEL):
        print("skip: TYCHO_TEST_DATA has no models/stories260K/stories260K.gguf")
        return 77
    ref = json.loads(subprocess.run([TYCHO, "generate", "--model", MODEL, "--prompt", PROMPT,
                                     "-n", str(N), "--temp", "0", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    state = tempfile.mkdtemp(prefix="tycho-serve-test-")
    env = dict(os.environ, SERVE_NO_BUILD="1", BUILD_DIR=BUILD, TYCHO_CLUSTER_DIR=state)
    proc = subprocess.Popen(["bash", SCRIPT, "--port", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    ok = True
    pids = {}
    try:
        out = read_until(proc, "Ctrl-C stops all", time.time() + 60)
        ok &= check(out != "", "serve.sh printed 'Ctrl-C stops all'")
        if not out:
            return 1
        print(out, end="")
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", out)
        ok &= check(m is not None, "serve.sh printed the API's URL")
        port = int(m.group(1))
        url = "http://127.0.0.1:%d" % port
        sm = re.search(r"^Watch it:\s+(.*status --url " + re.escape(url) + r")\s*$", out, re.M)
        ok &= check(sm is not None, "serve.sh printed how to watch it: tycho status --url %s"
                    % url)
        for f in os.listdir(state):
            if f.endswith(".pid"):
                with open(os.path.join(state, f)) as fh:
                    pids[f[:-4]] = int(fh.read())
        ok &= check(sorted(pids) == ["conductor", "decode-0", "prefill-0", "store"] and
                    all(running(p) for p in pids.values()),
                    "four daemons running, each its own process: %s" % pids)
        for stream in (False, True):
            ids, text, err = completion(port, stream)
            ok &= check(err is None and ids == ref["output_ids"] and text == ref["text"],
                        "%s completion of %r equals tycho generate's (%s %r, want %r)"
                        % ("streamed" if stream else "plain", PROMPT, err, text, ref["text"]))
        if sm:
            # the printed command, run from the repository root as a user would
            st = subprocess.run(shlex.split(sm.group(1)) + ["--json"], cwd=ROOT,
                                capture_output=True, text=True, timeout=30)
            roles = sorted(n.get("role", "") for n in json.loads(st.stdout or "{}")
                           .get("nodes", [])) if st.returncode == 0 else st.stderr
            ok &= check(roles == ["decode", "prefill"],
                        "the printed status command lists the prefill and decode nodes (%s)"
                        % roles)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        ok &= check(rc == 0, "SIGINT: serve.sh exited with 0 (%s)" % rc)
        end = time.time() + 5
        while time.time() < end and any(running(p) for p in pids.values()):
            time.sleep(0.1)
        left = {n: p for n, p in pids.items() if running(p)}
        ok &= check(not left, "SIGINT: none of the four daemons is left running (%s)" % left)
        stray = processes_naming(state)
        ok &= check(not stray, "no process of the cluster is left (%s)" % stray)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in pids.values():
            if running(p):
                os.kill(p, signal.SIGKILL)
        if not ok:
            for f in sorted(os.listdir(state)):
                if f.endswith(".log"):
                    with open(os.path.join(state, f)) as fh:
                        print("==== %s\n%s" % (f, fh.read()[-3000:]))
        shutil.rmtree(state, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

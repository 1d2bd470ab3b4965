#!/usr/bin/env python3
"""Long context through `tycho serve`: a model of 128k context (mkmodel --ctx 131072, a tiny
shape so that a 32k-token prefill takes seconds on two cores).

- a 32,000-token prompt (8,000 under TYCHO_SANITIZER_SLOW=1) is answered with the ids of
  `tycho generate` (a separate code path: ty_engine_generate, not the server's batcher) and
  usage.prompt_tokens equal to its length;
- a prompt + max_tokens over the model's context gets a 400 (invalid_request_error,
  context_length_exceeded) naming the context, the prompt and max_tokens, and the server
  answers the next request;
- with a KV cache smaller than the model's context (engine.kv_pages), a prompt over what the
  cache holds gets a 400 naming the cache's tokens and pages, and a prompt within it an answer.

Usage: test_longctx.py TYCHO_BINARY
"""
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../pylib"))
from tyports import free_port  # noqa: E402

TYCHO = sys.argv[1]
SLOW = os.environ.get("TYCHO_SANITIZER_SLOW") == "1"
CTX = 131072
P = 8000 if SLOW else 32000  # the long prompt
N = 8                        # tokens answered


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    return bool(cond)


def prompt_ids(n, seed):
    r = random.Random(seed)
    return [3 + r.randrange(256) for _ in range(n)]  # the byte vocabulary's bytes


class Server:
    def __init__(self, model, log, *extra):
        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [TYCHO, "serve", "--model", model, "--port", str(self.port),
             "--limits.max_body_bytes=1M", "--engine.threads=2", *extra],
            stdout=self.log, stderr=self.log)
        end = time.time() + 30
        while time.time() < end:
            try:
                if self.call("GET", "/health", None, 5)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def call(self, method, path, body, timeout=280):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, None if body is None else json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data) if data.startswith(b"{") else data

    def complete(self, ids, max_tokens):
        return self.call("POST", "/v1/completions",
                         {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                          "ignore_eos": True, "return_token_ids": True})

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def limit_error(st, body, *words):
    """A 400 context_length_exceeded whose message holds every one of `words`."""
    err = body.get("error", {}) if isinstance(body, dict) else {}
    msg = err.get("message", "")
    return (st == 400 and err.get("type") == "invalid_request_error" and
            err.get("code") == "context_length_exceeded" and
            all(str(w) in msg for w in words)), msg


def main():
    tmp = tempfile.mkdtemp(prefix="tycho-longctx-")
    servers = []
    ok = True
    try:
        model = os.path.join(tmp, "long.gguf")
        subprocess.run([TYCHO, "mkmodel", "--dims", "32,2,2,1,64", "--ctx", str(CTX), "--seed",
                        "7", "--vocab-from", "bytes", "--out", model], check=True,
                       capture_output=True)
        ids = prompt_ids(P, 5)
        idfile = os.path.join(tmp, "ids.txt")
        with open(idfile, "w") as f:
            f.write(",".join(map(str, ids)))
        ref = json.loads(subprocess.run(
            [TYCHO, "generate", "--model", model, "--prompt-ids", "@" + idfile, "-n", str(N),
             "--ignore-eos", "--json", "--threads", "2"], check=True, capture_output=True,
            text=True).stdout)
        ok &= check(ref["n_prompt"] == P and len(ref["output_ids"]) == N,
                    "generate: %d-token prompt, %d tokens" % (ref["n_prompt"], N))

        sv = Server(model, os.path.join(tmp, "serve.log"))
        servers.append(sv)
        st, body = sv.call("GET", "/v1/models", None)
        got = body["data"][0].get("max_model_len") if st == 200 else None
        ok &= check(got == CTX, "max_model_len is the model's own context (%s)" % got)
        t0 = time.time()
        st, body = sv.complete(ids, N)
        ch = body["choices"][0] if st == 200 else {}
        ok &= check(st == 200 and ch.get("token_ids") == ref["output_ids"],
                    "%d-token prompt answered in %.1f s: %s vs generate %s" %
                    (P, time.time() - t0, ch.get("token_ids"), ref["output_ids"]))
        usage = body.get("usage", {}) if st == 200 else {}
        ok &= check(usage.get("prompt_tokens") == P and usage.get("completion_tokens") == N,
                    "usage %s" % usage)
        # over the model's context: the prompt alone, and prompt + max_tokens
        over = CTX - P + 1
        st, body = sv.complete(ids, over)
        good, msg = limit_error(st, body, CTX, P, over)
        ok &= check(good, "prompt + max_tokens over the context: %d %s" % (st, msg))
        st, body = sv.call("POST", "/v1/completions",
                           {"prompt": prompt_ids(CTX, 6), "max_tokens": 1})
        good, msg = limit_error(st, body, CTX, CTX)
        ok &= check(good, "a prompt of the whole context: %d %s" % (st, msg))
        st, body = sv.complete(ids[:100], 4)
        ok &= check(st == 200 and len(body["choices"][0]["token_ids"]) == 4,
                    "the server answers the next request (%d)" % st)

        # a KV cache of 128 pages of 64 tokens: 8192 tokens per sequence, less than the model's
        small = Server(model, os.path.join(tmp, "serve-small.log"), "--engine.kv_pages=128")
        servers.append(small)
        st, body = small.complete(prompt_ids(9000, 8), 4)
        good, msg = limit_error(st, body, "8192", "9000", "128 pages of 64 tokens", CTX)
        ok &= check(good, "a prompt over the KV cache: %d %s" % (st, msg))
        st, body = small.complete(prompt_ids(8000, 9), 4)
        ok &= check(st == 200 and len(body["choices"][0]["token_ids"]) == 4 and
                    body["usage"]["prompt_tokens"] == 8000,
                    "a prompt within the KV cache is answered (%d)" % st)
    finally:
        for s in servers:
            s.stop()
        if not ok:
            for name in ("serve.log", "serve-small.log"):
                try:
                    with open(os.path.join(tmp, name)) as f:
                        print("==== %s\n%s" % (name, f.read()[-3000:]))
                except OSError:
                    pass
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Structured output and tool calls end to end: `tycho serve` on stories260K, driven by the official
`openai` npm client, its answers checked by the `ajv` JSON-schema validator (structured.mjs).

Usage: test_structured.py TYCHO_BINARY. Exits 77 (skip) when the shared test data, node, or the
openai/ajv peers (TYCHO_PEERS_DIR/openai, made by scripts/install-peers.sh) are missing. The server
is started here the way tests/integration/serve/test_serve.py starts it; after the client is done
it must still answer /health and exit 0 on SIGTERM (bad schemas and tools must not have hurt it).
"""
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../pylib"))
from tyports import free_port  # noqa: E402

TYCHO = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("TYCHO_TEST_DATA", os.path.join(HERE, "../../../../shared"))
MODEL = os.path.join(DATA, "models/stories260K/stories260K.gguf")
PEER = os.path.join(os.environ.get("TYCHO_PEERS_DIR") or "/opt/tycho-peers", "openai")


def skip_reason():
    node = shutil.which("node")
    if not node:
        return "no node on PATH"
    if not os.path.exists(MODEL):
        return "no " + MODEL
    for pkg in ("openai", "ajv"):
        if not os.path.exists(os.path.join(PEER, "node_modules", pkg, "package.json")):
            return f"no {pkg} in {PEER} (run scripts/install-peers.sh)"
    return None


def health(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        st = c.getresponse().status
        c.close()
        return st
    except OSError:
        return None


def main():
    why = skip_reason()
    if why:
        print("skip:", why)
        sys.exit(77)
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    srv = subprocess.Popen([TYCHO, "serve", "--model", MODEL, "--port", str(port),
                            "--api-key", "k1"], stderr=log, text=True)
    failed = False
    try:
        deadline = time.time() + 20
        while health(port) != 200:
            if time.time() > deadline or srv.poll() is not None:
                log.seek(0)
                print("FAIL: server did not start:", log.read()[-4000:])
                sys.exit(1)
            time.sleep(0.05)
        env = dict(os.environ, TYCHO_BASE_URL=f"http://127.0.0.1:{port}/v1",
                   TYCHO_API_KEY="k1", TYCHO_OPENAI_PEER=PEER,
                   TYCHO_SCHEMA_DIR=os.path.join(HERE, "schemas"))
        try:
            rc = subprocess.run(["node", os.path.join(HERE, "structured.mjs")], env=env,
                                timeout=270).returncode
        except subprocess.TimeoutExpired:
            rc = "a timeout (270 s)"
        if rc != 0:
            print(f"FAIL: structured.mjs exited {rc}")
            failed = True
        alive = srv.poll() is None and health(port) == 200
        print("ok:" if alive else "FAIL:", "server still answers /health after the client")
        failed |= not alive
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(15)
            except subprocess.TimeoutExpired:
                srv.kill()
        rc = srv.wait()
        if rc != 0 or failed:
            log.seek(0)
            print("server log (tail):\n" + log.read()[-4000:])
    print("ok:" if rc == 0 else "FAIL:", f"SIGTERM exits 0 (got {rc})")
    sys.exit(1 if failed or rc != 0 else 0)


main()

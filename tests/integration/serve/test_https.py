#!/usr/bin/env python3
"""HTTPS and hashed API keys on `tycho serve` (stories260K): a real server on a loopback port
with a self-signed certificate the `openssl` CLI makes in a temporary folder.

Usage: test_https.py TYCHO_BINARY CASE
  https         curl --cacert gets a completion and a stream, keep-alive holds, plain HTTP to
                the port gets nothing
  reload        a SIGHUP after the files are replaced: new connections see the new certificate
                (its fingerprint from `openssl s_client`), an open one keeps working; a bad new
                pair is logged and the running one stays
  apikey        a `sha256:` entry in api_keys accepts its token and refuses others (401)
  check_config  check-config exits 2 naming tls_cert / tls_key: missing file, a key that does
                not match, one of the two alone; the daemon refuses to start the same way
Exits 77 without the shared test data (all but check_config), curl or openssl.
"""
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../pylib"))
from tyports import free_port  # noqa: E402

TYCHO = sys.argv[1]
CASE = sys.argv[2]
DATA = os.environ.get("TYCHO_TEST_DATA", "")
MODEL = os.path.join(DATA, "models/stories260K/stories260K.gguf")


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok:", what)


def make_pair(d, name, key_type="rsa:2048"):
    """A self-signed certificate for 127.0.0.1/localhost: (cert path, key path)."""
    cert, key = os.path.join(d, name + ".crt"), os.path.join(d, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", key_type, "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", "/CN=tycho-test-" + name,
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


def fingerprint_of_file(cert):
    out = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-fingerprint", "-sha256"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1]


def fingerprint_served(port):
    """The SHA-256 fingerprint of the certificate a new connection to the port is served."""
    s = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}",
                        "-servername", "localhost"], input="", capture_output=True, text=True,
                       timeout=10)
    x = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=s.stdout,
                       capture_output=True, text=True)
    return x.stdout.strip().split("=", 1)[1] if x.returncode == 0 else None


def curl(port, path, cacert, body=None, token=None, scheme="https", stream=False):
    """(exit code, HTTP status or 0, body) of one curl request."""
    cmd = ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}",
           "--cacert", cacert, f"{scheme}://127.0.0.1:{port}{path}"]
    if stream:
        cmd.insert(1, "-N")
    if token:
        cmd += ["-H", "Authorization: Bearer " + token]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    text, _, code = r.stdout.rpartition("\n")
    return r.returncode, int(code or 0), text


class Server:
    def __init__(self, cert, key, *extra):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [TYCHO, "serve", "--model", MODEL, "--port", str(self.port), "--tls-cert", cert,
             "--tls-key", key, *extra], stderr=self.log, text=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start: " + self.stderr())

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


COMPLETION = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}


def case_https(d):
    cert, key = make_pair(d, "a")
    srv = Server(cert, key)
    try:
        check("serving stories260K" in srv.stderr() and f"https://127.0.0.1:{srv.port}/v1"
              in srv.stderr(), "the start line says https")
        rc, st, body = curl(srv.port, "/v1/completions", cert, COMPLETION)
        check(rc == 0 and st == 200 and json.loads(body)["choices"][0]["text"],
              f"curl --cacert over https gets a completion ({rc}, {st})")
        rc, st, body = curl(srv.port, "/v1/completions", cert, dict(COMPLETION, stream=True),
                            stream=True)
        events = [e for e in body.split("\n\n") if e.startswith("data: ")]
        check(rc == 0 and st == 200 and events[-1] == "data: [DONE]" and len(events) >= 3,
              f"a streamed completion over https ({len(events)} events)")
        # keep-alive: several requests on one TLS connection
        ctx = ssl.create_default_context(cafile=cert)
        c = http.client.HTTPSConnection("127.0.0.1", srv.port, context=ctx, timeout=20)
        for i in range(3):
            c.request("POST", "/v1/completions", body=json.dumps(COMPLETION),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            check(r.status == 200 and json.loads(r.read())["choices"], f"keep-alive request {i}")
        # a body over many TLS records and socket reads is read whole
        big = json.dumps({"prompt": "a " * 60000, "max_tokens": 1})
        c.request("POST", "/v1/completions", body=big,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        err = json.loads(r.read())
        check(r.status == 400 and "error" in err,
              f"a {len(big)}-byte body over TLS is read and answered ({r.status})")
        c.close()
        # pipelining: two requests in one write, two answers in order
        raw = ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port), timeout=20),
                              server_hostname="localhost")
        raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        while True:
            chunk = raw.recv(65536)
            if not chunk:
                break
            got += chunk
        raw.close()
        check(got.count(b"HTTP/1.1 200") == 2 and got.index(b"stories260K") <
              got.rindex(b"HTTP/1.1 200"), "two pipelined requests over TLS, answered in order")
        rc, st, _ = curl(srv.port, "/health", cert, scheme="http")
        check(rc != 0 and st == 0, f"plain http to the https port gets no response (curl {rc})")
        # a client that does not trust the certificate is refused by its own TLS check
        rc, st, _ = curl(srv.port, "/health", "/etc/ssl/certs/ca-certificates.crt")
        check(rc != 0, f"curl without the certificate's CA fails verification (curl {rc})")
        rc, st, _ = curl(srv.port, "/health", cert)
        check(rc == 0 and st == 200, "the server still answers after those")
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM exits 0 (got {code})")


def case_reload(d):
    cert, key = os.path.join(d, "live.crt"), os.path.join(d, "live.key")
    a_cert, a_key = make_pair(d, "a")
    b_cert, b_key = make_pair(d, "b", "ec:" + ec_params(d))
    shutil.copy(a_cert, cert)
    shutil.copy(a_key, key)
    srv = Server(cert, key)
    try:
        fa, fb = fingerprint_of_file(a_cert), fingerprint_of_file(b_cert)
        check(fingerprint_served(srv.port) == fa, "the first certificate is served")
        old = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=20,
                                          context=ssl.create_default_context(cafile=a_cert))
        old.request("GET", "/health")
        check(old.getresponse().read() is not None, "a connection opened before the reload")
        for src, dst in ((b_cert, cert), (b_key, key)):
            shutil.copy(src, dst + ".new")
            os.replace(dst + ".new", dst)
        srv.proc.send_signal(signal.SIGHUP)
        deadline, got = time.time() + 10, None
        while time.time() < deadline and got != fb:
            time.sleep(0.1)
            got = fingerprint_served(srv.port)
        check(got == fb, "after SIGHUP new connections see the new certificate")
        old.request("POST", "/v1/completions", body=json.dumps(COMPLETION),
                    headers={"Content-Type": "application/json"})
        r = old.getresponse()
        check(r.status == 200 and json.loads(r.read())["choices"],
              "the connection opened before the reload still works")
        old.close()
        rc, st, body = curl(srv.port, "/v1/completions", b_cert, COMPLETION)
        check(rc == 0 and st == 200, "curl --cacert NEW gets a completion")
        # a bad new pair: logged, the running one stays
        with open(cert, "w") as f:
            f.write("not a certificate\n")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while time.time() < deadline and "reload failed" not in srv.stderr():
            time.sleep(0.1)
        log = srv.stderr()
        check("reload failed" in log and "tls_cert" in log,
              "a bad certificate on SIGHUP is logged naming tls_cert")
        check(fingerprint_served(srv.port) == fb, "and the running certificate stays")
        # a key that does not match
        shutil.copy(b_cert, cert)
        shutil.copy(a_key, key)
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while time.time() < deadline and "does not match" not in srv.stderr():
            time.sleep(0.1)
        check("does not match" in srv.stderr(), "a key that does not match is logged")
        rc, st, _ = curl(srv.port, "/health", b_cert)
        check(rc == 0 and st == 200 and fingerprint_served(srv.port) == fb,
              "the server keeps serving the running pair")
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM exits 0 (got {code})")


def ec_params(d):
    p = os.path.join(d, "ec.pem")
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-out", p], check=True,
                   capture_output=True)
    return p


def case_apikey(d):
    cert, key = make_pair(d, "a")
    good, plain = "tk-right-0123456789", "plain-key-abc"
    digest = hashlib.sha256(good.encode()).hexdigest()
    out = subprocess.run(["sh", "-c", 'printf %s "$KEY" | sha256sum'], env={"KEY": good},
                         capture_output=True, text=True).stdout.split()[0]
    check(out == digest, "the documented sha256sum recipe gives the digest")
    srv = Server(cert, key, f"--api_keys=[sha256:{digest}, {plain}]")
    try:
        rc, st, _ = curl(srv.port, "/v1/completions", cert, COMPLETION, token=good)
        check(st == 200, f"the token of a sha256: entry is accepted ({st})")
        rc, st, _ = curl(srv.port, "/v1/completions", cert, COMPLETION, token=plain)
        check(st == 200, f"a plain entry still works ({st})")
        for bad in ("tk-right-012345678", "tk-right-0123456789x", "wrong",
                    "sha256:" + digest, digest):
            rc, st, body = curl(srv.port, "/v1/models", cert, token=bad)
            check(st == 401 and json.loads(body)["error"], f"token {bad[:24]!r} gets 401")
        rc, st, _ = curl(srv.port, "/v1/models", cert)
        check(st == 401, "no token gets 401")
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM exits 0 (got {code})")


def check_config(args, field, what):
    r = subprocess.run([TYCHO, "check-config", "--role", "serve", "--model_path=/m.gguf", *args],
                       capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    check(r.returncode == 2 and f": {field}: " in out, f"check-config, {what}: exit 2 naming "
          f"{field} ({r.returncode}: {out})")
    return out


def case_check_config(d):
    cert, key = make_pair(d, "a")
    other_cert, other_key = make_pair(d, "b")
    missing = os.path.join(d, "missing.crt")
    out = check_config([f"--tls_cert={missing}", f"--tls_key={key}"], "tls_cert",
                       "a missing certificate")
    check(missing in out, "the message names the file")
    check_config([f"--tls_cert={cert}", f"--tls_key={os.path.join(d, 'nope.key')}"], "tls_key",
                 "a missing key")
    check_config([f"--tls_cert={cert}", f"--tls_key={other_key}"], "tls_key",
                 "a key that does not match")
    check_config([f"--tls_cert={cert}"], "tls_key", "tls_cert alone")
    check_config([f"--tls_key={key}"], "tls_cert", "tls_key alone")
    check_config([f"--tls_cert={key}", f"--tls_key={key}"], "tls_cert", "a key as certificate")
    check_config([f"--tls_cert={cert}", f"--tls_key={cert}"], "tls_key", "a certificate as key")
    check_config(["--api_keys=[sha256:1234]"], "api_keys[0]", "a short sha256: entry")
    yaml = os.path.join(d, "conductor.yaml")
    with open(yaml, "w") as f:
        f.write(f"model_path: /m.gguf\ntls_cert: {cert}\n")
    r = subprocess.run([TYCHO, "check-config", "--role", "conductor", "--config", yaml],
                       capture_output=True, text=True)
    check(r.returncode == 2 and f"{yaml}: tls_key: " in r.stderr + r.stdout,
          "a conductor file with tls_cert alone: exit 2, file and field named")
    with open(yaml, "w") as f:
        f.write(f"model_path: /m.gguf\ntls_cert: {cert}\ntls_key: {key}\n"
                "api_keys: [sha256:" + "ab" * 32 + "]\n")
    r = subprocess.run([TYCHO, "check-config", "--role", "conductor", "--config", yaml],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"a good pair and a hashed key pass ({r.stdout + r.stderr})")
    r = subprocess.run([TYCHO, "serve", "--model", "/m.gguf", "--tls-cert", cert, "--tls-key",
                        other_key], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and ": tls_key: " in r.stderr,
          f"tycho serve refuses to start with a key that does not match ({r.returncode})")


def main():
    for tool in ("openssl", "curl"):
        if not shutil.which(tool):
            print("skip: no", tool)
            sys.exit(77)
    if CASE != "check_config" and not os.path.exists(MODEL):
        print("skip: no", MODEL)
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="tycho-https-") as d:
        globals()["case_" + CASE](d)


main()

#!/usr/bin/env python3
"""`tycho render-chat` against the Hugging Face reference (hf_reference.py, python3-jinja2).

usage: test_chat_templates.py TYCHO_BINARY
For every tokenizer directory under $TYCHO_TEST_DATA/tokenizers and every request in cases/,
renders with both and requires byte-equal prompts, or an error from both when the template
rejects the request. When the HF `tokenizers` npm peer is installed (see
../tokenizer/hf_tokenize.js), the token ids of `--tokens` must also equal HF's tokenization of
the reference prompt; otherwise that part is skipped. Then the CLI's error paths. Prints a table;
on a mismatch the first differing byte offset with context. Exit 0 pass, 1 fail, 77 skip.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_NOW = "2026-01-02T03:04:05Z"


def skip(why):
    print("skip:", why)
    sys.exit(77)


try:
    sys.path.insert(0, HERE)
    import hf_reference  # needs python3-jinja2
except ImportError as e:
    hf_reference = None
    IMPORT_ERROR = str(e)


def run_tycho(tycho, args, stdin_bytes):
    p = subprocess.run([tycho, "render-chat"] + args, input=stdin_bytes, capture_output=True,
                       timeout=120, env=dict(os.environ, TYCHO_FIXED_NOW=FIXED_NOW))
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace").strip()


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def show_diff(want, got):
    i = first_diff(want, got)
    lo = max(0, i - 60)
    print(f"    first difference at byte {i} (reference {len(want)} bytes, tycho {len(got)})")
    print(f"    reference: {want[lo:i + 60]!r}")
    print(f"    tycho:     {got[lo:i + 60]!r}")


def hf_token_ids(tokdir, texts):
    """HF tokenizers' ids of each text (special tokens recognised, none added), or None."""
    if not texts:
        return []
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    try:
        p = subprocess.run(["node", os.path.join(HERE, "../tokenizer/hf_tokenize.js"),
                            os.path.join(tokdir, "tokenizer.json")], input=lines,
                           capture_output=True, timeout=300)
    except FileNotFoundError:
        return None
    if p.returncode != 0:
        return None
    return [json.loads(line)["ids"] for line in p.stdout.decode().splitlines() if line.strip()]


def check_template(tycho, tokdir, cases, table):
    name = os.path.basename(tokdir)
    fails = 0
    token_checks = []  # (case, reference text, our ids)
    plain_checked = False
    for case in cases:
        cname = os.path.splitext(os.path.basename(case))[0]
        with open(case, "rb") as f:
            body = f.read()
        try:
            want = hf_reference.render(tokdir, json.loads(body)).encode("utf-8")
            ref_err = None
        except hf_reference.TemplateRejected as e:
            want, ref_err = None, str(e)
        rc, got_json, err = run_tycho(tycho, ["--model", tokdir, "--json"], body)
        got = json.loads(got_json)["prompt"].encode("utf-8") if rc == 0 else b""
        if ref_err is not None and rc != 0:
            status = "both error"
        elif ref_err is not None:
            status = "FAIL: tycho rendered, reference error: " + ref_err[:80]
        elif rc != 0:
            status = "FAIL: tycho error: " + err[:100]
        elif got != want:
            status = "FAIL: bytes differ"
        else:
            status = f"equal ({len(got)} bytes)"
            token_checks.append((cname, want.decode("utf-8"), json.loads(got_json)["prompt_token_ids"]))
            if not plain_checked:  # the plain output is the prompt exactly, no newline added
                plain_checked = True
                rc2, raw, err2 = run_tycho(tycho, ["--model", tokdir], body)
                if rc2 != 0 or raw != want:
                    status = f"FAIL: plain output differs from --json prompt (exit {rc2}) {err2}"
        table.append((name, cname, status))
        if status.startswith("FAIL"):
            fails += 1
            print(f"{name} {cname}: {status}")
            if status == "FAIL: bytes differ":
                show_diff(want, got)
    ref_ids = hf_token_ids(tokdir, [t for _, t, _ in token_checks])
    if ref_ids is None:
        table.append((name, "(token ids)", "skipped: HF tokenizers npm peer not installed"))
        return fails
    for (cname, _, ours), theirs in zip(token_checks, ref_ids):
        if ours != theirs:
            fails += 1
            i = first_diff(ours, theirs)
            print(f"{name} {cname}: FAIL token ids differ at {i}: HF {theirs[i:i + 8]} tycho {ours[i:i + 8]}")
    table.append((name, "(token ids)", f"{len(token_checks)} renders tokenized, compared with HF"))
    return fails


def expect_error(tycho, args, body, want_in, label):
    rc, out, err = run_tycho(tycho, args, body)
    ok = rc == 1 and want_in in err
    print(f"cli {label}: {'ok' if ok else 'FAIL'} (exit {rc}: {err[:160]})")
    return 0 if ok else 1


def check_cli(tycho, data):
    qwen = os.path.join(data, "tokenizers", "qwen3")
    fails = 0
    req = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    p = subprocess.run([tycho, "render-chat", "--help"], capture_output=True)
    fails += p.returncode != 0 or b"render-chat" not in p.stdout
    print(f"cli --help: exit {p.returncode}")
    fails += expect_error(tycho, ["--model", qwen], b'{"messages": [', "bad JSON", "bad JSON")
    fails += expect_error(tycho, ["--model", qwen], b'{"messages": 3}', "messages", "messages not array")
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.jinja")
        with open(bad, "w") as f:
            f.write("{{ messages[0].content }}\n{% for m in messages %}\n{% frobnicate %}\n{% endfor %}\n")
        fails += expect_error(tycho, ["--model", qwen, "--chat-template", bad], req, "line 3",
                              "unknown tag names line 3")
        raising = os.path.join(tmp, "raise.jinja")
        with open(raising, "w") as f:
            f.write("{% if messages|length < 2 %}{{ raise_exception('need two messages') }}{% endif %}")
        fails += expect_error(tycho, ["--model", qwen, "--chat-template", raising], req,
                              "need two messages", "raise_exception text")
        good = os.path.join(tmp, "good.jinja")
        with open(good, "w") as f:
            f.write("[{{ eos_token }}]{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}")
        rc, out, err = run_tycho(tycho, ["--model", qwen, "--chat-template", good], req)
        ok = rc == 0 and out == b"[<|im_end|>]user=hi;"
        print(f"cli --chat-template override: {'ok' if ok else 'FAIL'} ({out!r} {err})")
        fails += not ok
    stories = os.path.join(data, "models", "stories260K", "stories260K.gguf")
    if os.path.exists(stories):
        fails += expect_error(tycho, ["--model", stories], req, "no chat template",
                              "GGUF without a template")
    fails += expect_error(tycho, ["--model", "/nonexistent/model"], req, "/nonexistent",
                          "missing model")
    return fails


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tycho = sys.argv[1]
    data = os.environ.get("TYCHO_TEST_DATA") or os.path.join(HERE, "../../../../shared")
    if not os.path.isdir(os.path.join(data, "tokenizers")):
        skip(f"no test data at {data}")
    if hf_reference is None:
        skip("python3-jinja2 missing: " + IMPORT_ERROR)
    os.environ["TYCHO_FIXED_NOW"] = FIXED_NOW  # the reference's strftime_now
    cases = sorted(glob.glob(os.path.join(HERE, "cases", "*.json")))
    tokdirs = sorted(d for d in glob.glob(os.path.join(data, "tokenizers", "*"))
                     if os.path.exists(os.path.join(d, "tokenizer.json")))
    table, fails = [], 0
    # Under a sanitizer (TYCHO_SANITIZER_SLOW=1: each render-chat run loads a 150k-token
    # tokenizer, seconds under TSan, and the whole outlasted 300 s) every template renders a
    # third of the cases, a different third for each template, so that every case still runs;
    # release builds render them all.
    slow = os.environ.get("TYCHO_SANITIZER_SLOW") == "1"
    for i, d in enumerate(tokdirs):
        fails += check_template(tycho, d, cases[i % 3::3] if slow else cases, table)
    print(f"\n{'template':<14} {'case':<40} result")
    for name, cname, status in table:
        print(f"{name:<14} {cname:<40} {status}")
    print()
    fails += check_cli(tycho, data)
    print("FAIL" if fails else "PASS", f"({fails} failures)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

"""gpt-oss from a Hugging Face directory without llama.cpp: `tycho mkmodel --arch gpt-oss --hf`
writes transformers' layout (fused gate_up_proj [E, D, 2F] with gate at even and up at odd
columns, down_proj [E, F, D], layer_types), and `tycho generate` on that directory gives the
GGUF's 48 greedy ids, in F32 and F16 (the experts re-laid at load keep their dtype). Then
each unsupported variant of the directory is refused with a message naming it: layer_types
other than alternating sliding/full, swiglu_limit other than 7, no sliding_window, experts in
MXFP4 blocks (gate_up_proj_blocks, as OpenAI's checkpoints ship them)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

TYCHO = os.path.join(os.environ.get("TYCHO_BUILD_DIR", "build"), "src/cli/tycho")
PROMPT = "1,40,70,100,130,160,190,220"
failures = 0


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what)
    failures += 0 if ok else 1


def generate(model):
    p = subprocess.run([TYCHO, "generate", "--model", model, "--prompt-ids", PROMPT, "-n", "48",
                        "--ignore-eos", "--json", "--kv-dtype", "f32"], capture_output=True,
                       text=True)
    return json.loads(p.stdout)["output_ids"] if p.returncode == 0 else p.stderr


def variant(src, dst, config=None, rename=None):
    """A copy of HF directory src with config.json keys changed (None: deleted) and one
    tensor renamed in the safetensors header (same bytes)."""
    shutil.copytree(src, dst)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    if rename:
        path = os.path.join(dst, "model.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        hdr = json.loads(data[8:8 + n])
        hdr[rename[1]] = hdr.pop(rename[0])
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data[8 + n:])
    return dst


def main():
    tmp = tempfile.mkdtemp(prefix="tycho-gptoss-hf-")
    try:
        for typ in ("f32", "f16"):
            gguf, hf = os.path.join(tmp, typ + ".gguf"), os.path.join(tmp, typ + "-hf")
            subprocess.run([TYCHO, "mkmodel", "--arch", "gpt-oss", "--dims", "64,3,4,2,96",
                            "--head-dim", "32", "--untied", "--yarn", "4,64",
                            "--sliding-window", "8", "--type", typ, "--vocab-from", "bytes",
                            "--out", gguf, "--hf", hf], check=True, capture_output=True)
            a, b = generate(gguf), generate(hf)
            check(isinstance(a, list) and a == b and len(set(a)) >= 6,
                  "%s: the HF directory's 48 ids equal the GGUF's (%s)" % (typ, a if a == b else
                                                                        "%s vs %s" % (a, b)))
        hf = os.path.join(tmp, "f32-hf")
        cases = [
            ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, None,
             "layer_types[0] is 'full_attention'"),
            ({"swiglu_limit": 10.0}, None, "swiglu_limit 10 is not supported"),
            ({"sliding_window": None}, None, "gpt_oss without sliding_window"),
            (None, ("model.layers.0.mlp.experts.gate_up_proj",
                    "model.layers.0.mlp.experts.gate_up_proj_blocks"),
             "gpt_oss experts in MXFP4 blocks"),
        ]
        for i, (cfg, rename, want) in enumerate(cases):
            got = generate(variant(hf, os.path.join(tmp, "v%d" % i), cfg, rename))
            check(isinstance(got, str) and want in got, "refused naming %r (%s)" %
                  (want, got.strip().splitlines()[-1] if isinstance(got, str) else got))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if failures else 0)


main()

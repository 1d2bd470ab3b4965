#!/usr/bin/env python3
"""deepseek2 variants Tycho does not compute are refused at load with a message naming them,
never run as another model: `tycho generate` on each exits 1 and prints the reason.

Each variant is a `tycho mkmodel --arch deepseek2` file with one change made in place (a key
renamed to one of the same length, a value rewritten), so the rest of the file stays valid:
- no attention.key_length_mla (the unsplit attn_kv_b form of old converters);
- expert_gating_func 3 (softmax of the top-k) instead of sigmoid;
- a tensor attn_kv_b (the unsplit form; named in place of a layer's attn_norm);
- an HF deepseek_v3 directory with topk_method group_limited_greedy (V2's group maximum),
  scoring_func sqrtsoftplus, or YaRN with an mscale llama.cpp would not assume (0.5 beside
  mscale_all_dim 1);
and the unchanged file and directory load and generate (the controls)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

TYCHO = os.path.join(os.environ.get("TYCHO_BUILD_DIR", "."), "src/cli/tycho")
failures = 0


def mkmodel(path, extra=()):
    subprocess.run([TYCHO, "mkmodel", "--arch", "deepseek2", "--dims", "128,2,8,4,256",
                    "--head-dim", "32", "--untied", "--vocab-from", "bytes", "--out", path,
                    *extra], check=True, capture_output=True)


def patch(src, dst, old, new, value=None):
    """Copy src to dst with the first `old` bytes replaced by `new` (same length); with value,
    the u32 after the key's type tag (a GGUF metadata value) becomes value."""
    data = bytearray(open(src, "rb").read())
    i = data.find(old)
    assert i >= 0 and len(old) == len(new), old
    data[i:i + len(old)] = new
    if value is not None:
        j = i + len(old)
        assert struct.unpack_from("<I", data, j)[0] == 4  # GGUF_TYPE_UINT32
        struct.pack_into("<I", data, j + 4, value)
    open(dst, "wb").write(data)


def expect(path, want):
    global failures
    r = subprocess.run([TYCHO, "generate", "--model", path, "--prompt-ids", "1,2,3", "-n", "4"],
                       capture_output=True, text=True)
    ok = (r.returncode == 0) if want is None else (r.returncode == 1 and want in r.stderr)
    print("%s %s: exit %d, %s" % ("ok  " if ok else "FAIL", os.path.basename(path), r.returncode,
                                   r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""))
    failures += not ok


with tempfile.TemporaryDirectory(prefix="tycho-ds2-") as tmp:
    base = os.path.join(tmp, "base.gguf")
    mkmodel(base)
    expect(base, None)
    v = os.path.join(tmp, "no-key-length-mla.gguf")
    patch(base, v, b"deepseek2.attention.key_length_mla", b"deepseek2.attention.key_length_xyz")
    expect(v, "unsplit attn_kv_b form")
    v = os.path.join(tmp, "gating-3.gguf")
    patch(base, v, b"deepseek2.expert_gating_func", b"deepseek2.expert_gating_func", 3)
    expect(v, "expert gating function 3")
    v = os.path.join(tmp, "kv-b.gguf")
    patch(base, v, b"blk.1.attn_norm.weight", b"blk.1.attn_kv_b.weight")
    expect(v, "unsplit MLA kv_b form")
    hf = os.path.join(tmp, "hf")
    mkmodel(os.path.join(tmp, "hf.gguf"), ("--hf", hf))
    expect(hf, None)
    for key, val, want in (("topk_method", "group_limited_greedy", "topk_method"),
                           ("scoring_func", "sqrtsoftplus", "scoring_func"),
                           ("rope_scaling", {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 64,
                                             "mscale": 0.5, "mscale_all_dim": 1.0},
                            "mscale equal to it")):
        with open(os.path.join(hf, "config.json")) as fh:
            cfg = json.load(fh)
        cfg[key] = val
        with open(os.path.join(hf, "config.json"), "w") as fh:
            json.dump(cfg, fh)
        expect(hf, want)
        cfg[key] = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "rope_scaling": None}[key]
        with open(os.path.join(hf, "config.json"), "w") as fh:
            json.dump(cfg, fh)
print("%d failures" % failures)
sys.exit(1 if failures else 0)

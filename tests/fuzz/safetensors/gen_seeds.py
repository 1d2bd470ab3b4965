# Seeds for fuzz_safetensors, written from the safetensors spec (huggingface/safetensors README):
# u64 LE header length, JSON header {name: {dtype, shape, data_offsets}}, data. Each seed is a
# flag byte then the files of a model directory separated by "\n@@\n" (see fuzz_safetensors.c).
# Usage: python3 gen_seeds.py tests/fuzz/safetensors/corpus
import json, struct, os, sys
out = sys.argv[1]
SEP = b"\n@@\n"

def st_file(tensors, mdtype):
    """tensors: list of (name, shape); matrices in mdtype, vectors (norms, biases) in F32 as the
    loader requires. Values: a fixed small pattern."""
    hdr, blobs, off = {}, [], 0
    for i, (name, shape) in enumerate(tensors):
        dtype = mdtype if len(shape) == 2 else "F32"
        n = 1
        for d in shape: n *= d
        if dtype == "F32":
            b = b"".join(struct.pack("<f", 0.25 + 0.01 * ((i + k) % 7)) for k in range(n))
        elif dtype == "F16":
            b = b"".join(struct.pack("<e", 0.25 + 0.01 * ((i + k) % 7)) for k in range(n))
        else:
            b = b"".join(struct.pack("<f", 0.25 + 0.01 * ((i + k) % 7))[2:] for k in range(n))
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)

def llama_tensors(dim, heads, kv, ffn, vocab, bias=False, lm_head=False):
    hd = dim // heads
    t = [("model.embed_tokens.weight", (vocab, dim)), ("model.norm.weight", (dim,))]
    p = "model.layers.0."
    t += [(p + "input_layernorm.weight", (dim,)), (p + "self_attn.q_proj.weight", (heads * hd, dim)),
          (p + "self_attn.k_proj.weight", (kv * hd, dim)), (p + "self_attn.v_proj.weight", (kv * hd, dim)),
          (p + "self_attn.o_proj.weight", (dim, heads * hd)), (p + "post_attention_layernorm.weight", (dim,)),
          (p + "mlp.gate_proj.weight", (ffn, dim)), (p + "mlp.up_proj.weight", (ffn, dim)),
          (p + "mlp.down_proj.weight", (dim, ffn))]
    if bias:
        t += [(p + "self_attn.q_proj.bias", (heads * hd,)), (p + "self_attn.k_proj.bias", (kv * hd,)),
              (p + "self_attn.v_proj.bias", (kv * hd,))]
    if lm_head:
        t += [("lm_head.weight", (vocab, dim))]
    return t

def cfg(mt, **kw):
    c = {"model_type": mt, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 8,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    c.update(kw)
    return json.dumps(c).encode()

def seed(name, flag, sections):
    data = bytes([flag]) + SEP.join(sections)
    assert all(SEP not in s for s in sections)
    open(os.path.join(out, name), "wb").write(data)

seed("llama_f32_tied", 0, [cfg("llama", tie_word_embeddings=True),
                            st_file(llama_tensors(8, 2, 1, 16, 8), "F32")])
seed("llama3_f16_lm_head", 0, [cfg("llama", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 32}, eos_token_id=[2, 3]),
                                st_file(llama_tensors(8, 2, 1, 16, 8, lm_head=True), "F16"),
                                json.dumps({"eos_token_id": 7}).encode(),
                                json.dumps({"chat_template": "{{ messages[0].content }}"}).encode()])
qt = llama_tensors(8, 2, 2, 16, 8, bias=True)
idx = {"metadata": {"total_size": 0}, "weight_map": {n: ("a.safetensors" if i % 2 else "b.safetensors")
                                                      for i, (n, _) in enumerate(qt)}}
seed("qwen2_bf16_sharded", 1, [cfg("qwen2", num_key_value_heads=2, rope_scaling={"type": "linear", "factor": 2.0}),
                               json.dumps(idx).encode(), b"", b"",
                               st_file([t for i, t in enumerate(qt) if i % 2], "BF16"),
                               st_file([t for i, t in enumerate(qt) if not i % 2], "BF16")])
seed("bad_header_len", 0, [cfg("mistral"), struct.pack("<Q", 1 << 40) + b"{}"])
seed("truncated", 0, [cfg("llama"), st_file(llama_tensors(8, 2, 1, 16, 8), "F32")[:200]])
seed("config_not_object", 0, [b"[1, 2]", st_file([("x", (2,))], "F32")])
seed("unsupported_model", 0, [cfg("gpt_neox"), b""])

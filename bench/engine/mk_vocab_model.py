# A random-weight Llama model directory (config.json, model.safetensors, tokenizer.json) whose
# vocabulary is a given tokenizer.json's, for benchmarks that need a real large vocabulary
# (bench_grammar: llama3.1's 128,256 tokens). Weights are a seeded pseudo-random block, tiled.
# The tokenizer's post_processor is dropped when it is a "Sequence" (the loader does not take
# it; it only adds BOS). Safetensors layout from the huggingface/safetensors README.
# usage: python3 mk_vocab_model.py TOKENIZER.json OUT_DIR [DIM LAYERS HEADS FFN]
import array, json, os, random, struct, sys

tok_path, out = sys.argv[1], sys.argv[2]
dim, layers, heads, ffn = (int(x) for x in (sys.argv[3:7] if len(sys.argv) > 6 else (256, 4, 4, 768)))
tok = json.load(open(tok_path))
if (tok.get("post_processor") or {}).get("type") == "Sequence":
    tok["post_processor"] = None
vocab = max(tok["model"]["vocab"].values()) + 1
vocab = max([vocab] + [t["id"] + 1 for t in tok.get("added_tokens", [])])
os.makedirs(out, exist_ok=True)
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))
eos = [t["id"] for t in tok.get("added_tokens", []) if t["content"] in ("<|eot_id|>", "<|end_of_text|>", "</s>")]
json.dump({"model_type": "llama", "hidden_size": dim, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": ffn,
           "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
           "rope_theta": 500000.0, "tie_word_embeddings": True,
           "eos_token_id": eos or [vocab - 1]}, open(os.path.join(out, "config.json"), "w"))

rng = random.Random(1)
block = array.array("f", [rng.uniform(-0.08, 0.08) for _ in range(1 << 16)])

def tensor(n, ones=False):
    if ones:
        return array.array("f", [1.0]) * n
    reps = n // len(block) + 1
    a = block * reps
    return a[:n]

t = [("model.embed_tokens.weight", (vocab, dim)), ("model.norm.weight", (dim,))]
for l in range(layers):
    p = "model.layers.%d." % l
    t += [(p + "input_layernorm.weight", (dim,)), (p + "self_attn.q_proj.weight", (dim, dim)),
          (p + "self_attn.k_proj.weight", (dim, dim)), (p + "self_attn.v_proj.weight", (dim, dim)),
          (p + "self_attn.o_proj.weight", (dim, dim)), (p + "post_attention_layernorm.weight", (dim,)),
          (p + "mlp.gate_proj.weight", (ffn, dim)), (p + "mlp.up_proj.weight", (ffn, dim)),
          (p + "mlp.down_proj.weight", (dim, ffn))]
hdr, off = {}, 0
for name, shape in t:
    n = 1
    for d in shape:
        n *= d
    hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + 4 * n]}
    off += 4 * n
hdr["__metadata__"] = {"format": "pt"}
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * ((8 - (8 + len(h)) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for name, shape in t:
        n = 1
        for d in shape:
            n *= d
        tensor(n, ones=len(shape) == 1).tofile(f)
print("wrote %s: Llama dim %d, %d layers, %d heads, ffn %d, vocab %d, tied, f32" %
      (out, dim, layers, heads, ffn, vocab))

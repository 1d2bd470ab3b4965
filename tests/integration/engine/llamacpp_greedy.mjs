// Greedy token ids from llama.cpp itself (node-llama-cpp, CPU), as ground truth for Tycho.
// usage: node llamacpp_greedy.mjs MODEL.gguf N_TOKENS < prompts.jsonl > out.jsonl
// Each input line {"text": "..."} gives an output line {"text", "prompt_ids", "output_ids"}:
// prompt_ids are llama.cpp's tokenization (BOS added as the model asks), output_ids the
// greedy continuation of exactly N_TOKENS tokens (end-of-generation tokens do not stop it).
// LLAMACPP_KV=F16 gives llama.cpp's default KV cache type instead of F32.
// LLAMACPP_PROBS=1 adds, from llama.cpp's full next-token distribution at each step,
// "first_logprobs" (the first step's log-probability of every token id, an array) and "top2"
// (per step the two most likely [id, logprob] pairs), for near-tie and logit checks.
// NODE_PATH-less import: set LLAMACPP_PREFIX to the npm --prefix folder.
import {createRequire} from "node:module";
import {readFileSync} from "node:fs";
import path from "node:path";

const prefix = process.env.LLAMACPP_PREFIX || `${process.env.TYCHO_PEERS_DIR || "/opt/tycho-peers"}/llamacpp`;
const require = createRequire(path.join(prefix, "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const [modelPath, nArg] = process.argv.slice(2);
const nTokens = Number(nArg || 256);
const threads = Number(process.env.LLAMACPP_THREADS || 1);
// Tycho keeps K/V in f32; llama.cpp defaults to f16, whose rounding flips near-tie argmaxes.
const kvType = process.env.LLAMACPP_KV || "F32";
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const lines = readFileSync(0, "utf8").split("\n").filter((l) => l.trim());
for (const line of lines) {
    const {text} = JSON.parse(line);
    const ctx = await model.createContext({contextSize: 1024, threads, batchSize: 512,
        flashAttention: false, experimentalKvCacheKeyType: kvType,
        experimentalKvCacheValueType: kvType});
    const seq = ctx.getSequence();
    const body = model.tokenize(text, false);
    const prompt = model.tokens.shouldPrependBosToken && model.tokens.bos != null
        ? [model.tokens.bos, ...body] : body;
    const out = [], top2 = [];
    let first = null;
    if (process.env.LLAMACPP_PROBS === "1") {
        for await (const r of seq.evaluateWithMetadata(prompt, {probabilities: true},
                                                       {temperature: 0, yieldEogToken: true})) {
            if (!first) {
                first = new Array(model.tokens.length ?? r.probabilities.size).fill(null);
                for (const [id, p] of r.probabilities) first[id] = Math.log(p);
            }
            top2.push([...r.probabilities].slice(0, 2).map(([id, p]) => [id, Math.log(p)]));
            out.push(r.token);
            if (out.length >= nTokens) break;
        }
    } else {
        for await (const tok of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
            out.push(tok);
            if (out.length >= nTokens) break;
        }
    }
    const rec = {text, prompt_ids: prompt, output_ids: out};
    if (first) Object.assign(rec, {first_logprobs: first, top2});
    process.stdout.write(JSON.stringify(rec) + "\n");
    await ctx.dispose();
}
await model.dispose();

// llama.cpp (node-llama-cpp, CPU) prefill and decode tokens/s on a GGUF, per thread count,
// with the same token ids as bench_engine.c. JSON lines on stdout.
// usage: node llamacpp_bench.mjs MODEL.gguf [PROMPT_TOKENS] [GEN_TOKENS] [MAX_THREADS]
import {createRequire} from "node:module";
import path from "node:path";

const prefix = process.env.LLAMACPP_PREFIX || `${process.env.TYCHO_PEERS_DIR || "/opt/tycho-peers"}/llamacpp`;
const require = createRequire(path.join(prefix, "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));
const [modelPath, pArg, gArg, tArg] = process.argv.slice(2);
const P = Number(pArg || 256), G = Number(gArg || 64), maxT = Number(tArg || 2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                              maxThreads: maxT});
const model = await llama.loadModel({modelPath});
const V = Number(process.env.N_VOCAB || 32000); // ids as bench_engine.c draws them
const tokens = Array.from({length: P}, (_, i) => 100 + (i * 7919) % (V - 200));
for (let t = 1; t <= maxT; t++) {
    let bestPf = 0, bestDec = 0;
    for (let rep = 0; rep < 2; rep++) {
        const ctx = await model.createContext({contextSize: P + G + 16, batchSize: 512,
                                               threads: {ideal: t, min: t}});
        const seq = ctx.getSequence();
        const t0 = process.hrtime.bigint();
        await seq.evaluateWithoutGeneratingNewTokens(tokens.slice(0, P - 1));
        const t1 = process.hrtime.bigint();
        let n = 0;
        // the first step evaluates the last prompt token; each further one a generated token
        for await (const tok of seq.evaluate([tokens[P - 1]], {temperature: 0})) {
            if (++n > G) break;
        }
        const t2 = process.hrtime.bigint();
        const pf = (P - 1) / (Number(t1 - t0) / 1e9), dec = (G + 1) / (Number(t2 - t1) / 1e9);
        bestPf = Math.max(bestPf, pf);
        bestDec = Math.max(bestDec, dec);
        await ctx.dispose();
    }
    console.log(JSON.stringify({engine: "llama.cpp", threads: t, prompt_tokens: P, gen_tokens: G,
                                prefill_tok_s: +bestPf.toFixed(2), decode_tok_s: +bestDec.toFixed(3)}));
}
await model.dispose();

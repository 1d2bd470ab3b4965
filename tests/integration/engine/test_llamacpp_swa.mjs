// Sliding-window attention (Mistral-style, every layer) against llama.cpp (node-llama-cpp).
//
// llama.cpp does not slide the window of a `llama` GGUF: its llama model never reads
// llama.attention.sliding_window (src/models/llama.cpp; only architectures such as gemma2/3,
// cohere2, olmo2, granite_swa, gpt-oss set a SWA type), and its converter writes Mistral as
// `llama` without the key, so llama.cpp runs Mistral with full attention. Comparing
// `tycho generate` with llama.cpp on the same windowed file would therefore compare against
// full attention. Instead this test uses what a window means: on a ONE-layer model a query at
// position p reads exactly keys p - W + 1 .. p (llama.cpp's is_masked_swa: p - k >= W is
// masked), and rope makes q.k depend only on p - k, so its next-token logits equal those of a
// full-attention run over just the last W tokens placed at positions 0 .. W - 1. For every
// step of Tycho's greedy output on a windowed file (mkmodel --sliding-window 32, prompts of
// 40..90 ids, 64 tokens, so most steps are far past the window), llama.cpp evaluates the last
// W tokens of Tycho's context on the same file and its argmax must be Tycho's id (or a near
// tie: within NEAR_TIE nats by llama.cpp's distribution; rope angles at other positions
// round differently). The last W - 1 and W + 1 tokens must each disagree somewhere, so the
// check sees an off-by-one in the window. Tycho runs both with the default page size and
// with 16-token pages and 7-token prefill calls (pages released during decode, prefill
// chunks straddling the window): the same ids.
// Exit 77 when node-llama-cpp is not installed (scripts/install-peers.sh).
import {spawnSync} from "node:child_process";
import {existsSync, mkdtempSync, rmSync} from "node:fs";
import {createRequire} from "node:module";
import os from "node:os";
import path from "node:path";

const prefix = process.env.LLAMACPP_PREFIX || `${process.env.TYCHO_PEERS_DIR || "/opt/tycho-peers"}/llamacpp`;
const tycho = path.join(process.env.TYCHO_BUILD_DIR || ".", "src/cli/tycho");
const W = 32, N = 64, NEAR_TIE = 0.02;
if (!existsSync(path.join(prefix, "node_modules/node-llama-cpp/package.json"))) {
    console.log(`skip: node-llama-cpp not installed under ${prefix}`);
    process.exit(77);
}
const require = createRequire(path.join(prefix, "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

function run(cmd, args) {
    const r = spawnSync(cmd, args, {encoding: "utf8", maxBuffer: 1 << 26});
    if (r.status !== 0)
        throw new Error(`${path.basename(cmd)} ${args.join(" ")}: exit ${r.status}\n${r.stderr}`);
    return r.stdout;
}

// Prompt ids of the byte vocabulary (3..258 are bytes), from a seed.
function promptIds(n, seed) {
    const ids = [];
    let x = seed;
    for (let i = 0; i < n; i++) {
        x = (x * 1103515245 + 12345) % 2147483648;
        ids.push(3 + (x >> 8) % 256);
    }
    return ids;
}

const tmp = mkdtempSync(path.join(os.tmpdir(), "tycho-swa-"));
let failures = 0;
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
try {
    const model = path.join(tmp, "swa.gguf");
    run(tycho, ["mkmodel", "--arch", "llama", "--dims", "128,1,8,4,384", "--untied", "--seed", "3",
                "--sliding-window", String(W), "--vocab-from", "bytes", "--out", model]);
    const m = await llama.loadModel({modelPath: model});
    const ctx = await m.createContext({contextSize: 256, threads: 1, batchSize: 256,
        flashAttention: false, experimentalKvCacheKeyType: "F32",
        experimentalKvCacheValueType: "F32"});
    const seq = ctx.getSequence();
    // llama.cpp's next-token distribution after `tokens` (fresh sequence): [argmax, logprob of id].
    async function next(tokens, id) {
        await seq.clearHistory();
        for await (const r of seq.evaluateWithMetadata(tokens, {probabilities: true},
                                                       {temperature: 0, yieldEogToken: true})) {
            const probs = r.probabilities, best = [...probs][0];
            return {top: best[0], gap: Math.log(best[1]) - Math.log(probs.get(id) ?? 0)};
        }
        throw new Error("llama.cpp gave no token");
    }
    for (const [n, seed] of [[40, 1], [64, 2], [90, 3]]) {
        const prompt = promptIds(n, seed);
        const gen = (extra) => JSON.parse(run(tycho, ["generate", "--model", model, "--prompt-ids",
            prompt.join(","), "-n", String(N), "--ignore-eos", "--json", "--kv-dtype", "f32", ...extra]))
            .output_ids;
        const ids = gen([]), small = gen(["--kv-block", "16", "--batch-tokens", "7"]);
        const msgs = [];
        let ok = small.length === N && small.every((x, i) => x === ids[i]);
        if (!ok) msgs.push("16-token pages / 7-token calls give other ids");
        const ctxIds = [...prompt, ...ids];
        let ties = 0, offLess = 0, offMore = 0;
        for (let k = 0; k < N; k++) {
            const end = n + k; // tokens before output k
            const r = await next(ctxIds.slice(Math.max(0, end - W), end), ids[k]);
            if (r.top !== ids[k]) {
                if (r.gap <= NEAR_TIE) {
                    ties++;
                } else if (ok) {
                    ok = false;
                    msgs.push(`step ${k}: llama.cpp ${r.top}, tycho ${ids[k]} (gap ${r.gap.toFixed(4)})`);
                }
            }
            if ((await next(ctxIds.slice(Math.max(0, end - W + 1), end), ids[k])).top !== ids[k])
                offLess++;
            if (end > W && (await next(ctxIds.slice(end - W - 1, end), ids[k])).top !== ids[k])
                offMore++;
        }
        if (!offLess || !offMore) {
            ok = false;
            msgs.push(`windows of ${W - 1} / ${W + 1} never disagree (${offLess}/${offMore})`);
        }
        msgs.push(`${N} steps, ${ties} near ties, W-1 / W+1 disagree at ${offLess} / ${offMore}`);
        console.log(`${ok ? "ok  " : "FAIL"} prompt of ${n} ids: ${msgs.join(", ")}`);
        if (!ok) failures++;
    }
    await ctx.dispose();
    await m.dispose();
} catch (e) {
    console.error(`FAIL ${e.message}`);
    failures++;
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
process.exit(failures ? 1 : 0);

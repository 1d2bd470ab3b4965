// Long context on the CPU engine: a model of 128k context (mkmodel --ctx 131072; a tiny shape,
// so that a 32k-token prefill takes seconds on two cores) and a 32,000-token prompt (8,000
// under TYCHO_SANITIZER_SLOW=1).
// - `tycho generate` takes the model's own context and a KV cache of one whole context (not
//   eight: the default budget), and answers;
// - chunked prefill in 512-token and 2000-token calls (pages of 64: the second's chunks end
//   inside pages; at 32k the CPU attention takes its 2000 query rows in blocks of 524, its
//   64 MiB score bound) gives the same ids and log-probabilities within 1e-3;
// - llama.cpp (node-llama-cpp, F32 KV, its own attention) gives the same greedy ids, or where
//   they first part a near tie by its distribution, and the first token's log-probability
//   within 1e-2;
// - a prompt of the whole context of a 4k model is refused with a message naming the limits.
// Exit 77 when node-llama-cpp is not installed (scripts/install-peers.sh).
import {spawnSync} from "node:child_process";
import {existsSync, mkdtempSync, rmSync, writeFileSync} from "node:fs";
import {createRequire} from "node:module";
import os from "node:os";
import path from "node:path";

const prefix = process.env.LLAMACPP_PREFIX || `${process.env.TYCHO_PEERS_DIR || "/opt/tycho-peers"}/llamacpp`;
const tycho = path.join(process.env.TYCHO_BUILD_DIR || ".", "src/cli/tycho");
const CTX = 131072, N = 8, NEAR_TIE = 0.05;
const P = process.env.TYCHO_SANITIZER_SLOW === "1" ? 8000 : 32000;
if (!existsSync(path.join(prefix, "node_modules/node-llama-cpp/package.json"))) {
    console.log(`skip: node-llama-cpp not installed under ${prefix}`);
    process.exit(77);
}
const require = createRequire(path.join(prefix, "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

function run(cmd, args, expectFail = false) {
    const r = spawnSync(cmd, args, {encoding: "utf8", maxBuffer: 1 << 26});
    if ((r.status !== 0) !== expectFail)
        throw new Error(`${path.basename(cmd)} ${args.slice(0, 4).join(" ")}...: exit ${r.status}\n${r.stderr}`);
    return r;
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

let failures = 0;
function check(cond, what) {
    console.log(`${cond ? "ok" : "FAIL"}: ${what}`);
    failures += cond ? 0 : 1;
}

const tmp = mkdtempSync(path.join(os.tmpdir(), "tycho-longctx-"));
try {
    const model = path.join(tmp, "long.gguf"), idFile = path.join(tmp, "ids.txt");
    run(tycho, ["mkmodel", "--dims", "32,2,2,1,64", "--ctx", String(CTX), "--seed", "7",
                "--vocab-from", "bytes", "--out", model]);
    const prompt = promptIds(P, 11);
    writeFileSync(idFile, prompt.join(","));
    const gen = (chunk) => {
        const t0 = Date.now();
        const r = run(tycho, ["generate", "--model", model, "--prompt-ids", "@" + idFile, "-n",
                              String(N), "--ignore-eos", "--json", "--kv-dtype", "f32",
                              "--logprobs", "1", "--threads", "2", "--batch-tokens",
                              String(chunk)]);
        const j = JSON.parse(r.stdout);
        j.stderr = r.stderr;
        console.log(`generate, ${chunk}-token prefill calls: ${j.output_ids} in ${Date.now() - t0} ms`);
        return j;
    };
    const a = gen(512), b = gen(2000);
    check(a.n_prompt === P && a.output_ids.length === N, `${P}-token prompt, ${N} tokens`);
    const kv = /KV cache f32: (\d+) pages of (\d+) tokens \((\d+) tokens/.exec(a.stderr);
    check(kv && Number(kv[3]) === CTX,
          `default KV cache: one whole context (${kv ? kv[0] : a.stderr.slice(0, 200)})`);
    check(JSON.stringify(a.output_ids) === JSON.stringify(b.output_ids),
          `512- and 2000-token chunks: the same ids (${b.output_ids})`);
    const lpa = a.logprobs.map((x) => x.logprob), lpb = b.logprobs.map((x) => x.logprob);
    const dmax = Math.max(...lpa.map((x, i) => Math.abs(x - lpb[i])));
    check(dmax < 1e-3, `and log-probabilities within 1e-3 (max difference ${dmax.toExponential(2)})`);

    const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
    const m = await llama.loadModel({modelPath: model});
    const t0 = Date.now();
    // flash attention: llama.cpp's CPU path is 2-3x faster at 32k with it (same ids)
    const ctx = await m.createContext({contextSize: P + 256, threads: 2, batchSize: 512,
        flashAttention: true, experimentalKvCacheKeyType: "F32",
        experimentalKvCacheValueType: "F32"});
    const seq = ctx.getSequence();
    const ref = [], dists = [];
    for await (const r of seq.evaluateWithMetadata(prompt, {probabilities: true},
                                                   {temperature: 0, yieldEogToken: true})) {
        ref.push(r.token);
        dists.push(r.probabilities);
        if (ref.length >= N) break;
    }
    console.log(`llama.cpp: ${ref} in ${Date.now() - t0} ms`);
    let i = 0;
    while (i < N && ref[i] === a.output_ids[i]) i++;
    const gap = i < N ? Math.log(dists[i].get(ref[i])) - Math.log(dists[i].get(a.output_ids[i]) ?? 0)
                      : 0;
    check(i === N || gap < NEAR_TIE,
          i === N ? "llama.cpp's greedy ids equal Tycho's"
                  : `ids part at step ${i}: ${a.output_ids[i]} vs llama.cpp's ${ref[i]} (gap ${gap})`);
    const first = Math.log(dists[0].get(a.output_ids[0]) ?? 0);
    check(Math.abs(first - lpa[0]) < 1e-2,
          `first token's log-probability ${lpa[0].toFixed(4)} vs llama.cpp's ${first.toFixed(4)}`);
    await ctx.dispose();
    await m.dispose();

    // a 4k model: a prompt of its whole context leaves no room for a completion
    const small = path.join(tmp, "small.gguf");
    run(tycho, ["mkmodel", "--dims", "32,2,2,1,64", "--ctx", "4096", "--vocab-from", "bytes",
                "--out", small]);
    writeFileSync(idFile, promptIds(4096, 3).join(","));
    const r = run(tycho, ["generate", "--model", small, "--prompt-ids", "@" + idFile, "-n", "4"],
                  true);
    check(/the prompt has 4096 tokens; the context holds 4096/.test(r.stderr),
          `a 4096-token prompt on a 4096-context model: ${r.stderr.trim().split("\n").pop()}`);
} finally {
    rmSync(tmp, {recursive: true, force: true});
}
if (failures) {
    console.log(`${failures} check(s) failed`);
    process.exit(1);
}

// Greedy ids of `tycho generate` equal llama.cpp's (node-llama-cpp) for 256 tokens on every
// prompt of prompts.jsonl, for stories260K.gguf and for stories260K-hf/ (same weights, HF
// layout). Prompt tokenization is compared too. Exit 77 when node-llama-cpp is not installed
// (scripts/install-peers.sh installs it, pinned so that it also loads on Debian 12's Node 18).
import {spawnSync} from "node:child_process";
import {existsSync, readFileSync} from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = process.env.LLAMACPP_PREFIX || `${process.env.TYCHO_PEERS_DIR || "/opt/tycho-peers"}/llamacpp`;
const data = process.env.TYCHO_TEST_DATA;
const tycho = path.join(process.env.TYCHO_BUILD_DIR || ".", "src/cli/tycho");
const N = Number(process.env.N_TOKENS || 256);
if (!existsSync(path.join(prefix, "node_modules/node-llama-cpp/package.json"))) {
    console.log(`skip: node-llama-cpp not installed under ${prefix}`);
    process.exit(77);
}
if (!data || !existsSync(path.join(data, "models/stories260K/stories260K.gguf"))) {
    console.log("skip: TYCHO_TEST_DATA models missing");
    process.exit(77);
}
const gguf = path.join(data, "models/stories260K/stories260K.gguf");
const hf = path.join(data, "models/stories260K-hf");
const prompts = readFileSync(path.join(here, "prompts.jsonl"), "utf8");
const ref = spawnSync("node", [path.join(here, "llamacpp_greedy.mjs"), gguf, String(N)],
                      {input: prompts, encoding: "utf8", env: {...process.env, LLAMACPP_PREFIX: prefix},
                       maxBuffer: 1 << 26});
if (ref.status !== 0) {
    console.error("llama.cpp reference failed:", ref.stderr);
    process.exit(1);
}
const refs = ref.stdout.trim().split("\n").map((l) => JSON.parse(l));
let failures = 0;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
for (const model of [gguf, hf]) {
    for (const r of refs) {
        const out = spawnSync(tycho, ["generate", "--model", model, "--prompt", r.text, "-n", String(N),
                                      "--ignore-eos", "--json"], {encoding: "utf8"});
        if (out.status !== 0) {
            console.error(`FAIL ${model} ${JSON.stringify(r.text)}: exit ${out.status} ${out.stderr}`);
            failures++;
            continue;
        }
        const t = JSON.parse(out.stdout);
        const okP = same(t.prompt_ids, r.prompt_ids), okO = same(t.output_ids, r.output_ids);
        let firstDiff = -1;
        if (!okO) firstDiff = t.output_ids.findIndex((x, i) => x !== r.output_ids[i]);
        console.log(`${okP && okO ? "ok  " : "FAIL"} ${path.basename(model)} ${JSON.stringify(r.text)}` +
                    (okP ? "" : ` prompt ids ${JSON.stringify(t.prompt_ids)} vs ${JSON.stringify(r.prompt_ids)}`) +
                    (okO ? "" : ` output differs at ${firstDiff}`));
        if (!okP || !okO) failures++;
    }
}
// F16 weights with an untied output over the 32k Llama-2 vocab (random weights): 64 tokens,
// with both engines' KV cache in f32, then both in f16 (llama.cpp's default, Tycho's auto), then
// both in bf16
const tiny = path.join(data, "models/llama-2-tiny-random/llama-2-tiny-random.gguf");
const few = prompts.split("\n").slice(0, 4).join("\n");
for (const kv of ["F32", "F16", "BF16"]) {
    const ref16 = spawnSync("node", [path.join(here, "llamacpp_greedy.mjs"), tiny, "64"],
                            {input: few, encoding: "utf8",
                             env: {...process.env, LLAMACPP_PREFIX: prefix, LLAMACPP_KV: kv}});
    for (const line of (ref16.status === 0 ? ref16.stdout.trim().split("\n") : [])) {
        const r = JSON.parse(line);
        const out = spawnSync(tycho, ["generate", "--model", tiny, "--prompt", r.text, "-n", "64",
                                      "--ignore-eos", "--json", "--kv-dtype", kv.toLowerCase()],
                              {encoding: "utf8"});
        const t = out.status === 0 ? JSON.parse(out.stdout) : {prompt_ids: [], output_ids: []};
        const ok = same(t.prompt_ids, r.prompt_ids) && same(t.output_ids, r.output_ids);
        console.log(`${ok ? "ok  " : "FAIL"} llama-2-tiny-random (F16, untied, ${kv} KV) ` +
                    JSON.stringify(r.text));
        if (!ok) failures++;
    }
    if (ref16.status !== 0) {
        console.error(`llama.cpp F16 reference (${kv} KV) failed`, ref16.stderr);
        failures++;
    }
}
console.log(`${refs.length} prompts x 2 models, ${N} tokens, + F16 model: ${failures} failures`);
process.exit(failures ? 1 : 0);

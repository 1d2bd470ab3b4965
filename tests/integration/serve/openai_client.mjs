// The official `openai` npm client against `tycho serve` on stories260K: chat and completions,
// streaming and not, completions with a list of prompts and echo, logit_bias, vLLM's
// stop_token_ids and min_tokens. Expected text
// comes from `tycho generate` (temperature 0).
// Usage: node openai_client.mjs TYCHO_BINARY. Exit 77 when the package or the model is missing.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const tycho = process.argv[2];
const model = path.join(process.env.TYCHO_TEST_DATA || '', 'models/stories260K/stories260K.gguf');
const pkg = path.join(process.env.TYCHO_PEERS_DIR || '/opt/tycho-peers',
                      'openai/node_modules/openai/index.mjs');
if (!existsSync(model) || !existsSync(pkg)) {
  console.log('skip: missing', existsSync(model) ? pkg : model);
  process.exit(77);
}
const { default: OpenAI } = await import(pathToFileURL(pkg).href);

const port = await new Promise((res) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => {
    const p = s.address().port;
    s.close(() => res(p));
  });
});
const srv = spawn(tycho, ['serve', '--model', model, '--port', String(port), '--api-key', 'k1'],
                  { stdio: ['ignore', 'ignore', 'inherit'] });
let failed = false;
function check(cond, what) {
  console.log(cond ? 'ok:' : 'FAIL:', what);
  if (!cond) failed = true;
}
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'k1', maxRetries: 0 });
  for (let i = 0; i < 100; i++) {
    try { await client.models.list(); break; } catch { await new Promise((r) => setTimeout(r, 100)); }
  }
  const models = await client.models.list();
  check(models.data[0].id === 'stories260K', 'models.list');
  const prompt = 'Once upon a time';
  const ref = JSON.parse(execFileSync(tycho, ['generate', '--model', model, '--prompt', prompt,
                                              '-n', '32', '--temp', '0', '--json']));
  const c = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 32,
                                              temperature: 0 });
  check(c.choices[0].text === ref.text && c.usage.completion_tokens === ref.output_ids.length,
        'completions.create');
  const ch = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: prompt }], max_tokens: 32,
    temperature: 0 });
  check(ch.choices[0].message.content === ref.text && ch.choices[0].message.role === 'assistant',
        'chat.completions.create');
  let text = '', usage = null;
  const s1 = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: prompt }], max_tokens: 32,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of s1) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content || '';
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === ref.text && usage && usage.completion_tokens === ref.output_ids.length,
        'chat streaming with include_usage');
  text = '';
  const s2 = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 32,
                                               temperature: 0, stream: true });
  for await (const chunk of s2) text += chunk.choices[0]?.text || '';
  check(text === ref.text, 'completions streaming');
  // several prompts in one request: choice index = prompt_index * n + j
  const prompts = [prompt, 'The little dog'];
  const refs = prompts.map((p) => JSON.parse(execFileSync(tycho, [
    'generate', '--model', model, '--prompt', p, '-n', '16', '--temp', '0', '--json'])));
  const pl = await client.completions.create({ model: 'stories260K', prompt: prompts, n: 2,
                                               max_tokens: 16, temperature: 0 });
  check(pl.choices.length === 4 &&
        pl.choices.every((c, i) => c.index === i && c.text === refs[i >> 1].text) &&
        pl.usage.prompt_tokens === refs[0].prompt_ids.length + refs[1].prompt_ids.length,
        'completions.create with a list of 2 prompts, n=2');
  const texts = ['', '', '', ''];
  const s3 = await client.completions.create({ model: 'stories260K', prompt: prompts, n: 2,
                                               max_tokens: 16, temperature: 0, echo: true,
                                               stream: true });
  for await (const chunk of s3) for (const c of chunk.choices) texts[c.index] += c.text;
  check(texts.every((t, i) => t === prompts[i >> 1] + refs[i >> 1].text),
        'completions streaming with a prompt list and echo');
  // logit_bias: -100 on the greedy first token makes another one first; +100 on one token
  // makes every sampled token that one (the first comes from prefill, the rest from decode in
  // a cluster); an id outside the vocabulary is a 400
  const first = ref.output_ids[0], forced = ref.output_ids[3];
  const ban = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 1,
    temperature: 0, logit_bias: { [first]: -100 }, return_token_ids: true });
  check(ban.choices[0].token_ids.length === 1 && ban.choices[0].token_ids[0] !== first,
        `logit_bias -100 bans the greedy token ${first} (got ${ban.choices[0].token_ids})`);
  const force = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 6,
    temperature: 1, seed: 3, logit_bias: { [forced]: 100 }, return_token_ids: true });
  check(force.choices[0].token_ids.length === 6 &&
        force.choices[0].token_ids.every((t) => t === forced),
        `logit_bias +100 forces token ${forced} (got ${force.choices[0].token_ids})`);
  // stop_token_ids end the answer before the first one (it is not in the output), also when
  // it is the very first token (sampled by the prefill node in a cluster); min_tokens holds
  // the stop tokens back until that many tokens were made
  const stopAt = 5, stopId = ref.output_ids[stopAt];
  const st = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 32,
    temperature: 0, stop_token_ids: [stopId], return_token_ids: true });
  const want = ref.output_ids.slice(0, ref.output_ids.indexOf(stopId));
  check(JSON.stringify(st.choices[0].token_ids) === JSON.stringify(want) &&
        st.choices[0].finish_reason === 'stop',
        `stop_token_ids [${stopId}] ends the answer before it (${st.choices[0].token_ids})`);
  const st0 = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 8,
    temperature: 0, stop_token_ids: [first], return_token_ids: true });
  check(st0.choices[0].token_ids.length === 0 && st0.choices[0].finish_reason === 'stop',
        `a stop token as the first token: an empty answer (${st0.choices[0].token_ids})`);
  const mt = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 12,
    temperature: 0, stop_token_ids: [first], min_tokens: 4, return_token_ids: true });
  const got = mt.choices[0].token_ids;
  check(got.length >= 4 && got[0] !== first && !got.includes(first),
        `min_tokens 4 holds the stop token ${first} back (${got})`);
  try {
    await client.completions.create({ model: 'stories260K', prompt, max_tokens: 1,
                                      logit_bias: { 100000: 5 } });
    check(false, 'logit_bias outside the vocabulary raises');
  } catch (e) {
    check(e.status === 400, `logit_bias outside the vocabulary raises BadRequestError (${e.status})`);
  }
  try {
    await client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    check(false, 'unknown model raises');
  } catch (e) {
    check(e.status === 404, `unknown model raises NotFoundError (${e.status})`);
  }
  try {
    await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'bad', maxRetries: 0 })
      .models.list();
    check(false, 'bad key raises');
  } catch (e) {
    check(e.status === 401, `bad key raises AuthenticationError (${e.status})`);
  }
} catch (e) {
  console.log('FAIL:', e);
  failed = true;
} finally {
  srv.kill('SIGTERM');
}
process.exit(failed ? 1 : 0);

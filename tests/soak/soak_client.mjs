// The chaos soak's load (tests/soak/soak.py): Poisson arrivals through the official `openai`
// npm client against several Conductors, each request sent to one of them at random as a load
// balancer would (a Conductor that refused a connection is skipped for 2 s). Half the requests
// stream. Each request has a deadline; its outcome is one of: ok (the text equals the greedy
// reference), mismatch (it finished with other text), or an error by kind (HTTP status, a
// dropped connection, a deadline passed). Usage: node soak_client.mjs PLAN.json; prints one
// JSON summary line. Exit 77 when the package is missing.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const plan = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const pkg = path.join(process.env.TYCHO_PEERS_DIR || '/opt/tycho-peers',
                      'openai/node_modules/openai/index.mjs');
if (!existsSync(pkg)) {
  console.log(JSON.stringify({ skip: 'missing ' + pkg }));
  process.exit(77);
}
const { default: OpenAI } = await import(pathToFileURL(pkg).href);

// plan: {urls: [...], rate, duration_s, deadline_s, prompts: [{prompt, max_tokens, text}]}
const clients = plan.urls.map((u) => new OpenAI({ baseURL: u, apiKey: 'none',
                                                   timeout: plan.deadline_s * 1000 }));
const downUntil = plan.urls.map(() => 0);
let model = 'model';
for (let i = 0; i < 100; i++) { // the served model's id, from whichever Conductor answers
  try {
    model = (await clients[i % clients.length].models.list()).data[0].id;
    break;
  } catch { await new Promise((r) => setTimeout(r, 100)); }
}
const out = { sent: 0, ok: 0, mismatch: 0, errors: {}, latencies: [], mismatches: [] };
let rng = plan.seed || 12345;
function rand() { // xorshift: a run is reproducible
  rng ^= rng << 13; rng >>>= 0; rng ^= rng >>> 17; rng ^= rng << 5; rng >>>= 0;
  return rng / 4294967296;
}
function kindOf(e) {
  if (e && e.status) return 'http_' + e.status;
  // an error event inside a stream (what the SSE said: e.g. the decode node went down)
  if (e && e.constructor?.name === 'APIError') return 'stream_error';
  const n = (e && (e.constructor?.name || e.name)) || 'error';
  if (/Timeout/i.test(n)) return 'deadline';
  if (/Connection/i.test(n)) return 'connection';
  return n;
}

async function one(id) {
  const now = Date.now();
  const up = plan.urls.map((_, i) => i).filter((i) => downUntil[i] <= now);
  const ci = up.length ? up[Math.floor(rand() * up.length)] : Math.floor(rand() * plan.urls.length);
  const p = plan.prompts[Math.floor(rand() * plan.prompts.length)];
  const stream = rand() < 0.5;
  const t0 = Date.now();
  let text = '', finished = false;
  try {
    const req = { model, prompt: p.prompt, max_tokens: p.max_tokens, temperature: 0 };
    if (stream) {
      const s = await clients[ci].completions.create({ ...req, stream: true });
      for await (const ch of s) {
        text += ch.choices?.[0]?.text || '';
        if (ch.choices?.[0]?.finish_reason) finished = true;
      }
    } else {
      const r = await clients[ci].completions.create(req);
      text = r.choices[0].text;
      finished = !!r.choices[0].finish_reason;
    }
    if (!finished) throw Object.assign(new Error('stream ended without a finish reason'),
                                       { name: 'Truncated' });
    if (text === p.text) out.ok++;
    else {
      out.mismatch++;
      if (out.mismatches.length < 5) out.mismatches.push({ id, want: p.text, got: text });
    }
    out.latencies.push(Date.now() - t0);
  } catch (e) {
    const k = kindOf(e);
    out.errors[k] = (out.errors[k] || 0) + 1;
    out.error_samples = out.error_samples || {};
    if (!out.error_samples[k]) out.error_samples[k] = String(e?.message || e).slice(0, 200);
    if (k === 'connection') downUntil[ci] = Date.now() + 2000;
    if (Date.now() - t0 > (plan.deadline_s + 5) * 1000) out.errors.late = (out.errors.late || 0) + 1;
  }
}

const end = Date.now() + plan.duration_s * 1000;
const pending = [];
let id = 0;
while (Date.now() < end) {
  pending.push(one(id++));
  out.sent++;
  const gap = -Math.log(1 - rand()) / plan.rate; // exponential inter-arrival: Poisson load
  await new Promise((r) => setTimeout(r, gap * 1000));
}
await Promise.all(pending);
out.latencies.sort((a, b) => a - b);
const q = (f) => out.latencies.length ? out.latencies[Math.floor(f * (out.latencies.length - 1))] : 0;
out.latency_ms = { p50: q(0.5), p99: q(0.99), max: q(1) };
delete out.latencies;
console.log(JSON.stringify(out));

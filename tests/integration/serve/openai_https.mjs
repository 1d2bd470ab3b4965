// The official `openai` npm client against `tycho serve` over HTTPS: a self-signed certificate
// made here by the `openssl` CLI, trusted through NODE_EXTRA_CA_CERTS (read by node at start,
// so this script runs itself again with it set), a hashed API key (sha256:) in the server's
// api_keys. models.list, a completion, a streamed chat completion, and a wrong key's 401.
// Usage: node openai_https.mjs TYCHO_BINARY. Exit 77 when the package, the model or openssl is
// missing.
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const tycho = process.argv[2];
const model = path.join(process.env.TYCHO_TEST_DATA || '', 'models/stories260K/stories260K.gguf');
const pkg = path.join(process.env.TYCHO_PEERS_DIR || '/opt/tycho-peers',
                      'openai/node_modules/openai/index.mjs');
if (!existsSync(model) || !existsSync(pkg)) {
  console.log('skip: missing', existsSync(model) ? pkg : model);
  process.exit(77);
}
if (spawnSync('openssl', ['version']).status !== 0) {
  console.log('skip: no openssl');
  process.exit(77);
}

if (!process.env.TY_TEST_CERT_DIR) {
  // Parent: make the certificate, then run this script again trusting it.
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tycho-openai-https-'));
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes',
                           '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem'),
                           '-days', '2', '-subj', '/CN=localhost',
                           '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'],
               { stdio: 'ignore' });
  const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), tycho], {
    stdio: 'inherit',
    env: { ...process.env, TY_TEST_CERT_DIR: dir,
           NODE_EXTRA_CA_CERTS: path.join(dir, 'cert.pem') } });
  rmSync(dir, { recursive: true, force: true });
  process.exit(r.status === null ? 1 : r.status);
}

const dir = process.env.TY_TEST_CERT_DIR;
const { default: OpenAI } = await import(pathToFileURL(pkg).href);
const port = await new Promise((res) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => {
    const p = s.address().port;
    s.close(() => res(p));
  });
});
const key = 'sk-tycho-https-test';
const hashed = 'sha256:' + createHash('sha256').update(key).digest('hex');
const srv = spawn(tycho, ['serve', '--model', model, '--port', String(port),
                          '--tls-cert', path.join(dir, 'cert.pem'),
                          '--tls-key', path.join(dir, 'key.pem'), '--api-key', hashed],
                  { stdio: ['ignore', 'ignore', 'inherit'] });
let failed = false;
function check(cond, what) {
  console.log(cond ? 'ok:' : 'FAIL:', what);
  if (!cond) failed = true;
}
try {
  const base = `https://localhost:${port}/v1`;
  const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0 });
  for (let i = 0; i < 100; i++) {
    try { await client.models.list(); break; } catch { await new Promise((r) => setTimeout(r, 100)); }
  }
  const models = await client.models.list();
  check(models.data[0].id === 'stories260K', 'models.list over https');
  const prompt = 'Once upon a time';
  const ref = JSON.parse(execFileSync(tycho, ['generate', '--model', model, '--prompt', prompt,
                                              '-n', '16', '--temp', '0', '--json']));
  const c = await client.completions.create({ model: 'stories260K', prompt, max_tokens: 16,
                                              temperature: 0 });
  check(c.choices[0].text === ref.text, 'completions.create over https');
  let text = '';
  const s1 = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: prompt }], max_tokens: 16,
    temperature: 0, stream: true });
  for await (const chunk of s1) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content || '';
  }
  check(text === ref.text, 'a streamed chat completion over https');
  try {
    await new OpenAI({ baseURL: base, apiKey: hashed, maxRetries: 0 }).models.list();
    check(false, 'the hash itself as the key raises');
  } catch (e) {
    check(e.status === 401, `the hash itself as the key raises AuthenticationError (${e.status})`);
  }
} catch (e) {
  console.log('FAIL:', e);
  failed = true;
} finally {
  srv.kill('SIGTERM');
}
process.exit(failed ? 1 : 0);

// Structured output and tool calls through the official `openai` npm client, checked by `ajv`
// (a JSON-schema validator that shares no code with the server): response_format json_schema
// (20 schemas in schemas/, greedy, streamed and not, the same text both ways), json_object,
// temperature 1 with a seed, a small max_tokens, tools with tool_choice "required" and a named
// function (streamed tool calls reassembled by hand and by the client's stream helper), and 400s
// for unsupported schema keywords and malformed tools / response_format.
// Run by test_structured.py, which starts the server and sets TYCHO_BASE_URL, TYCHO_API_KEY,
// TYCHO_OPENAI_PEER (the peer folder holding openai and ajv) and TYCHO_SCHEMA_DIR.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const peer = process.env.TYCHO_OPENAI_PEER || '/opt/tycho-peers/openai';
const pkg = path.join(peer, 'node_modules/openai/index.mjs');
if (!existsSync(pkg) || !existsSync(path.join(peer, 'node_modules/ajv/package.json'))) {
  console.log('skip: openai or ajv missing in', peer);
  process.exit(77);
}
const { default: OpenAI } = await import(pathToFileURL(pkg).href);
const Ajv2020 = createRequire(path.join(peer, 'package.json'))('ajv/dist/2020').default;
const ajv = new Ajv2020({ allErrors: true });

const MODEL = 'stories260K';
const client = new OpenAI({ baseURL: process.env.TYCHO_BASE_URL, apiKey: process.env.TYCHO_API_KEY,
                            maxRetries: 0, timeout: 120000 });
let failed = false;
function check(cond, what) {
  console.log(cond ? 'ok:' : 'FAIL:', what);
  if (!cond) failed = true;
  return cond;
}
const show = (s, n = 90) => JSON.stringify(s === undefined ? null : s).slice(0, n);

// parse + validate: {ok, why}
function judge(validate, text) {
  let v;
  try { v = JSON.parse(text); } catch (e) { return { ok: false, why: `not JSON (${e.message})` }; }
  if (!validate(v)) return { ok: false, why: ajv.errorsText(validate.errors) };
  return { ok: true, why: '' };
}

async function chat(extra) {
  return client.chat.completions.create({
    model: MODEL, max_tokens: 400, temperature: 0,
    messages: [{ role: 'system', content: 'You answer in JSON.' },
               { role: 'user', content: 'Tell me about the little dog.' }], ...extra });
}

// streamed chat: {text, finish, tokens, chunks}
async function chatStream(extra) {
  const s = await chat({ ...extra, stream: true, stream_options: { include_usage: true } });
  const out = { text: '', finish: null, tokens: null, chunks: [] };
  for await (const c of s) {
    out.chunks.push(c);
    if (c.usage) out.tokens = c.usage.completion_tokens;
    for (const ch of c.choices) {
      out.text += ch.delta?.content || '';
      if (ch.finish_reason) out.finish = ch.finish_reason;
    }
  }
  return out;
}

function rf(name, schema) {
  return { type: 'json_schema', json_schema: { name, schema, strict: true } };
}

// ---- the validator itself must be able to say no ----------------------------------------------
const dir = process.env.TYCHO_SCHEMA_DIR;
const schemas = readdirSync(dir).filter((f) => f.endsWith('.json')).sort().map((f) => ({
  name: f.replace(/\.json$/, ''), schema: JSON.parse(readFileSync(path.join(dir, f), 'utf8')) }));
check(schemas.length === 20, `20 schemas in ${dir} (${schemas.length})`);
for (const s of schemas) s.validate = ajv.compile(s.schema);
check(schemas.every((s) => !s.validate({}) && !s.validate([]) && !s.validate('x')),
      'ajv rejects {}, [] and "x" under every schema (the peer is not vacuous)');

// ---- 20 schemas, greedy, non-streamed and streamed --------------------------------------------
async function runSchemas() {
  const rows = [];
  for (const s of schemas) {
    const row = { schema: s.name, tokens: '-', finish: '-', valid: false, same: false, out: '' };
    rows.push(row);
    try {
      const r = await chat({ response_format: rf(s.name, s.schema) });
      const text = r.choices[0].message.content;
      row.tokens = r.usage.completion_tokens;
      row.finish = r.choices[0].finish_reason;
      row.out = text;
      const j = judge(s.validate, text ?? '');
      row.valid = j.ok;
      check(j.ok, `${s.name}: non-streamed output validates${j.ok ? '' : ` (${j.why}): ${show(text)}`}`);
      const st = await chatStream({ response_format: rf(s.name, s.schema) });
      const js = judge(s.validate, st.text);
      check(js.ok, `${s.name}: streamed output validates${js.ok ? '' : ` (${js.why}): ${show(st.text)}`}`);
      row.same = st.text === text && st.tokens === row.tokens && st.finish === row.finish;
      check(row.same, `${s.name}: streamed == non-streamed` + (row.same ? '' :
            ` (text ${show(st.text, 60)} vs ${show(text, 60)}, tokens ${st.tokens} vs ${row.tokens},` +
            ` finish ${st.finish} vs ${row.finish})`));
    } catch (e) {
      check(false, `${s.name}: request failed: ${e.message}`);
      row.out = `error ${e.message}`;
    }
  }
  console.log('\nschema                 tokens finish  valid  stream==nonstream  output');
  for (const r of rows) {
    console.log(`${r.schema.padEnd(22)} ${String(r.tokens).padStart(6)} ${String(r.finish).padEnd(7)} ` +
                `${String(r.valid).padEnd(6)} ${String(r.same).padEnd(18)} ${show(r.out, 70)}`);
  }
  const nValid = rows.filter((r) => r.valid).length;
  console.log(`${nValid}/${rows.length} schemas validate (greedy, max_tokens 400)\n`);
  return rows;
}

// ---- sampling at temperature 1, and a small budget --------------------------------------------
async function runSampledAndShort() {
  const byName = Object.fromEntries(schemas.map((s) => [s.name, s]));
  for (const name of ['02_nested_address', '11_array_of_objects', '14_recursive_tree',
                      '17_anyof_objects', '19_event_log']) {
    const s = byName[name];
    for (const seed of [1, 2]) {
      try {
        const r = await chat({ response_format: rf(name, s.schema), temperature: 1, seed });
        const text = r.choices[0].message.content ?? '';
        const j = judge(s.validate, text);
        check(j.ok, `${name}: temperature 1 seed ${seed} validates (${r.usage.completion_tokens} ` +
              `tokens)${j.ok ? '' : ` (${j.why}): ${show(text)}`}`);
      } catch (e) {
        check(false, `${name}: temperature 1 seed ${seed}: ${e.message}`);
      }
    }
  }
  // the grammar closes the document before the budget runs out
  for (const [name, temperature] of [['14_recursive_tree', 0], ['14_recursive_tree', 1],
                                     ['19_event_log', 1], ['04_enum_color', 0]]) {
    const s = byName[name];
    try {
      const r = await chat({ response_format: rf(name, s.schema), max_tokens: 40, temperature,
                             seed: 3 });
      const text = r.choices[0].message.content ?? '';
      const j = judge(s.validate, text);
      check(j.ok && r.usage.completion_tokens <= 40,
            `${name}: max_tokens 40 temperature ${temperature} still gives valid JSON ` +
            `(${r.usage.completion_tokens} tokens, finish ${r.choices[0].finish_reason})` +
            (j.ok ? '' : ` (${j.why}): ${show(text)}`));
    } catch (e) {
      check(false, `${name}: max_tokens 40: ${e.message}`);
    }
  }
}

// ---- json_object -------------------------------------------------------------------------------
async function runJsonObject() {
  try {
    const r = await chat({ response_format: { type: 'json_object' } });
    const text = r.choices[0].message.content ?? '';
    let v = null;
    try { v = JSON.parse(text); } catch { /* v stays null */ }
    check(v !== null && typeof v === 'object' && !Array.isArray(v),
          `json_object: output is a JSON object (${r.usage.completion_tokens} tokens): ${show(text)}`);
    const st = await chatStream({ response_format: { type: 'json_object' } });
    check(st.text === text, `json_object: streamed == non-streamed (${show(st.text, 60)})`);
    const t1 = await chat({ response_format: { type: 'json_object' }, temperature: 1, seed: 9 });
    let v1 = null;
    try { v1 = JSON.parse(t1.choices[0].message.content ?? ''); } catch { /* null */ }
    check(v1 !== null && typeof v1 === 'object' && !Array.isArray(v1),
          `json_object: temperature 1 output is a JSON object: ${show(t1.choices[0].message.content)}`);
  } catch (e) {
    check(false, `json_object: ${e.message}`);
  }
}

// ---- tools -------------------------------------------------------------------------------------
const obj = (properties) => ({ type: 'object', properties, required: Object.keys(properties),
                               additionalProperties: false });
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    strict: true, parameters: obj({ city: { type: 'string', maxLength: 20 },
                                    unit: { enum: ['celsius', 'fahrenheit'] } }) } },
  { type: 'function', function: { name: 'add_numbers', description: 'Add two numbers',
    strict: true, parameters: obj({ a: { type: 'number' }, b: { type: 'number' } }) } },
];
const toolCheck = Object.fromEntries(TOOLS.map((t) => [t.function.name,
                                                       ajv.compile(t.function.parameters)]));

// every call well formed, an offered name (or `only`), arguments valid against its parameters
function checkCalls(what, calls, only) {
  if (!check(Array.isArray(calls) && calls.length >= 1, `${what}: tool_calls has an entry ` +
             `(${show(calls, 200)})`)) return;
  const ids = new Set();
  calls.forEach((c, i) => {
    const v = toolCheck[c.function?.name];
    const j = v ? judge(v, c.function.arguments ?? '') : { ok: false, why: 'not an offered name' };
    ids.add(c.id);
    check(typeof c.id === 'string' && c.id.length > 0 && c.type === 'function' && v &&
          (!only || c.function.name === only) && typeof c.function.arguments === 'string' && j.ok,
          `${what}: tool_calls[${i}] = ${c.function?.name}(${c.function?.arguments}) id ${c.id}` +
          (j.ok ? '' : ` (${j.why})`));
  });
  check(ids.size === calls.length, `${what}: tool call ids are distinct`);
}

// reassemble streamed tool calls by hand, checking the shape OpenAI streams: the first delta
// of a call carries index, id, type and function.name; later ones only argument text
function assembleCalls(what, chunks) {
  const calls = [];
  let finish = null, content = '', shapeOk = true;
  for (const c of chunks) {
    for (const ch of c.choices) {
      content += ch.delta?.content || '';
      if (ch.finish_reason) finish = ch.finish_reason;
      for (const d of ch.delta?.tool_calls ?? []) {
        if (!Number.isInteger(d.index)) { shapeOk = false; continue; }
        if (!calls[d.index]) {
          if (!(d.id && d.type === 'function' && d.function?.name)) shapeOk = false;
          calls[d.index] = { id: d.id, type: d.type,
                             function: { name: d.function?.name, arguments: '' } };
        } else if ((d.id && d.id !== calls[d.index].id) || d.function?.name) {
          shapeOk = false;
        }
        calls[d.index].function.arguments += d.function?.arguments ?? '';
      }
    }
  }
  check(shapeOk && !calls.includes(undefined),
        `${what}: streamed tool-call deltas have OpenAI's shape (first: index, id, type, name)`);
  return { calls, finish, content };
}

const sameCalls = (a, b) => JSON.stringify((a ?? []).map((c) => [c.type, c.function.name,
  c.function.arguments])) === JSON.stringify((b ?? []).map((c) => [c.type, c.function.name,
  c.function.arguments]));

async function runTools() {
  const named = { type: 'function', function: { name: 'add_numbers' } };
  const base = { messages: [{ role: 'user', content: 'What is the weather in Paris? Add 2 and 3.' }],
                 tools: TOOLS };
  for (const [label, tool_choice, only] of [['required', 'required', null],
                                            ['named add_numbers', named, 'add_numbers']]) {
    const what = `tools, tool_choice ${label}`;
    try {
      const r = await chat({ ...base, tool_choice });
      const m = r.choices[0].message;
      check(r.choices[0].finish_reason === 'tool_calls' && m.content === null,
            `${what}: finish_reason "tool_calls" (${r.choices[0].finish_reason}), content null ` +
            `(${show(m.content)})`);
      checkCalls(what, m.tool_calls, only);
      const st = await chatStream({ ...base, tool_choice });
      const a = assembleCalls(`${what} streamed`, st.chunks);
      check(a.finish === 'tool_calls' && a.content === '',
            `${what} streamed: finish_reason "tool_calls" (${a.finish}), no content (${show(a.content)})`);
      checkCalls(`${what} streamed`, a.calls, only);
      check(sameCalls(a.calls, m.tool_calls),
            `${what}: streamed calls == non-streamed (${show(a.calls, 200)} vs ${show(m.tool_calls, 200)})`);
      // the client's own stream helper must accept the stream and assemble the same calls
      const runner = client.chat.completions.stream({ model: MODEL, max_tokens: 400, temperature: 0,
                                                      ...base, tool_choice });
      try {
        const fin = await runner.finalChatCompletion();
        check(fin.choices[0].finish_reason === 'tool_calls' &&
              sameCalls(fin.choices[0].message.tool_calls, m.tool_calls),
              `${what}: the openai stream helper assembles the same calls ` +
              `(${show(fin.choices[0].message.tool_calls, 200)})`);
      } catch (e) {
        check(false, `${what}: the openai stream helper fails: ${e.message}`);
      }
      const t1 = await chat({ ...base, tool_choice, temperature: 1, seed: 4 });
      check(t1.choices[0].finish_reason === 'tool_calls',
            `${what} temperature 1: finish_reason "tool_calls" (${t1.choices[0].finish_reason})`);
      checkCalls(`${what} temperature 1`, t1.choices[0].message.tool_calls, only);
    } catch (e) {
      check(false, `${what}: ${e.message}`);
    }
  }
  try {
    const r = await chat({ ...base, tool_choice: 'none', max_tokens: 16 });
    check(!r.choices[0].message.tool_calls?.length && r.choices[0].finish_reason !== 'tool_calls',
          `tool_choice none: no tool calls (finish ${r.choices[0].finish_reason})`);
  } catch (e) {
    check(false, `tool_choice none: ${e.message}`);
  }
}

// ---- bad requests: 400, the reason named; the server keeps serving -----------------------------
async function expect400(what, extra, { param, mentions } = {}) {
  try {
    const r = await chat({ max_tokens: 4, ...extra });
    check(false, `${what}: 400 expected, got 200 (${show(r.choices[0].message)})`);
  } catch (e) {
    const msg = String(e.error?.message ?? e.message ?? '');
    const ok = e.status === 400 && (!param || e.param === param) &&
               (!mentions || msg.includes(mentions));
    check(ok, `${what}: 400${param ? ` param ${param}` : ''}${mentions ? ` naming '${mentions}'` : ''}` +
          ` (got ${e.status}, param ${e.param}: ${msg.slice(0, 160)})`);
  }
}

async function runBad() {
  const RF = 'response_format';
  const withKw = (kw, v) => rf('bad', obj({ name: { type: 'string', [kw]: v } }));
  await expect400('schema with pattern', { response_format: withKw('pattern', '^[a-z]+$') },
                  { param: RF, mentions: 'pattern' });
  await expect400('schema with minimum', { response_format: rf('bad', obj({ n: { type: 'integer',
                  minimum: 3 } })) }, { param: RF, mentions: 'minimum' });
  await expect400('schema with uniqueItems', { response_format: rf('bad', obj({ l: { type: 'array',
                  uniqueItems: true } })) }, { param: RF, mentions: 'uniqueItems' });
  await expect400('tool parameters with pattern, tool_choice required', {
    tools: [{ type: 'function', function: { name: 'f', parameters: obj({ s: { type: 'string',
             pattern: 'x+' } }) } }], tool_choice: 'required' }, { mentions: 'pattern' });
  await expect400('response_format a string', { response_format: 'json' }, { param: RF });
  await expect400('response_format type xml', { response_format: { type: 'xml' } }, { param: RF });
  await expect400('json_schema missing', { response_format: { type: 'json_schema' } }, { param: RF });
  await expect400('json_schema.schema not an object', { response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: 'object' } } }, { param: RF });
  await expect400('schema with an unknown type', { response_format: rf('bad', obj({ a: {
    type: 'strin' } })) }, { param: RF });
  await expect400('schema $ref to a missing definition', { response_format: rf('bad', obj({ a: {
    $ref: '#/$defs/nope' } })) }, { param: RF });
  await expect400('tools not an array', { tools: 'get_weather' }, { param: 'tools' });
  await expect400('tool without function', { tools: [{ type: 'function' }] }, { param: 'tools' });
  await expect400('tool function without name', { tools: [{ type: 'function', function: {
    description: 'x' } }] }, { param: 'tools' });
  await expect400('tool of type retrieval', { tools: [{ type: 'retrieval', function: { name: 'f' } }] },
                  { param: 'tools' });
  await expect400('duplicate tool names', { tools: [TOOLS[0], TOOLS[0]] }, { param: 'tools' });
  await expect400('tool parameters not an object', { tools: [{ type: 'function', function: {
    name: 'f', parameters: 'none' } }] }, { param: 'tools' });
  await expect400('tool_choice names a tool not offered', { tools: TOOLS, tool_choice: {
    type: 'function', function: { name: 'launch' } } }, { param: 'tool_choice' });
  await expect400('tool_choice unknown string', { tools: TOOLS, tool_choice: 'sometimes' },
                  { param: 'tool_choice' });
  await expect400('tool_choice required without tools', { tool_choice: 'required' },
                  { param: 'tool_choice' });
}

async function runStillServing(rows) {
  try {
    const r = await chat({ max_tokens: 16 });
    check(r.choices[0].message.content.length > 0 && r.usage.completion_tokens > 0,
          `after the bad requests a plain chat succeeds (${show(r.choices[0].message.content, 60)})`);
    const s = schemas[0];
    const again = await chat({ response_format: rf(s.name, s.schema) });
    check(again.choices[0].message.content === rows[0].out,
          `after the bad requests ${s.name} gives the same greedy output as before`);
  } catch (e) {
    check(false, `after the bad requests: ${e.message}`);
  }
}

try {
  const rows = await runSchemas();
  await runSampledAndShort();
  await runJsonObject();
  await runTools();
  await runBad();
  await runStillServing(rows);
} catch (e) {
  console.log('FAIL:', e);
  failed = true;
}
process.exit(failed ? 1 : 0);

// bench/lifecycle.py's Node row (the repository's bench/): a Node host running KIE calls through clients/node's
// runTask (start_call, the create, task_created, polls, the host's own media storage,
// succeeded), as a BullMQ worker's handler does, minus the queue. One long-lived process:
// the Python bench sends a round as one JSON line on stdin ({"jobs": [...], "concurrency":
// N}; "bare": true for the same provider and media work with nothing recorded) and times
// it; the process answers one line ({"done": N} or {"error": "..."}).
//
// Environment: DATABASE_URL, CALLWARDEN_KIE_URL, KIE_API_KEY, BENCH_MEDIA_DIR,
// BENCH_POOL_SIZE (default 8, as the Python rows' pools).

import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';

import pg from 'pg';

import { Callwarden, CreateRefused } from '../src/index.js';

/** @param {string} name */
function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`clients/node/bench/lifecycle_host.mjs: ${name} is not set`);
  return value;
}

const KIE = need('CALLWARDEN_KIE_URL').replace(/\/$/, '');
const HEADERS = { Authorization: `Bearer ${need('KIE_API_KEY')}`,
                  'Content-Type': 'application/json' };
const MEDIA = need('BENCH_MEDIA_DIR');
const REQUEST = JSON.stringify({
  model: 'nano-banana-pro',
  input: { prompt: 'bench', _sim: { steps: [{ phase: 'running', polls: 1 }],
                                    end: 'succeeded' } },
});

const pool = new pg.Pool({ connectionString: need('DATABASE_URL'),
                           max: Number(process.env.BENCH_POOL_SIZE ?? 8) });
const cw = new Callwarden(pool);

/**
 * One KIE request: the envelope's data, or a throw (a 4xx envelope on the create is a
 * refusal: nothing exists upstream).
 * @param {string} path
 * @param {RequestInit} [init]
 */
async function kie(path, init = {}) {
  const resp = await fetch(`${KIE}${path}`, { ...init, headers: HEADERS });
  const body = /** @type {{code: number, msg: string, data: any}} */ (await resp.json());
  if (body.code !== 200) throw new Error(`KIE ${path}: ${body.code} ${body.msg}`);
  return body.data;
}

async function create() {
  try {
    return /** @type {string} */ (
      (await kie('/api/v1/jobs/createTask', { method: 'POST', body: REQUEST })).taskId);
  } catch (err) {
    throw new CreateRefused(String(err));
  }
}

/**
 * One status request; a success's media downloaded and kept under the job's keys (the
 * host's own storage, as a worker's).
 * @param {string} jobId
 * @param {string} taskId
 * @returns {Promise<import('../src/run.js').PollResult>}
 */
async function poll(jobId, taskId) {
  const data = await kie(`/api/v1/jobs/recordInfo?taskId=${encodeURIComponent(taskId)}`);
  if (data.state === 'fail') return { status: 'failed', error: String(data.failMsg) };
  if (data.state !== 'success') return { status: 'running' };
  /** @type {string[]} */
  const urls = JSON.parse(data.resultJson || '{}').resultUrls ?? [];
  const media = [];
  for (const [i, url] of urls.entries()) {
    const resp = await fetch(url);
    if (!resp.ok) throw new Error(`media ${url}: HTTP ${resp.status}`);
    const bytes = Buffer.from(await resp.arrayBuffer());
    const key = `node/${jobId}/${i}`;
    const path = join(MEDIA, key);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, bytes);
    media.push({ key, url: `/media/${key}`, size: bytes.length,
                 content_type: resp.headers.get('content-type')?.split(';')[0]
                   ?? 'application/octet-stream' });
  }
  return { status: 'succeeded', media, result: { media_urls: urls } };
}

/** @param {string} jobId */
async function runOne(jobId) {
  const run = await cw.runTask({
    jobId, kind: 'kie-standard', actor: 'bench-node', pollEveryMs: 0,
    heartbeatEveryMs: 10_000, create, poll: (taskId) => poll(jobId, taskId),
  });
  if (run.status !== 'recorded' || run.outcome?.settlement !== 'settled') {
    throw new Error(`job ${jobId}: ${JSON.stringify(run)}`);
  }
}

/**
 * The same provider and media work with nothing recorded: the Node floor.
 * @param {string} jobId
 */
async function bareOne(jobId) {
  const taskId = await create();
  while ((await poll(jobId, taskId)).status === 'running');
}

/** @param {{jobs: string[], concurrency: number, bare?: boolean}} round */
async function runRound({ jobs, concurrency, bare = false }) {
  let next = 0;
  const one = bare ? bareOne : runOne;
  const worker = async () => {
    while (next < jobs.length) await one(jobs[next++]);
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return jobs.length;
}

const lines = createInterface({ input: process.stdin });
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
for await (const line of lines) {
  try {
    const done = await runRound(JSON.parse(line));
    process.stdout.write(`${JSON.stringify({ done })}\n`);
  } catch (err) {
    process.stdout.write(`${JSON.stringify({ error: String(err) })}\n`);
  }
}
await pool.end();

// bench/lifecycle.py's Node row: a Node host running KIE calls through clients/node's
// runTask (start_call, the create, task_created, polls, the host's own media storage,
// succeeded), as a BullMQ worker's handler does, minus the queue, with the same host
// code the BullMQ proof's worker uses (test/support: its KIE client and media store).
// One long-lived process: the Python bench sends a round as one JSON line on stdin
// ({"jobs": [...], "concurrency": N}; "bare": true for the same provider and media work
// with nothing recorded) and times it; the process answers one line ({"done": N} or
// {"error": "..."}).
//
// Environment: DATABASE_URL, CALLWARDEN_KIE_URL, KIE_API_KEY, BENCH_MEDIA_DIR,
// BENCH_POOL_SIZE (default 8, as the Python rows' pools).

import { createInterface } from 'node:readline';

import pg from 'pg';

import { Callwarden, CreateRefused } from '../src/index.js';
import { KieClient } from '../test/support/kie.js';
import { storeMedia } from '../test/support/media.js';

/** @param {string} name */
function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`clients/node/bench/lifecycle_host.mjs: ${name} is not set`);
  return value;
}

const kie = new KieClient({ baseUrl: need('CALLWARDEN_KIE_URL'), apiKey: need('KIE_API_KEY') });
const MEDIA = need('BENCH_MEDIA_DIR');
const MODEL = 'nano-banana-pro';
const INPUT = { prompt: 'bench', _sim: { steps: [{ phase: 'running', polls: 1 }],
                                         end: 'succeeded' } };

const pool = new pg.Pool({ connectionString: need('DATABASE_URL'),
                           max: Number(process.env.BENCH_POOL_SIZE ?? 8) });
const cw = new Callwarden(pool);

async function create() {
  try {
    return await kie.createKieTask(MODEL, INPUT);
  } catch (err) {
    throw new CreateRefused(String(err)); // (the simulator refuses nothing here)
  }
}

/**
 * One status request; a success's media downloaded and kept under the job's keys.
 * @param {string} jobId
 * @param {string} taskId
 * @returns {Promise<import('../src/run.js').PollResult>}
 */
async function poll(jobId, taskId) {
  const polled = await kie.pollOnce(taskId);
  if (polled.status !== 'succeeded') return polled;
  return { status: 'succeeded', media: await storeMedia(MEDIA, jobId, polled.resultUrls),
           result: { media_urls: polled.resultUrls } };
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

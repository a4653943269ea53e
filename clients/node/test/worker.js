// A BullMQ worker process on the seed's stack (Node, BullMQ over Redis, Postgres), making
// KIE calls through the host's own client (support/kie.js) with callwarden's client around
// it. Started by bullmq.test.js as a child it can SIGKILL or SIGSTOP.
//
// Two handlers, both shapes of docs/node.md:
//   run     cw.runTask({create, poll}): the loop is callwarden's
//   manual  the seed's runKieTask kept as it is, three calls added (startCall before the
//           create, taskCreated as its onTaskCreated, the outcome after it) and a Beater
//
// Failpoints (NODE_WORKER_FAILPOINT), the moments a test stops a worker at:
//   hang-after-poll  after a poll that answered running: report `hanging`, never go on
//   pause-in-create  after the create request answered: report `created-upstream`, wait
//                    for the test's release file (the test SIGSTOPs the process meanwhile)
//   hold-success     after storing a succeeded task's media: report `holding`, wait for
//                    the release file, then report the outcome
//
// Every event is one JSON line on stdout: ready, created-upstream, polled, hanging,
// holding, done (with runTask's result or the manual handler's), waiting (a start the
// account's limits refused: the job goes back to BullMQ's delayed set, src/bullmq.js),
// failed, error.

import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { Worker } from 'bullmq';
import pg from 'pg';

import { delayIfWaiting } from '../src/bullmq.js';
import { Beater, Callwarden, actorId } from '../src/index.js';
import { KieClient, KieTaskFailed, KieTaskNotFound } from './support/kie.js';
import { storeMedia } from './support/media.js';

const env = process.env;
/** @param {string} name */
const need = (name) => {
  const value = env[name];
  if (!value) throw new Error(`worker: ${name} is not set`);
  return value;
};

const KIND = 'kie-standard';
const MODEL = 'nano-banana-pro';
const QUEUE = need('NODE_WORKER_QUEUE');
const HANDLER = env.NODE_WORKER_HANDLER ?? 'run';
const FAILPOINT = env.NODE_WORKER_FAILPOINT ?? '';
const CONTROL = need('NODE_WORKER_CONTROL_DIR');
const MEDIA = need('NODE_WORKER_MEDIA_DIR');
const HEARTBEAT_MS = Number(env.NODE_WORKER_HEARTBEAT_MS ?? 500);
const POLL_MS = Number(env.NODE_WORKER_POLL_MS ?? 100);

/**
 * One event line for the test.
 * @param {string} event
 * @param {Record<string, unknown>} [data]
 */
function emit(event, data = {}) {
  process.stdout.write(`${JSON.stringify({ event, pid: process.pid, ...data })}\n`);
}

/**
 * Wait (without blocking the event loop) until the test writes `release-<jobId>`.
 * @param {string} jobId
 */
async function released(jobId) {
  const file = join(CONTROL, `release-${jobId}`);
  const deadline = Date.now() + 60_000;
  while (!existsSync(file)) {
    if (Date.now() > deadline) throw new Error(`no release for ${jobId} within 60 s`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const db = new pg.Pool({ connectionString: need('DATABASE_URL'), max: 4 });
db.on('error', (err) => emit('error', { where: 'pool', message: err.message }));
const cw = new Callwarden(db);
const kie = new KieClient({ baseUrl: need('CALLWARDEN_KIE_URL'), apiKey: need('KIE_API_KEY') });
const actor = actorId('worker');

/**
 * @typedef {Object} JobData
 * @property {string} jobId callwarden's job (the host's jobs row)
 * @property {string} prompt
 * @property {unknown} [script] the simulator's script for this task
 */

/** @param {JobData} data */
const kieInput = (data) => ({ prompt: `${data.prompt} job:${data.jobId}`, _sim: data.script });

/** @param {string} jobId @param {string} taskId */
async function afterCreate(jobId, taskId) {
  if (FAILPOINT !== 'pause-in-create') return;
  emit('created-upstream', { jobId, taskId });
  await released(jobId);
}

/**
 * @param {string} jobId
 * @param {import('./support/kie.js').KiePoll} polled
 * @param {string} taskId
 */
async function afterPoll(jobId, polled, taskId) {
  emit('polled', { jobId, taskId, status: polled.status });
  if (FAILPOINT === 'hang-after-poll' && polled.status === 'running') {
    emit('hanging', { jobId, taskId });
    await new Promise(() => {}); // mid-poll, until the test kills this process
  }
}

/** @param {string} jobId */
async function beforeReport(jobId) {
  if (FAILPOINT !== 'hold-success') return;
  emit('holding', { jobId });
  await released(jobId);
}

/**
 * The handler with callwarden's loop.
 * @param {JobData} data
 * @param {AbortSignal | undefined} signal BullMQ's (a cancelled job)
 */
async function runHandler(data, signal) {
  const { jobId } = data;
  return cw.runTask({
    jobId, kind: KIND, actor, signal, heartbeatEveryMs: HEARTBEAT_MS, pollEveryMs: POLL_MS,
    create: async (ctx) => {
      const taskId = await kie.createKieTask(MODEL, kieInput(data), { signal: ctx.signal });
      await afterCreate(jobId, taskId);
      return taskId;
    },
    poll: async (taskId, ctx) => {
      const polled = await kie.pollOnce(taskId, { signal: ctx.signal });
      await afterPoll(jobId, polled, taskId);
      if (polled.status !== 'succeeded') return polled;
      const media = await storeMedia(MEDIA, jobId, polled.resultUrls);
      await beforeReport(jobId);
      return { status: 'succeeded', media, result: { media_urls: polled.resultUrls } };
    },
    onError: (err, where) => emit('error', { jobId, where, message: String(err) }),
  });
}

/**
 * The seed's handler, three calls added.
 * @param {JobData} data
 */
async function manualHandler(data) {
  const { jobId } = data;
  const call = await cw.startCall({ jobId, kind: KIND, actor }); // 1: the claim
  if (call.action === 'wait') { // the account's limits: delayed, below (no attempt)
    return { action: call.action, status: 'waiting', reason: call.reason,
             retryAfterMs: call.retryAfterMs };
  }
  if (call.action !== 'create' && call.action !== 'resume') {
    return { action: call.action, status: 'skipped' };
  }
  const beat = new Beater({ cw, jobId, owner: actor, everyMs: HEARTBEAT_MS }).start();
  try {
    const result = await kie.runKieTask(MODEL, kieInput(data), {
      resumeTaskId: call.taskId, // the seed's Phase 4 guard, from the database
      onTaskCreated: (taskId) => cw.taskCreated({ jobId, taskId, actor }), // 2: the task id
      afterCreate: (taskId) => afterCreate(jobId, taskId),
      onPoll: (polled, taskId) => afterPoll(jobId, polled, taskId),
      pollEveryMs: POLL_MS,
    });
    const media = await storeMedia(MEDIA, jobId, result.resultUrls);
    await beforeReport(jobId);
    const outcome = await cw.succeeded({ // 3: the outcome, with its settlement
      jobId, actor, media, result: { media_urls: result.resultUrls },
    });
    return { action: call.action, status: 'recorded', upstream: 'succeeded', outcome };
  } catch (err) {
    if (err instanceof KieTaskFailed) {
      const outcome = await cw.failed({ jobId, actor, error: err.message, code: err.code });
      return { action: call.action, status: 'recorded', upstream: 'failed', outcome };
    }
    if (err instanceof KieTaskNotFound) {
      const outcome = await cw.notFound({ jobId, actor });
      return { action: call.action, status: 'recorded', upstream: 'not_found', outcome };
    }
    throw err;
  } finally {
    await beat.stop();
  }
}

const url = new URL(need('REDIS_URL'));
const worker = new Worker(QUEUE, async (job, token, signal) => {
  /** @type {JobData} */
  const data = job.data;
  const result = HANDLER === 'manual' ? await manualHandler(data)
    : await runHandler(data, signal);
  emit(result.status === 'waiting' ? 'waiting' : 'done',
       { jobId: data.jobId, handler: HANDLER, result });
  return delayIfWaiting(job, token, result);
}, {
  connection: { host: url.hostname, port: Number(url.port || 6379),
                db: Number(url.pathname.slice(1) || 0), maxRetriesPerRequest: null },
  concurrency: Number(env.NODE_WORKER_CONCURRENCY ?? 1),
  lockDuration: Number(env.NODE_WORKER_LOCK_MS ?? 30_000),
  stalledInterval: Number(env.NODE_WORKER_STALLED_MS ?? 30_000),
  maxStalledCount: 1,
});
worker.on('failed', (job, err) => emit('failed', { jobId: job?.data?.jobId, message: err.message }));
worker.on('error', (err) => emit('error', { where: 'bullmq', message: err.message }));
worker.waitUntilReady().then(
  () => emit('ready', { handler: HANDLER, failpoint: FAILPOINT }),
  (err) => emit('error', { where: 'bullmq', message: String(err) }));

process.on('SIGTERM', async () => {
  await worker.close();
  await db.end();
  process.exit(0);
});

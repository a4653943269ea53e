// The proof on the seed's stack: real BullMQ workers (child processes, test/worker.js) over
// Redis and Postgres, calling the KIE simulator, killed and paused at the moments that
// used to bill twice or leak credits; a sync route beating through a reconcile pass; and
// Node's `succeeded` racing callwarden's own reconciler. Everything waits on conditions
// (bounded), never on time alone. Figures of each scenario: t.diagnostic (ℹ lines).
//
// Env (tests/acceptance/test_node_host.py sets it): DATABASE_URL, REDIS_URL,
// CALLWARDEN_KIE_URL + KIE_API_KEY, CALLWARDEN_ANTHROPIC_URL + ANTHROPIC_API_KEY,
// CALLWARDEN_PYTHON (callwarden's CLI: reconcile --once, verify).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Queue } from 'bullmq';

import { Callwarden } from '../src/index.js';
import { callwarden, need, pool, verify } from './support/env.js';
import { WorkerProcess } from './support/procs.js';
import { jobRow, ledger, usage } from './support/rows.js';
import { kieCreatesPerJob, kiePollsPerTask } from './support/sim.js';
import { until } from './support/wait.js';

const LOCK_MS = 2_000;
const STALLED_MS = 500;

const db = pool(6);
const cw = new Callwarden(db);
/** @type {string} */
let tmp;
/** @type {WorkerProcess[]} */
const started = [];
/** Every queue opened here (closed at the end even when a test failed midway). */
const queues = /** @type {Queue[]} */ ([]);
/** Every job that made KIE calls here (each must show exactly one create). */
const kieJobs = /** @type {string[]} */ ([]);

const redis = new URL(need('REDIS_URL'));
const connection = { host: redis.hostname, port: Number(redis.port || 6379),
                     db: Number(redis.pathname.slice(1) || 0) };

before(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'cw-node-'));
  await mkdir(join(tmp, 'control'));
  // The audit the end state reads: every change of a reservation's status, by whoever
  // made it (the functions, the reconciler, a stray write), as Postgres saw it.
  await db.query(`
    CREATE TABLE usage_audit (
      usage_id bigint NOT NULL, job_id uuid NOT NULL, old_status text, new_status text,
      charged numeric, at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE FUNCTION usage_audit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO usage_audit (usage_id, job_id, old_status, new_status, charged)
      VALUES (NEW.id, NEW.job_id, OLD.status, NEW.status, NEW.credits_charged);
      RETURN NEW;
    END $$;
    CREATE TRIGGER usage_audit AFTER UPDATE ON usage_logs FOR EACH ROW
      WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION usage_audit();`);
});
after(async () => {
  await Promise.all(started.map((w) => w.kill()));
  await Promise.all(queues.map((q) => q.close()));
  await db.end();
  await rm(tmp, { recursive: true, force: true });
});

/**
 * A worker process on `queue`.
 * @param {string} name
 * @param {string} queue
 * @param {Record<string, string>} env
 */
function worker(name, queue, env = {}) {
  const w = new WorkerProcess(name, {
    NODE_WORKER_QUEUE: queue, NODE_WORKER_CONTROL_DIR: join(tmp, 'control'),
    NODE_WORKER_MEDIA_DIR: join(tmp, 'media'), NODE_WORKER_LOCK_MS: String(LOCK_MS),
    NODE_WORKER_STALLED_MS: String(STALLED_MS), ...env,
  });
  started.push(w);
  return w;
}

/** Let a worker parked at a failpoint go on. @param {string} jobId */
const release = (jobId) => writeFile(join(tmp, 'control', `release-${jobId}`), '');

/**
 * `n` jobs (10 credits each) queued on a fresh BullMQ queue; the simulator's task for
 * each follows `script`.
 * @param {number} n
 * @param {unknown} script
 */
async function enqueue(n, script) {
  const queue = new Queue(`cw-node-${randomUUID().slice(0, 8)}`, { connection });
  queues.push(queue);
  const jobs = [];
  for (let i = 0; i < n; i += 1) {
    jobs.push(await cw.createJob({ userId: 'user-bullmq', credits: 10,
                                   input: { prompt: 'a lighthouse at dusk' } }));
  }
  kieJobs.push(...jobs);
  await queue.addBulk(jobs.map((jobId) => ({
    name: 'generate', data: { jobId, prompt: 'a lighthouse at dusk', script },
    opts: { jobId, removeOnComplete: false, removeOnFail: false },
  })));
  return { queue, jobs };
}

/**
 * The end every KIE scenario must reach: each call completed once, its one reservation
 * committed once, one asset row, one create request upstream.
 * @param {string[]} jobs
 */
async function assertExactlyOnce(jobs) {
  const rows = await ledger(db, jobs);
  assert.equal(rows.length, jobs.length);
  for (const row of rows) {
    assert.deepEqual(
      { state: row.call_state, status: row.status, reservations: row.reservations,
        settled: row.settled, settlement: row.settlement, completions: row.completions,
        assets: row.assets },
      { state: 'completed', status: 'completed', reservations: 1, settled: 1,
        settlement: 'committed', completions: 1, assets: 1 }, `job ${row.job}`);
  }
  const creates = await kieCreatesPerJob();
  assert.deepEqual(jobs.map((j) => creates.get(j) ?? 0), jobs.map(() => 1), 'creates per job');
  return rows;
}

/** @param {string[]} jobs @param {string} state */
async function countIn(jobs, state) {
  const { rows } = await db.query(
    'SELECT count(*)::int AS n FROM jobs WHERE id = ANY($1::uuid[]) AND call_state = $2',
    [jobs, state]);
  return rows[0].n;
}

describe('BullMQ workers over callwarden', () => {
  test('(a) workers SIGKILLed mid-poll: the redelivery resumes the task, one create per job',
    async (t) => {
      const began = Date.now();
      const { queue, jobs } = await enqueue(6, {
        steps: [{ phase: 'running', polls: 2 }], end: 'succeeded' });
      const first = [
        worker('gen1-a', queue.name, { NODE_WORKER_CONCURRENCY: '3',
                                       NODE_WORKER_FAILPOINT: 'hang-after-poll' }),
        worker('gen1-b', queue.name, { NODE_WORKER_CONCURRENCY: '3',
                                       NODE_WORKER_FAILPOINT: 'hang-after-poll' }),
      ];
      await until('all six calls mid-poll in the first generation',
        () => first.flatMap((w) => w.of('hanging')).length === 6, { timeoutMs: 30_000 })
        .catch((err) => { throw new Error(`${err.message}\n${first.map((w) => w.log()).join('\n')}`); });
      assert.equal(await countIn(jobs, 'polling'), 6, 'every task id durable before the kill');
      for (const w of first) await w.kill();
      const second = [
        worker('gen2-run', queue.name, { NODE_WORKER_CONCURRENCY: '3' }),
        worker('gen2-manual', queue.name, { NODE_WORKER_CONCURRENCY: '3',
                                            NODE_WORKER_HANDLER: 'manual' }),
      ];
      await until('every call completed after the redelivery',
        async () => (await countIn(jobs, 'completed')) === 6, { timeoutMs: 40_000 })
        .catch((err) => { throw new Error(`${err.message}\n${second.map((w) => w.log()).join('\n')}`); });
      await until('every BullMQ job completed',
        async () => (await queue.getJobCounts('completed')).completed === 6);
      const done = second.flatMap((w) => w.of('done'));
      assert.deepEqual(done.map((e) => e.jobId).sort(), [...jobs].sort(),
                       'one redelivery per job');
      for (const e of done) {
        assert.equal(/** @type {{action: string}} */ (e.result).action, 'resume',
                     JSON.stringify(e));
      }
      /** @type {number[]} */
      const stalled = [];
      for (const jobId of jobs) {
        const job = await queue.getJob(jobId);
        stalled.push(Number(job?.stalledCounter ?? 0));
      }
      assert.deepEqual(stalled, jobs.map(() => 1), 'BullMQ saw each job stall once');
      await assertExactlyOnce(jobs);
      const polls = await kiePollsPerTask();
      const tasks = (await db.query('SELECT provider_task_id AS t FROM jobs WHERE id = ANY($1)',
                                    [jobs])).rows.map((r) => polls.get(r.t) ?? 0);
      assert.ok(tasks.every((n) => n >= 3), `polls per task ${tasks}`);
      const byHandler = { run: 0, manual: 0 };
      for (const e of done) byHandler[/** @type {'run' | 'manual'} */ (e.handler)] += 1;
      t.diagnostic(`(a) jobs 6, workers SIGKILLed 2 with 6 calls mid-poll, redeliveries 6 `
        + `(all resume; run ${byHandler.run}, manual ${byHandler.manual}), stalled once each, `
        + `creates per job 1, polls per task ${Math.min(...tasks)}..${Math.max(...tasks)}, `
        + `${Date.now() - began} ms`);
      await Promise.all(second.map((w) => w.stop()));
      await queue.close();
    });

  test('(b) a delivery paused in its create past the lock: the redelivery never creates',
    async (t) => {
      const began = Date.now();
      const { queue, jobs } = await enqueue(2, {
        steps: [{ phase: 'running', polls: 1 }], end: 'succeeded' });
      const paused = worker('paused', queue.name, {
        NODE_WORKER_CONCURRENCY: '2', NODE_WORKER_HANDLER: 'manual',
        NODE_WORKER_FAILPOINT: 'pause-in-create' });
      await paused.saw('created-upstream', 2);
      paused.signal('SIGSTOP'); // no lock renewal from here: BullMQ will call it stalled
      const stoppedAt = Date.now();
      const second = worker('second', queue.name, { NODE_WORKER_CONCURRENCY: '2' });
      const redelivered = await second.saw('done', 2, 30_000);
      const pausedForMs = Date.now() - stoppedAt;
      for (const jobId of jobs) {
        const job = await queue.getJob(jobId);
        assert.equal(job?.stalledCounter, 1, 'redelivered by BullMQ as stalled (lock expired)');
      }
      for (const e of redelivered) {
        const result = /** @type {{action: string, status: string}} */ (e.result);
        assert.deepEqual([result.action, result.status], ['ambiguous', 'skipped']);
      }
      for (const jobId of jobs) {
        const row = await jobRow(db, jobId);
        assert.deepEqual([row.call_state, row.provider_task_id], ['created', null]);
        assert.equal((await usage(db, jobId))[0].status, 'reserved');
      }
      for (const jobId of jobs) await release(jobId);
      paused.signal('SIGCONT');
      const finished = await paused.saw('done', 2, 30_000);
      for (const e of finished) {
        const result = /** @type {{action: string, outcome: {ok: boolean}}} */ (e.result);
        assert.equal(result.action, 'create');
        assert.equal(result.outcome.ok, true);
      }
      await assertExactlyOnce(jobs);
      const bullErrors = paused.of('error').filter((e) => e.where === 'bullmq');
      const kinds = [...new Set(bullErrors.map((e) => String(e.message)
        .replace(/[0-9a-f]{8}-[0-9a-f-]{27}/g, '<job>')))];
      t.diagnostic(`(b) jobs 2, paused (SIGSTOP) ${pausedForMs} ms after the create request `
        + `(lockDuration ${LOCK_MS} ms), redeliveries 2 (ambiguous: skipped, no create), `
        + `the paused delivery finished both; creates per job 1; BullMQ errors in the paused `
        + `worker ${bullErrors.length} (${kinds.join('; ')}); ${Date.now() - began} ms`);
      await Promise.all([paused.stop(), second.stop()]);
      await queue.close();
    });
});

describe('callwarden reconcile beside Node', () => {
  /** The reconciler's own media folder. */
  const reconcileEnv = () => ({ CALLWARDEN_MEDIA_DIR: join(tmp, 'reconciler-media') });

  test('(c) a sync call longer than its threshold is not swept while it beats', async (t) => {
    const began = Date.now();
    const anthropic = need('CALLWARDEN_ANTHROPIC_URL');
    /** @type {() => void} */
    let open = () => {};
    const gate = new Promise((resolve) => { open = () => resolve(undefined); });
    /** @type {string[]} */
    const routeJobs = [];
    // The host's sync route (the seed's ai-writer): reserve, then call the model inside
    // runSync, answer from it.
    const server = http.createServer(async (req, res) => {
      const jobId = await cw.createJob({ userId: 'user-sync', credits: 3,
                                        input: { prompt: 'a haiku' }, jobType: 'text' });
      routeJobs.push(jobId);
      const run = await cw.runSync({
        jobId, kind: 'anthropic-sync', heartbeatEveryMs: 200,
        call: async ({ signal }) => {
          await gate; // the model is slow: held until the reconcile pass is over
          const resp = await fetch(`${anthropic}/v1/messages`, {
            method: 'POST', signal,
            headers: { 'x-api-key': need('ANTHROPIC_API_KEY'), 'anthropic-version': '2023-06-01',
                       'content-type': 'application/json' },
            body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 64,
                                   messages: [{ role: 'user', content: 'a haiku' }] }),
          });
          const body = /** @type {any} */ (await resp.json());
          if (!resp.ok) {
            return { status: /** @type {const} */ ('failed'),
                     error: String(body.error?.message), code: String(resp.status) };
          }
          const text = body.content.map((/** @type {any} */ b) => b.text ?? '').join('');
          return { status: /** @type {const} */ ('succeeded'), text,
                   result: { text, stop_reason: body.stop_reason,
                             usage: { input_tokens: body.usage.input_tokens,
                                      output_tokens: body.usage.output_tokens } } };
        },
      });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jobId, text: run.answer?.text, outcome: run.outcome }));
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
    const port = /** @type {import('node:net').AddressInfo} */ (server.address()).port;
    try {
      const answer = fetch(`http://127.0.0.1:${port}/ai-writer`, { method: 'POST' });
      // A route that died mid-call: the same kind, started, never beating.
      const dead = await cw.createJob({ userId: 'user-sync', credits: 3, jobType: 'text' });
      await cw.startCall({ jobId: dead, kind: 'anthropic-sync', actor: 'route:gone:1',
                           sync: true });
      const [live] = await until('the route call beating', async () => {
        if (routeJobs.length !== 1) return null;
        return (await jobRow(db, routeJobs[0])).heartbeat_at ? routeJobs : null;
      });
      await until('both calls older than the 2 s threshold', async () => {
        const { rows } = await db.query(
          `SELECT bool_and(now() - provider_call_started_at > interval '2.5 seconds') AS old
           FROM jobs WHERE id = ANY($1::uuid[])`, [[live, dead]]);
        return rows[0].old === true;
      }, { timeoutMs: 10_000 });
      const pass = await callwarden(['reconcile', '--once', '--json'], {
        ...reconcileEnv(), CALLWARDEN_RECONCILE_THRESHOLD_ANTHROPIC_SYNC: '2',
        CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S: '5' });
      assert.equal(pass.code, 0, pass.stderr);
      const counts = JSON.parse(pass.stdout);
      const liveRow = await jobRow(db, live);
      assert.equal(liveRow.call_state, 'created', 'the beating call is still open');
      assert.equal((await usage(db, live))[0].status, 'reserved');
      assert.equal((await jobRow(db, dead)).call_state, 'swept', 'the silent one is swept');
      assert.equal((await usage(db, dead))[0].status, 'refunded');
      const openForMs = Date.now() - new Date(
        (await db.query('SELECT provider_call_started_at AS at FROM jobs WHERE id = $1',
                        [live])).rows[0].at).getTime();
      open();
      const body = /** @type {any} */ (await (await answer).json());
      assert.match(body.text, /Simulated reply|haiku/);
      assert.deepEqual(body.outcome, { ok: true, state: 'completed', settlement: 'settled' });
      const rows = new Map((await ledger(db, [live, dead])).map((r) => [r.job, r]));
      assert.deepEqual([live, dead].map((j) => [rows.get(j)?.call_state,
                                                rows.get(j)?.settlement, rows.get(j)?.settled]),
                       [['completed', 'committed', 1], ['swept', 'refunded', 1]]);
      t.diagnostic(`(c) sync call open ${openForMs} ms against a 2 s threshold, beating every `
        + `200 ms: reconcile --once claimed ${counts.claimed}, swept ${counts.swept} (the silent `
        + `call); the beating call completed and committed once; ${Date.now() - began} ms`);
    } finally {
      open();
      server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve(undefined)));
    }
  });

  test('(d) Node succeeded racing callwarden reconcile: one completion, one asset, one '
       + 'settlement', async (t) => {
    const began = Date.now();
    const { queue, jobs } = await enqueue(4, {
      steps: [{ phase: 'running', polls: 1 }], end: 'succeeded' });
    // Beats only at TaskCreated (60 s interval): to the reconciler the worker looks dead
    // once 1 s passed, while it holds each succeeded result, media stored, ready to report.
    const w = worker('racer', queue.name, {
      NODE_WORKER_CONCURRENCY: '4', NODE_WORKER_FAILPOINT: 'hold-success',
      NODE_WORKER_HEARTBEAT_MS: '60000' });
    await w.saw('holding', 4, 30_000);
    await until('every call silent past the 1 s heartbeat timeout', async () => {
      const { rows } = await db.query(
        `SELECT bool_and(now() - heartbeat_at > interval '1.3 seconds') AS silent
         FROM jobs WHERE id = ANY($1::uuid[])`, [jobs]);
      return rows[0].silent === true;
    });
    let passDone = false;
    const pass = callwarden(['reconcile', '--once', '--json'], {
      ...reconcileEnv(), CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S: '1' })
      .finally(() => { passDone = true; });
    await release(jobs[0]);
    await release(jobs[1]);
    await until('the reconciler at work on these calls (its claim, or its events)', async () => {
      if (passDone) return true;
      const { rows } = await db.query(
        `SELECT count(*)::int AS n FROM jobs j
         WHERE j.id = ANY($1::uuid[]) AND (j.reconcile_owner IS NOT NULL OR EXISTS (
             SELECT 1 FROM callwarden.call_events e
             WHERE e.job_id = j.id AND e.actor NOT LIKE 'worker:%'))`, [jobs]);
      return rows[0].n > 0;
    }, { timeoutMs: 30_000, everyMs: 5 });
    await release(jobs[2]);
    await release(jobs[3]);
    const result = await pass;
    assert.equal(result.code, 0, result.stderr);
    const counts = JSON.parse(result.stdout);
    const done = await w.saw('done', 4, 30_000);
    const rows = await assertExactlyOnce(jobs);
    const nodeOk = done.filter((e) => /** @type {any} */ (e.result).outcome?.ok === true).length;
    const byNode = rows.filter((r) => String(r.completed_by).startsWith('worker:')).length;
    assert.equal(byNode, nodeOk, 'Node reported ok exactly for the calls it completed');
    const losers = done.filter((e) => /** @type {any} */ (e.result).outcome?.ok !== true)
      .map((e) => /** @type {any} */ (e.result).outcome?.state);
    t.diagnostic(`(d) jobs 4: completed by the Node worker ${byNode}, by the reconciler `
      + `${rows.length - byNode} (reconcile --once claimed ${counts.claimed}, completed `
      + `${counts.completed}, lost races ${counts.lost_race}); Node's late succeeded answered `
      + `ok=false with state ${JSON.stringify(losers)}; every job: 1 Completed event, 1 asset `
      + `row, 1 settlement, 1 create; ${Date.now() - began} ms`);
    await w.stop();
    await queue.close();
  });
});

describe('the end state', () => {
  test('every KIE job made exactly one create; verify reads a consistent log', async (t) => {
    const creates = await kieCreatesPerJob();
    assert.deepEqual(kieJobs.map((j) => creates.get(j) ?? 0), kieJobs.map(() => 1));
    const { rows } = await db.query(
      `SELECT count(*)::int AS jobs,
              count(*) FILTER (WHERE NOT EXISTS (
                  SELECT 1 FROM usage_logs u WHERE u.job_id = j.id AND u.status = 'reserved'))
                  ::int AS unreserved,
              count(*) FILTER (WHERE (SELECT count(*) FROM usage_logs u
                                      WHERE u.job_id = j.id AND u.status <> 'reserved') = 1)
                  ::int AS settled_once
       FROM jobs j`);
    assert.deepEqual(rows[0], { jobs: rows[0].jobs, unreserved: rows[0].jobs,
                                settled_once: rows[0].jobs });
    const audit = await db.query(
      `SELECT count(*)::int AS moves,
              count(*) FILTER (WHERE old_status <> 'reserved')::int AS from_settled,
              count(*) FILTER (WHERE new_status NOT IN ('committed', 'refunded'))::int AS odd,
              (SELECT count(*)::int FROM (SELECT usage_id FROM usage_audit GROUP BY usage_id
                                          HAVING count(*) > 1) twice) AS moved_twice,
              count(*) FILTER (WHERE charged > 10)::int AS over_reserved
       FROM usage_audit`);
    assert.deepEqual(audit.rows[0], { moves: rows[0].jobs, from_settled: 0, odd: 0,
                                      moved_twice: 0, over_reserved: 0 },
                     'the audit trigger: each reservation moved once, from reserved');
    const report = JSON.parse(await verify());
    assert.equal(report.summary.mismatches, 0);
    t.diagnostic(`end: ${rows[0].jobs} jobs, each with exactly one settled reservation `
      + `(audit trigger: ${audit.rows[0].moves} moves, none twice, none from a settled row); `
      + `${kieJobs.length} KIE jobs, one create each; verify: ${report.summary.events} events, `
      + `0 mismatches`);
  });
});

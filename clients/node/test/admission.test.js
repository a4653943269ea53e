// Admission control from Node (issue 42, host API version 2), against the real functions:
// a provider account's limit set by plain SQL (callwarden.limits), its only slot held by
// a call another actor started, and then:
// - startCall answers `wait`, with the limit (`reason`) and `retryAfterMs` read from
//   callwarden.waiting_for, writing nothing to the job, over both faces (pg; the rpc face
//   on a fake supabase client, exact calls, and the real supabase-js through the stand-in
//   for PostgREST), and `create` once the slot frees;
// - runTask and runSync answer `status: 'waiting'` without calling the host's code;
// - the BullMQ glue (src/bullmq.js): a real BullMQ worker over Redis moves a waiting job to
//   the delayed set (not failed, no attempt counted, with `attempts: 1`) for as long as
//   the account is full, then runs it once the slot frees: one create, completed;
// - slowDown (a host's own create refused with 429: callwarden.slow_down) pauses the
//   account for the fleet and halves its caps: the next startCall answers `wait` naming
//   the 429's pause; a kind no limit names answers null.
// Waits are on conditions (bounded), never on time alone.
//
// Env (tests/integration/test_admission_queues.py sets it): DATABASE_URL (a migrated
// database), REDIS_URL.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import { createClient } from '@supabase/supabase-js';
import { DelayedError, Queue, Worker } from 'bullmq';

import { delayIfWaiting, delayWhenWaiting } from '../src/bullmq.js';
import { Callwarden, FUNCTIONS, HOST_API_VERSION, InvalidArgument } from '../src/index.js';
import { need, pool } from './support/env.js';
import { miniPostgrest } from './support/postgrest.js';
import { events, jobRow, usage } from './support/rows.js';
import { until } from './support/wait.js';

// Kinds no other Node test starts: this file's accounts count only its own calls.
const KIND = 'replicate-prediction';
const SYNC_KIND = 'elevenlabs-sync';
const ACCOUNT = 'node-admission-replicate';
const SYNC_ACCOUNT = 'node-admission-elevenlabs';
const SLOW_KIND = 'replicate-training'; // slowDown's account: its pause stops no other test
const SLOW_ACCOUNT = 'node-admission-replicate-training';
const WAIT_S = 0.3; // the limits' wait: a refused start is tried again 300 to 375 ms later
const WAIT_MS = WAIT_S * 1000;
const REFUSED = `${ACCOUNT}: 1 of 1 calls in flight`;
const ACTOR = 'worker:admission:1';

const db = pool(4);
const cw = new Callwarden(db);
/** Every job holding a slot here (freed at the end even when a test failed midway). */
const holders = /** @type {string[]} */ ([]);

before(async () => {
  await db.query('DELETE FROM callwarden.limits WHERE account = ANY($1)',
                 [[ACCOUNT, SYNC_ACCOUNT, SLOW_ACCOUNT]]);
  await db.query(`INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s)
                  VALUES ($1, ARRAY[$2], 1, $5), ($3, ARRAY[$4], 1, $5)`,
                 [ACCOUNT, KIND, SYNC_ACCOUNT, SYNC_KIND, WAIT_S]);
});
after(async () => {
  await Promise.all(holders.map((jobId) => cw.cancel({ jobId, by: 'admin' })));
  await db.query('DELETE FROM callwarden.limits WHERE account = ANY($1)',
                 [[ACCOUNT, SYNC_ACCOUNT, SLOW_ACCOUNT]]);
  await db.end();
});

/** A job with 10 credits reserved. */
function job() {
  return cw.createJob({ userId: 'user-admission', credits: 10, input: { prompt: 'a fox' } });
}

/**
 * A call of `kind` another actor started: it holds the account's only slot.
 * @param {string} kind
 */
async function holdTheSlot(kind = KIND) {
  const jobId = await cw.createJob({ userId: 'user-holder', credits: 5 });
  holders.push(jobId);
  const start = await cw.startCall({ jobId, kind, actor: 'node:holder', sync: kind === SYNC_KIND });
  assert.equal(start.action, 'create');
  return jobId;
}

/** End the holder's call (a cancel, refunded): its slot frees. @param {string} jobId */
async function freeTheSlot(jobId) {
  assert.equal((await cw.cancel({ jobId, by: 'admin' })).ok, true);
}

/**
 * Nothing was written to the job: no event, no call, its credits still reserved.
 * @param {string} jobId
 */
async function untouched(jobId) {
  assert.deepEqual(await events(db, jobId), []);
  assert.equal((await jobRow(db, jobId)).call_state, null);
  assert.deepEqual((await usage(db, jobId)).map((u) => u.status), ['reserved']);
}

/**
 * `start` is a `wait` naming `reason`, due within the limit's wait.
 * @param {import('../src/contract.js').StartCall | import('../src/run.js').RunResult} start
 * @param {string} reason
 */
function assertWaits(start, reason = REFUSED) {
  assert.equal(start.action, 'wait');
  assert.equal(start.reason, reason);
  assert.ok(typeof start.retryAfterMs === 'number' && start.retryAfterMs > 0
            && start.retryAfterMs <= WAIT_MS, `retryAfterMs ${start.retryAfterMs}`);
}

describe('startCall over a full account', () => {
  test('the client speaks version 2, and waiting_for is in the contract table', async () => {
    assert.equal(HOST_API_VERSION, 2);
    assert.equal(await cw.checkVersion(), 2);
    assert.deepEqual(FUNCTIONS.waitingFor,
                     { sql: 'waiting_for', returns: 'optional_row',
                       params: [['jobId', 'job_id', 'uuid', 'required']] });
  });

  test('answers wait with the limit and retryAfterMs, writes nothing; create once the slot frees', async () => {
    const holder = await holdTheSlot();
    const jobId = await job();
    const start = await cw.startCall({ jobId, kind: KIND, actor: ACTOR });
    assert.deepEqual({ ...start, retryAfterMs: 0 },
                     { action: 'wait', taskId: null, state: null, version: 0, reason: REFUSED,
                       retryAfterMs: 0 });
    assertWaits(start);
    await untouched(jobId);
    const why = await cw.waitingFor({ jobId });
    assert.equal(why?.reason, REFUSED);

    await freeTheSlot(holder);
    assert.deepEqual(await cw.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'create', taskId: null, state: 'created', version: 1 });
    assert.equal(await cw.waitingFor({ jobId }), null);
    await cw.cancel({ jobId, by: 'admin' }); // its own slot, freed for the next test
  });

  test('the rpc face: start_call then waiting_for, by name, from the table', async () => {
    /** @type {Array<{fn: string, args: Record<string, unknown> | undefined}>} */
    const calls = [];
    /** @type {unknown[]} */
    const waitingAnswers = [[{ reason: 'acct: 3 creates in 10 s', retry_after_s: 1.25 }], []];
    const fake = {
      /** @param {string} schema */
      schema: (schema) => ({
        /**
         * @param {string} fn
         * @param {Record<string, unknown>} [args]
         */
        rpc: async (fn, args) => {
          assert.equal(schema, 'callwarden');
          calls.push({ fn, args });
          if (fn === 'start_call') {
            return { data: [{ action: 'wait', task_id: null, state: null, version: 0 }],
                     error: null };
          }
          return { data: waitingAnswers.shift(), error: null };
        },
      }),
    };
    const jobId = randomUUID();
    const viaFake = Callwarden.rpc(fake);
    assert.deepEqual(await viaFake.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'wait', taskId: null, state: null, version: 0,
                       reason: 'acct: 3 creates in 10 s', retryAfterMs: 1250 });
    // the job admitted meanwhile (no waiting row): no reason, try again now
    assert.deepEqual(await viaFake.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'wait', taskId: null, state: null, version: 0, reason: null,
                       retryAfterMs: 0 });
    assert.deepEqual(calls, [
      { fn: 'start_call', args: { job_id: jobId, kind: KIND, actor: ACTOR } },
      { fn: 'waiting_for', args: { job_id: jobId } },
      { fn: 'start_call', args: { job_id: jobId, kind: KIND, actor: ACTOR } },
      { fn: 'waiting_for', args: { job_id: jobId } },
    ]);

    const server = await miniPostgrest(db);
    try {
      const supabase = createClient(server.url, 'service-role-key', {
        auth: { persistSession: false, autoRefreshToken: false },
        realtime: { transport: /** @type {any} */ (class {}) },
      });
      const viaRpc = Callwarden.rpc(supabase);
      const holder = await holdTheSlot();
      const waiting = await job();
      assertWaits(await viaRpc.startCall({ jobId: waiting, kind: KIND, actor: ACTOR }));
      await untouched(waiting);
      await freeTheSlot(holder);
      // the waiting row stays until a start admits the job (a slot's turn is not known)
      assert.equal((await viaRpc.waitingFor({ jobId: waiting }))?.reason, REFUSED);
      assert.equal((await viaRpc.startCall({ jobId: waiting, kind: KIND, actor: ACTOR })).action,
                   'create');
      assert.equal(await viaRpc.waitingFor({ jobId: waiting }), null);
      await cw.cancel({ jobId: waiting, by: 'admin' });
    } finally {
      await server.close();
    }
  });
});

describe('runTask and runSync over a full account', () => {
  test('answer waiting with the limit and retryAfterMs; the host\'s code is not called', async () => {
    const holder = await holdTheSlot();
    const syncHolder = await holdTheSlot(SYNC_KIND);
    const jobId = await job();
    const syncJob = await job();
    let called = 0;
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR,
      create: async () => { called += 1; return 'never'; },
      poll: async () => { called += 1; return { status: 'running' }; },
    });
    assert.deepEqual({ ...run, retryAfterMs: 0 },
                     { action: 'wait', taskId: null, status: 'waiting', upstream: null,
                       outcome: null, reason: REFUSED, retryAfterMs: 0 });
    assertWaits(run);
    const sync = await cw.runSync({
      jobId: syncJob, kind: SYNC_KIND, actor: ACTOR,
      call: async () => { called += 1; return { status: 'succeeded', text: 'never' }; },
    });
    assert.deepEqual({ ...sync, retryAfterMs: 0 },
                     { action: 'wait', status: 'waiting', upstream: null, outcome: null,
                       answer: null, reason: `${SYNC_ACCOUNT}: 1 of 1 calls in flight`,
                       retryAfterMs: 0 });
    assert.ok((sync.retryAfterMs ?? 0) > 0 && (sync.retryAfterMs ?? 0) <= WAIT_MS);
    assert.equal(called, 0);
    await untouched(jobId);
    await untouched(syncJob);
    await freeTheSlot(holder);
    await freeTheSlot(syncHolder);
    await cw.cancel({ jobId, by: 'admin' });
    await cw.cancel({ jobId: syncJob, by: 'admin' });
  });
});

describe('the BullMQ glue', () => {
  test('delayIfWaiting: moveToDelayed(now + retryAfterMs + up to 25 %, token), then DelayedError', async () => {
    /** @type {Array<[number, string | undefined]>} */
    const moved = [];
    const fakeJob = { moveToDelayed: async (/** @type {number} */ at,
                                          /** @type {string | undefined} */ token) => {
      moved.push([at, token]);
    } };
    const recorded = { status: 'recorded', retryAfterMs: 5 };
    assert.equal(await delayIfWaiting(fakeJob, 'tok', recorded), recorded);
    assert.equal(moved.length, 0);
    const t0 = Date.now();
    await assert.rejects(delayIfWaiting(fakeJob, 'tok', { status: 'waiting', retryAfterMs: 400,
                                                         reason: REFUSED }),
                         (err) => err instanceof DelayedError && err.message.includes(REFUSED));
    const [[at, token]] = moved;
    assert.equal(token, 'tok');
    assert.ok(at >= t0 + 400 && at <= Date.now() + 500, `moved to ${at - t0} ms`);
  });

  test('a real worker delays a waiting job (not failed, no attempt) until the slot frees, then runs it once', async (t) => {
    const redis = new URL(need('REDIS_URL'));
    const connection = { host: redis.hostname, port: Number(redis.port || 6379),
                         db: Number(redis.pathname.slice(1) || 0), maxRetriesPerRequest: null };
    const holder = await holdTheSlot();
    const jobId = await job();
    const queue = new Queue(`cw-admission-${randomUUID().slice(0, 8)}`, { connection });
    let creates = 0;
    /** @type {string[]} */
    const runs = [];
    const worker = new Worker(queue.name, delayWhenWaiting(async (bull) => {
      const result = await cw.runTask({
        jobId: bull.data.jobId, kind: KIND, actor: ACTOR, pollEveryMs: 20,
        create: async () => { creates += 1; return `prediction-${bull.data.jobId}`; },
        poll: async () => ({ status: 'succeeded', text: 'a fox', result: { text: 'a fox' } }),
      });
      runs.push(result.status);
      return result;
    }), { connection, concurrency: 1 });
    /** @type {string[]} */
    const failed = [];
    worker.on('failed', (_job, err) => failed.push(err.message));
    try {
      // attempts: 1: a waiting run counted as a failed attempt would fail the job for good
      await queue.add('generate', { jobId }, { jobId, attempts: 1, removeOnComplete: false,
                                               removeOnFail: false });
      await until('three runs refused by the limit',
                  () => runs.filter((s) => s === 'waiting').length >= 3);
      const waiting = await queue.getJob(jobId);
      assert.ok(waiting);
      assert.equal(waiting.attemptsMade, 0);
      assert.ok(waiting.delay >= 1 && waiting.delay <= WAIT_MS * 1.25 + 1,
                `delayed ${waiting.delay} ms`);
      assert.notEqual(await waiting.getState(), 'failed');
      assert.equal(creates, 0);
      await untouched(jobId);

      await freeTheSlot(holder);
      const done = await until('the job completed', async () => {
        const bull = await queue.getJob(jobId);
        return (await bull?.getState()) === 'completed' ? bull : null;
      });
      assert.equal(done.returnvalue.status, 'recorded');
      assert.equal(done.attemptsMade, 1);
      assert.deepEqual(runs.slice(-1), ['recorded']);
      assert.ok(runs.slice(0, -1).every((s) => s === 'waiting'));
      assert.equal(creates, 1);
      assert.deepEqual(failed, []);
      assert.equal((await jobRow(db, jobId)).call_state, 'completed');
      assert.deepEqual((await usage(db, jobId)).map((u) => u.status), ['committed']);
      t.diagnostic(`BullMQ job delayed ${runs.length - 1} times (attemptsMade 0, attempts: 1), `
                   + `then completed: ${done.attemptsMade} attempt, ${creates} create`);
    } finally {
      await worker.close();
      await queue.obliterate({ force: true });
      await queue.close();
    }
  });
});

describe('slowDown: a host\'s own create refused with 429', () => {
  test('is in the contract table: slow_down(kind, retry_after_s), one row or none', () => {
    assert.deepEqual(FUNCTIONS.slowDown,
                     { sql: 'slow_down', returns: 'optional_row',
                       params: [['kind', 'kind', 'text', 'required'],
                                ['retryAfterS', 'retry_after_s', 'double', 'nullable']] });
  });

  test('pauses the account for the fleet at half its caps: the next start waits for the 429', async () => {
    await db.query(`INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s)
                    VALUES ($1, ARRAY[$2], 4, $3)`, [SLOW_ACCOUNT, SLOW_KIND, WAIT_S]);
    const jobId = await job();
    try {
      const slowed = await cw.slowDown({ kind: SLOW_KIND, retryAfterS: 30 });
      assert.ok(slowed);
      assert.deepEqual({ ...slowed, pausedS: 0 },
                       { account: SLOW_ACCOUNT, pausedS: 0, rateFactor: 0.5 });
      assert.ok(slowed.pausedS > 25 && slowed.pausedS <= 30, `pausedS ${slowed.pausedS}`);
      // another worker's 429 within the pause (no Retry-After: the account's wait_s): one
      // decrease per pause, and the pause is never shortened
      const again = await cw.slowDown({ kind: SLOW_KIND });
      assert.equal(again?.rateFactor, 0.5);
      assert.ok((again?.pausedS ?? 0) > 25, `pausedS ${again?.pausedS}`);
      const row = (await db.query(
        'SELECT rate_factor, paused_until > now() AS paused FROM callwarden.limits WHERE account = $1',
        [SLOW_ACCOUNT])).rows[0];
      assert.deepEqual(row, { rate_factor: 0.5, paused: true });

      // every start of the account waits now, whoever makes it: nothing written
      const start = await cw.startCall({ jobId, kind: SLOW_KIND, actor: ACTOR });
      assert.equal(start.action, 'wait');
      assert.equal(start.reason, `${SLOW_ACCOUNT}: the provider refused a create (429): paused`);
      assert.ok((start.retryAfterMs ?? 0) > 25_000 && (start.retryAfterMs ?? 0) <= 30_000,
                `retryAfterMs ${start.retryAfterMs}`);
      await untouched(jobId);
    } finally {
      await cw.cancel({ jobId, by: 'admin' });
      await db.query('DELETE FROM callwarden.limits WHERE account = $1', [SLOW_ACCOUNT]);
    }
    // no limit names the kind: nothing to pause, nothing to wait for (fail the call)
    assert.equal(await cw.slowDown({ kind: SLOW_KIND, retryAfterS: 30 }), null);
  });

  test('the rpc face sends kind and retry_after_s by name; a bad retryAfterS is refused', async () => {
    /** @type {Array<{fn: string, args: Record<string, unknown> | undefined}>} */
    const calls = [];
    /** @type {unknown[]} */
    const answers = [[{ account: 'acct', paused_s: 2.5, rate_factor: 0.25 }], []];
    const fake = {
      /** @param {string} _schema */
      schema: (_schema) => ({
        /**
         * @param {string} fn
         * @param {Record<string, unknown>} [args]
         */
        rpc: async (fn, args) => {
          calls.push({ fn, args });
          return { data: answers.shift(), error: null };
        },
      }),
    };
    const viaFake = Callwarden.rpc(fake);
    assert.deepEqual(await viaFake.slowDown({ kind: KIND, retryAfterS: 2.5 }),
                     { account: 'acct', pausedS: 2.5, rateFactor: 0.25 });
    assert.equal(await viaFake.slowDown({ kind: 'unlimited' }), null);
    assert.deepEqual(calls, [
      { fn: 'slow_down', args: { kind: KIND, retry_after_s: 2.5 } },
      { fn: 'slow_down', args: { kind: 'unlimited', retry_after_s: null } },
    ]);
    await assert.rejects(cw.slowDown({ kind: KIND, retryAfterS: Number.NaN }),
                         (err) => err instanceof InvalidArgument
                           && /retryAfterS must be a finite number/.test(err.message));
  });
});

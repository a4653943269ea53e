// Every call of the client against a real, migrated Postgres (DATABASE_URL): the answers,
// the rows they leave, and every typed error; then runTask and runSync with in-process
// provider functions (the database is real, the provider is a closure).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import pg from 'pg';

import {
  Beater, Callwarden, CreateRefused, DatabaseUnavailable, FUNCTIONS, InvalidArgument, JobExists,
  JobNotFound, KindMismatch, TaskAlreadyClaimed, TaskIdConflict, actorId,
} from '../src/index.js';
import { need, pool, verify } from './support/env.js';
import { assets, events, jobRow, usage } from './support/rows.js';
import { until } from './support/wait.js';

const KIND = 'kie-standard';
const ACTOR = 'worker:test-host:4242';

/** @type {pg.Pool} */
let db;
/** @type {Callwarden} */
let cw;

before(() => {
  db = pool();
  cw = new Callwarden(db);
});
after(async () => {
  await db.end();
});

/** A job with 10 credits reserved. */
async function job(credits = 10) {
  return cw.createJob({ userId: 'user-1', credits, input: { prompt: 'a cat' } });
}

/** A job whose call is polling task `task`. */
async function polling(task = `task-${randomUUID()}`) {
  const jobId = await job();
  await cw.startCall({ jobId, kind: KIND, actor: ACTOR });
  await cw.taskCreated({ jobId, taskId: task, actor: ACTOR });
  return { jobId, task };
}

describe('the contract', () => {
  test('the database speaks host API version 2', async () => {
    assert.equal(await cw.hostApiVersion(), 2);
    assert.equal(await cw.checkVersion(), 2);
  });

  test('every function of the table exists with these parameter names and defaults', async () => {
    // The rpc face sends exactly these names (PostgREST binds by name): proven here on
    // the real signatures, so a renamed parameter fails this test, not a host in production.
    for (const [method, spec] of Object.entries(FUNCTIONS)) {
      const { rows } = await db.query(
        `SELECT p.proargnames AS names, p.pronargs AS n, p.pronargdefaults AS defaults
         FROM pg_proc p WHERE p.pronamespace = 'callwarden'::regnamespace AND p.proname = $1`,
        [spec.sql]);
      assert.equal(rows.length, 1, `${method}: one callwarden.${spec.sql}`);
      const [{ names, n, defaults }] = rows;
      assert.deepEqual(names.slice(0, n), spec.params.map((p) => p[1]), method);
      const required = spec.params.filter((p) => p[3] !== 'optional').length;
      assert.equal(n - defaults, required, `${method}: required parameters`);
    }
  });
});

describe('createJob', () => {
  test('a pending job and its reservation, in one statement', async () => {
    const jobId = await cw.createJob({
      userId: 'user-1', credits: 12.5, input: { prompt: 'a dog', n: [1, 2] }, jobType: 'video',
    });
    assert.match(jobId, /^[0-9a-f-]{36}$/);
    const row = await jobRow(db, jobId);
    assert.equal(row.status, 'pending');
    assert.equal(row.job_type, 'video');
    assert.deepEqual(row.input_data, { prompt: 'a dog', n: [1, 2] });
    assert.equal(row.call_state, null);
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'reserved', reserved: 12.5, charged: null, settled: false }]);
  });

  test('a given id, the default job type, no reservation without credits', async () => {
    const jobId = randomUUID();
    assert.equal(await cw.createJob({ userId: 'user-1', credits: null, jobId }), jobId);
    assert.equal((await jobRow(db, jobId)).job_type, 'image');
    assert.deepEqual(await usage(db, jobId), []);
    await assert.rejects(cw.createJob({ userId: 'user-1', credits: 1, jobId }), JobExists);
  });
});

describe('startCall', () => {
  test('create once; then ambiguous until a task id; recreate answers create', async () => {
    const jobId = await job();
    assert.deepEqual(await cw.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'create', taskId: null, state: 'created', version: 1 });
    const row = await jobRow(db, jobId);
    assert.equal(row.provider_kind, KIND);
    assert.equal(row.call_state, 'created');
    assert.deepEqual(await cw.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'ambiguous', taskId: null, state: 'created', version: 1 });
    assert.equal((await cw.startCall({ jobId, kind: KIND, actor: ACTOR, recreate: true }))
      .action, 'create');
    assert.deepEqual(await events(db, jobId), ['CallStarted']);
  });

  test('resume with the task id once it is recorded; done once the call ended', async () => {
    const { jobId, task } = await polling();
    assert.deepEqual(await cw.startCall({ jobId, kind: KIND, actor: ACTOR }),
                     { action: 'resume', taskId: task, state: 'polling', version: 2 });
    await cw.failed({ jobId, actor: ACTOR, error: 'boom' });
    assert.equal((await cw.startCall({ jobId, kind: KIND, actor: ACTOR })).action, 'done');
  });

  test('a sync call answers create only the first time', async () => {
    const jobId = await job();
    const first = await cw.startCall({ jobId, kind: 'anthropic-sync', actor: ACTOR, sync: true });
    assert.equal(first.action, 'create');
    assert.equal((await jobRow(db, jobId)).call_sync, true);
    const again = await cw.startCall({ jobId, kind: 'anthropic-sync', actor: ACTOR, sync: true });
    assert.equal(again.action, 'already_started');
  });

  test('not_started when the host ended the job or put a task on the row itself', async () => {
    const ended = await job();
    await db.query("UPDATE jobs SET status = 'cancelled' WHERE id = $1", [ended]);
    assert.equal((await cw.startCall({ jobId: ended, kind: KIND, actor: ACTOR })).action,
                 'not_started');
    const adopted = await job();
    const legacy = `legacy-${adopted}`;
    await db.query('UPDATE jobs SET provider_kind = $2, provider_task_id = $3, '
                   + 'provider_call_started_at = now() WHERE id = $1', [adopted, KIND, legacy]);
    assert.deepEqual(await cw.startCall({ jobId: adopted, kind: KIND, actor: ACTOR }),
                     { action: 'not_started', taskId: legacy, state: null, version: 0 });
    assert.deepEqual(await events(db, adopted), []);
  });

  test('another kind on a started call is KindMismatch', async () => {
    const { jobId } = await polling();
    await assert.rejects(cw.startCall({ jobId, kind: 'kie-veo', actor: ACTOR }), KindMismatch);
  });
});

describe('taskCreated', () => {
  test('records the task id and the first heartbeat; the same id twice is ok=false', async () => {
    const jobId = await job();
    await cw.startCall({ jobId, kind: KIND, actor: ACTOR });
    assert.deepEqual(await cw.taskCreated({ jobId, taskId: 'tk-1-' + jobId, actor: ACTOR }),
                     { ok: true, state: 'polling', version: 2 });
    const row = await jobRow(db, jobId);
    assert.equal(row.status, 'processing');
    assert.equal(row.provider_task_id, 'tk-1-' + jobId);
    assert.ok(row.heartbeat_at instanceof Date);
    assert.equal(row.heartbeat_owner, ACTOR);
    assert.deepEqual(await cw.taskCreated({ jobId, taskId: 'tk-1-' + jobId, actor: ACTOR }),
                     { ok: false, state: 'polling', version: 2 });
  });

  test('another id than the job holds is TaskIdConflict (CW001)', async () => {
    const { jobId } = await polling();
    const err = await cw.taskCreated({ jobId, taskId: 'another', actor: ACTOR })
      .then(() => null, (e) => e);
    assert.ok(err instanceof TaskIdConflict, String(err));
    assert.equal(err.code, 'CW001');
    assert.equal(err.fn, 'callwarden.task_created');
  });

  test('an id another job holds is TaskAlreadyClaimed (23505)', async () => {
    const { task } = await polling();
    const jobId = await job();
    await cw.startCall({ jobId, kind: KIND, actor: ACTOR });
    await assert.rejects(cw.taskCreated({ jobId, taskId: task, actor: ACTOR }),
                         TaskAlreadyClaimed);
    assert.equal((await jobRow(db, jobId)).call_state, 'created');
  });
});

describe('heartbeat', () => {
  test('stamps the holder and progress while the call is pollable, false after', async () => {
    const { jobId } = await polling();
    assert.equal(await cw.heartbeat({ jobId, owner: 'worker:b:1', progress: 40 }), true);
    let row = await jobRow(db, jobId);
    assert.equal(row.heartbeat_owner, 'worker:b:1');
    assert.equal(row.progress, 40);
    assert.equal(await cw.heartbeat({ jobId, owner: 'worker:b:1' }), true);
    assert.equal((await jobRow(db, jobId)).progress, 40);
    await cw.succeeded({ jobId, actor: ACTOR });
    assert.equal(await cw.heartbeat({ jobId, owner: 'worker:b:1' }), false);
    row = await jobRow(db, jobId);
    assert.equal(row.progress, 100);
    assert.equal(await cw.heartbeat({ jobId: randomUUID(), owner: 'worker:b:1' }), false);
  });
});

describe('outcomes', () => {
  test('succeeded: completed, asset rows and the commit at cost, in one transaction', async () => {
    const { jobId } = await polling();
    const media = [{ key: `img/${jobId}.png`, url: 'https://cdn.example/x.png',
                     content_type: 'image/png', size: 2048 }];
    const done = await cw.succeeded({
      jobId, actor: ACTOR, media, text: 'caption', cost: '7.25',
      result: { media_urls: ['https://kie.example/r.png'], usage: { credits: 18 },
                raw: { state: 'success' } },
    });
    assert.deepEqual(done, { ok: true, state: 'completed', settlement: 'settled' });
    const row = await jobRow(db, jobId);
    assert.equal(row.status, 'completed');
    assert.equal(row.call_settlement, 'committed');
    assert.equal(Number(row.provider_cost), 7.25);
    assert.deepEqual(row.output_data.media, media);
    assert.equal(row.output_data.text, 'caption');
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'committed', reserved: 10, charged: 7.25, settled: true }]);
    assert.deepEqual(await assets(db, jobId), [{ storage_key: `img/${jobId}.png`,
      url: 'https://cdn.example/x.png', content_type: 'image/png', size_bytes: '2048' }]);
    assert.deepEqual(await events(db, jobId), ['CallStarted', 'TaskCreated',
      'UpstreamSucceeded', 'FinalizeClaimed', 'Completed']);
    assert.deepEqual(await cw.succeeded({ jobId, actor: 'worker:late:2', media }),
                     { ok: false, state: 'completed', settlement: 'committed' });
    assert.equal((await assets(db, jobId)).length, 1);
  });

  test('a cost above the reservation commits the reservation', async () => {
    const { jobId } = await polling();
    await cw.succeeded({ jobId, actor: ACTOR, cost: 99 });
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'committed', reserved: 10, charged: 10, settled: true }]);
  });

  test('failed refunds once; a second outcome is ok=false', async () => {
    const { jobId } = await polling();
    assert.deepEqual(await cw.failed({ jobId, actor: ACTOR, error: 'content policy', code: '400' }),
                     { ok: true, state: 'failed', settlement: 'settled' });
    const row = await jobRow(db, jobId);
    assert.equal(row.status, 'failed');
    assert.equal(row.error_message, 'content policy');
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'refunded', reserved: 10, charged: 0, settled: true }]);
    assert.deepEqual(await cw.succeeded({ jobId, actor: ACTOR }),
                     { ok: false, state: 'failed', settlement: 'refunded' });
    assert.deepEqual(await cw.failed({ jobId, actor: ACTOR, error: 'again' }),
                     { ok: false, state: 'failed', settlement: 'refunded' });
  });

  test('notFound sweeps and refunds', async () => {
    const { jobId } = await polling();
    assert.deepEqual(await cw.notFound({ jobId, actor: ACTOR }),
                     { ok: true, state: 'swept', settlement: 'settled' });
    assert.equal((await jobRow(db, jobId)).error_message, 'upstream_task_not_found');
    assert.equal((await usage(db, jobId))[0].status, 'refunded');
  });

  test('cancel: an open call, a job whose call never started, not an ended one', async () => {
    const { jobId } = await polling();
    assert.deepEqual(await cw.cancel({ jobId, by: 'user:1' }),
                     { ok: true, state: 'cancelled', settlement: 'settled' });
    assert.equal((await jobRow(db, jobId)).status, 'cancelled');
    assert.equal((await cw.startCall({ jobId, kind: KIND, actor: ACTOR })).action, 'done');
    const fresh = await job();
    assert.equal((await cw.cancel({ jobId: fresh, by: 'user:1' })).state, 'cancelled');
    assert.equal((await usage(db, fresh))[0].status, 'refunded');
    const { jobId: completed } = await polling();
    await cw.succeeded({ jobId: completed, actor: ACTOR });
    assert.deepEqual(await cw.cancel({ jobId: completed, by: 'user:1' }),
                     { ok: false, state: 'completed', settlement: 'committed' });
  });

  test('the host ending the job first wins: succeeded reports how it stands', async () => {
    const { jobId } = await polling();
    await db.query("UPDATE jobs SET status = 'cancelled' WHERE id = $1", [jobId]);
    const late = await cw.succeeded({ jobId, actor: ACTOR });
    assert.equal(late.ok, false);
    assert.equal(late.state, 'cancelled');
    assert.equal((await usage(db, jobId))[0].status, 'refunded');
    assert.equal((await jobRow(db, jobId)).status, 'cancelled');
    assert.deepEqual((await events(db, jobId)).at(-1), 'HostEnded');
  });
});

describe('errors', () => {
  test('a job that does not exist is JobNotFound (P0002) for every call on a job', async () => {
    const jobId = randomUUID();
    const calls = [
      () => cw.startCall({ jobId, kind: KIND, actor: ACTOR }),
      () => cw.taskCreated({ jobId, taskId: 't', actor: ACTOR }),
      () => cw.succeeded({ jobId, actor: ACTOR }),
      () => cw.failed({ jobId, actor: ACTOR, error: 'x' }),
      () => cw.notFound({ jobId, actor: ACTOR }),
      () => cw.cancel({ jobId, by: ACTOR }),
    ];
    for (const call of calls) {
      const err = await call().then(() => null, (e) => e);
      assert.ok(err instanceof JobNotFound, String(err));
      assert.equal(err.code, 'P0002');
    }
  });

  test('arguments refused before sending and by the function (22023)', async () => {
    await assert.rejects(cw.startCall(/** @type {any} */ ({ jobId: randomUUID(), kind: KIND })),
                         (e) => e instanceof InvalidArgument && /actor is required/.test(e.message));
    await assert.rejects(cw.heartbeat({ jobId: randomUUID(), owner: 'w', progress: 1.5 }),
                         InvalidArgument);
    const { jobId } = await polling();
    await assert.rejects(
      cw.succeeded({ jobId, actor: ACTOR, media: /** @type {any} */ ([{ key: 'k' }]) }),
      (e) => e instanceof InvalidArgument && e.code === '22023');
    await assert.rejects(cw.succeeded({ jobId, actor: ACTOR, cost: -1 }),
                         (e) => e instanceof InvalidArgument && e.code === '22023');
    assert.equal((await jobRow(db, jobId)).call_state, 'polling');
  });

  test('an unreachable database is DatabaseUnavailable, transient', async () => {
    const down = new pg.Pool({ connectionString: 'postgresql://nobody@127.0.0.1:1/none',
                               connectionTimeoutMillis: 2_000 });
    const err = await new Callwarden(down).heartbeat({ jobId: randomUUID(), owner: 'w' })
      .then(() => null, (e) => e);
    await down.end();
    assert.ok(err instanceof DatabaseUnavailable, String(err));
    assert.equal(err.transient, true);
  });

  test('inside the host transaction: a rollback leaves nothing', async () => {
    const client = await db.connect();
    const jobId = randomUUID();
    try {
      await client.query('BEGIN');
      const inTx = new Callwarden(client);
      await inTx.createJob({ userId: 'user-1', credits: 3, jobId });
      assert.equal((await inTx.startCall({ jobId, kind: KIND, actor: ACTOR })).action, 'create');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    const { rows } = await db.query('SELECT count(*)::int AS n FROM jobs WHERE id = $1', [jobId]);
    assert.equal(rows[0].n, 0);
  });
});

describe('runTask', () => {
  /**
   * A provider whose task answers `running` `runningPolls` times, then `last`.
   * @param {{runningPolls?: number, last?: import('../src/run.js').PollResult}} [o]
   */
  function provider({ runningPolls = 2, last = { status: 'succeeded' } } = {}) {
    const seen = { creates: 0, polls: 0 };
    return {
      seen,
      create: async () => {
        seen.creates += 1;
        return `tk-${randomUUID()}`;
      },
      /** @returns {Promise<import('../src/run.js').PollResult>} */
      poll: async () => {
        seen.polls += 1;
        return seen.polls <= runningPolls ? { status: 'running', progress: 30 * seen.polls }
          : last;
      },
    };
  }

  test('creates, records the task id, polls and completes with what the host stored', async () => {
    const jobId = await job();
    const p = provider();
    const media = [{ key: `k/${jobId}`, url: '/m/1', content_type: 'image/png', size: 3 }];
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, create: p.create,
      poll: async (taskId, ctx) => {
        assert.equal(ctx.jobId, jobId);
        const r = await p.poll();
        return r.status === 'succeeded' ? { status: 'succeeded', media, cost: 4 } : r;
      },
      pollEveryMs: 10, heartbeatEveryMs: 5,
    });
    assert.equal(run.action, 'create');
    assert.equal(run.status, 'recorded');
    assert.equal(run.upstream, 'succeeded');
    assert.deepEqual(run.outcome, { ok: true, state: 'completed', settlement: 'settled' });
    assert.equal(p.seen.creates, 1);
    assert.equal(p.seen.polls, 3);
    const row = await jobRow(db, jobId);
    assert.equal(row.provider_task_id, run.taskId);
    assert.equal(row.call_state, 'completed');
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'committed', reserved: 10, charged: 4, settled: true }]);
    assert.equal((await assets(db, jobId)).length, 1);
  });

  test('a redelivery resumes the recorded task and never creates', async () => {
    const { jobId, task } = await polling();
    const p = provider({ runningPolls: 1 });
    const run = await cw.runTask({
      jobId, kind: KIND, actor: actorId('worker'),
      create: async () => { throw new Error('must not create'); },
      poll: async (taskId) => {
        assert.equal(taskId, task);
        return p.poll();
      },
      pollEveryMs: 10,
    });
    assert.equal(run.action, 'resume');
    assert.equal(run.taskId, task);
    assert.equal(run.outcome?.state, 'completed');
  });

  test('a call started earlier with no task id is skipped: no create', async () => {
    const jobId = await job();
    await cw.startCall({ jobId, kind: KIND, actor: ACTOR });
    const p = provider();
    const run = await cw.runTask({ jobId, kind: KIND, actor: ACTOR, create: p.create,
                                   poll: p.poll });
    assert.deepEqual(run, { action: 'ambiguous', taskId: null, status: 'skipped',
                            upstream: null, outcome: null });
    assert.equal(p.seen.creates, 0);
  });

  test('a refused create is a failure and a refund; any other error leaves it ambiguous',
    async () => {
      const refused = await job();
      const run = await cw.runTask({
        jobId: refused, kind: KIND, actor: ACTOR, poll: provider().poll,
        create: async () => { throw new CreateRefused('model is required', { code: '422' }); },
      });
      assert.equal(run.outcome?.state, 'failed');
      assert.equal((await usage(db, refused))[0].status, 'refunded');
      const lost = await job();
      await assert.rejects(cw.runTask({
        jobId: lost, kind: KIND, actor: ACTOR, poll: provider().poll,
        create: async () => { throw new Error('socket hang up'); },
      }), /socket hang up/);
      assert.equal((await jobRow(db, lost)).call_state, 'created');
      assert.equal((await usage(db, lost))[0].status, 'reserved');
    });

  test('upstream failure and a vanished task are recorded and refunded', async () => {
    for (const [last, state] of /** @type {const} */ ([
      [{ status: 'failed', error: 'nsfw', code: '501' }, 'failed'],
      [{ status: 'not_found' }, 'swept']])) {
      const jobId = await job();
      const p = provider({ runningPolls: 0, last });
      const run = await cw.runTask({ jobId, kind: KIND, actor: ACTOR, ...p, pollEveryMs: 5 });
      assert.equal(run.upstream, last.status);
      assert.equal(run.outcome?.state, state);
      assert.equal((await usage(db, jobId))[0].status, 'refunded');
    }
  });

  test('it heartbeats during a slow create, before the task id exists', async () => {
    const jobId = await job();
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, heartbeatEveryMs: 20, pollEveryMs: 5,
      create: async () => {
        await until('a heartbeat during the create', async () =>
          (await jobRow(db, jobId)).heartbeat_at !== null, { timeoutMs: 5_000, everyMs: 10 });
        assert.equal((await jobRow(db, jobId)).call_state, 'created');
        return `tk-${randomUUID()}`;
      },
      poll: async () => ({ status: 'succeeded' }),
    });
    assert.equal(run.outcome?.state, 'completed');
  });

  test('stops when a heartbeat says the call ended (cancelled meanwhile)', async () => {
    const jobId = await job();
    let polls = 0;
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, heartbeatEveryMs: 10, pollEveryMs: 10,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => {
        polls += 1;
        if (polls === 2) await cw.cancel({ jobId, by: 'user:1' });
        return { status: 'running' };
      },
    });
    assert.equal(run.status, 'stopped');
    assert.equal((await jobRow(db, jobId)).call_state, 'cancelled');
    assert.equal((await usage(db, jobId))[0].status, 'refunded');
  });

  test('the caller signal stops polling and leaves the call open to resume', async () => {
    const jobId = await job();
    const controller = new AbortController();
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, pollEveryMs: 10, signal: controller.signal,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => {
        controller.abort();
        return { status: 'running' };
      },
    });
    assert.equal(run.status, 'aborted');
    assert.equal((await jobRow(db, jobId)).call_state, 'polling');
    assert.equal((await cw.startCall({ jobId, kind: KIND, actor: ACTOR })).action, 'resume');
  });

  test('poll errors are retried, then thrown (the call stays open)', async () => {
    const jobId = await job();
    let polls = 0;
    /** @type {string[]} */
    const reported = [];
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, pollEveryMs: 5,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => {
        polls += 1;
        if (polls <= 2) throw new Error(`502 #${polls}`);
        return { status: 'succeeded' };
      },
      onError: (err, where) => reported.push(`${where}: ${/** @type {Error} */ (err).message}`),
    });
    assert.equal(run.outcome?.state, 'completed');
    assert.deepEqual(reported, ['poll: 502 #1', 'poll: 502 #2']);
    const stuck = await job();
    await assert.rejects(cw.runTask({
      jobId: stuck, kind: KIND, actor: ACTOR, pollEveryMs: 1, maxPollErrors: 3,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => { throw new Error('always 502'); },
    }), /always 502/);
    assert.equal((await jobRow(db, stuck)).call_state, 'polling');
  });

  test('a malformed poll answer is a clear TypeError', async () => {
    const jobId = await job();
    await assert.rejects(cw.runTask({
      jobId, kind: KIND, actor: ACTOR,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => /** @type {any} */ ({ status: 'done' }),
    }), /poll\(\) must answer \{status: running \| succeeded \| failed \| not_found\}/);
  });
});

describe('runSync', () => {
  test('starts a sync call, beats while it runs, records what it answered', async () => {
    const jobId = await job();
    const run = await cw.runSync({
      jobId, kind: 'anthropic-sync', actor: ACTOR, heartbeatEveryMs: 10,
      call: async () => {
        await until('a heartbeat during the sync call', async () =>
          (await jobRow(db, jobId)).heartbeat_at !== null, { timeoutMs: 5_000, everyMs: 10 });
        return { status: /** @type {const} */ ('succeeded'), text: 'hello', cost: 2,
                 result: { text: 'hello', usage: { input_tokens: 3, output_tokens: 5 },
                           stop_reason: 'end_turn' } };
      },
    });
    assert.equal(run.status, 'recorded');
    assert.equal(run.answer?.text, 'hello');
    assert.deepEqual(run.outcome, { ok: true, state: 'completed', settlement: 'settled' });
    assert.equal((await jobRow(db, jobId)).output_data.text, 'hello');
    assert.equal((await usage(db, jobId))[0].charged, 2);
    const again = await cw.runSync({ jobId, kind: 'anthropic-sync', actor: ACTOR,
                                     call: async () => ({ status: 'succeeded' }) });
    assert.equal(again.status, 'skipped');
    assert.equal(again.action, 'done');
  });

  test('a call that throws is recorded failed and refunded, and the error rethrown', async () => {
    const jobId = await job();
    await assert.rejects(cw.runSync({
      jobId, kind: 'anthropic-sync', actor: ACTOR,
      call: async () => { throw new Error('overloaded_error'); },
    }), /overloaded_error/);
    const row = await jobRow(db, jobId);
    assert.equal(row.call_state, 'failed');
    assert.match(row.error_message, /overloaded_error/);
    assert.equal((await usage(db, jobId))[0].status, 'refunded');
  });
});

describe('what the review of the host API found', () => {
  test('a lost reply on the outcome: the retry learns it recorded it (ok), once', async () => {
    let drop = true;
    const flaky = new Callwarden({
      query: async (text, values) => {
        const answer = await db.query(text, values);
        if (drop && text.includes('callwarden.succeeded')) {
          drop = false; // committed, then the connection dies before the reply
          throw new Error('Connection terminated unexpectedly');
        }
        return answer;
      },
    });
    const jobId = await job();
    const run = await flaky.runTask({
      jobId, kind: KIND, actor: ACTOR, pollEveryMs: 5,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => ({ status: 'succeeded', media: [], text: 'hi', cost: 4 }),
    });
    assert.equal(drop, false);
    assert.deepEqual(run.outcome, { ok: true, state: 'completed', settlement: 'settled' });
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'committed', reserved: 10, charged: 4, settled: true }]);
    assert.equal((await events(db, jobId)).filter((t) => t === 'Completed').length, 1);
  });

  test('a NUL in what a provider answered is recorded as U+FFFD, not refused', async () => {
    const jobId = await job();
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, pollEveryMs: 5,
      create: async () => `tk-${randomUUID()}`,
      poll: async () => ({ status: 'failed', error: 'bad\u0000byte', code: 'x\u0000' }),
    });
    assert.equal(run.outcome?.ok, true);
    assert.equal((await jobRow(db, jobId)).error_message, 'bad\uFFFDbyte');
    assert.equal((await usage(db, jobId))[0].status, 'refunded');
  });

  test('a heartbeat after the host ended the job in its own SQL stops the run', async () => {
    const jobId = await job();
    let polls = 0;
    const run = await cw.runTask({
      jobId, kind: KIND, actor: ACTOR, heartbeatEveryMs: 10, pollEveryMs: 10,
      signal: AbortSignal.timeout(10_000), // a heartbeat that never says stop: 'aborted'
      create: async () => `tk-${randomUUID()}`,
      poll: async () => {
        polls += 1;
        if (polls === 2) {
          await db.query(`UPDATE jobs SET status = 'cancelled' WHERE id = $1
                          AND status IN ('pending', 'processing')`, [jobId]);
        }
        return { status: 'running' };
      },
    });
    assert.equal(run.status, 'stopped');
    assert.equal((await jobRow(db, jobId)).status, 'cancelled');
  });
});

describe('the Beater', () => {
  test('a host callback that throws neither stops the beats nor rejects unseen', async () => {
    /** @type {unknown[]} */
    const unseen = [];
    const onUnhandled = (/** @type {unknown} */ err) => { unseen.push(err); };
    process.on('unhandledRejection', onUnhandled);
    let beats = 0;
    const beater = new Beater({
      cw: { heartbeat: async () => { beats += 1; throw new Error('database down'); } },
      jobId: randomUUID(), owner: ACTOR, everyMs: 5,
      onError: () => { throw new Error('the host callback broke'); },
    }).start();
    await until('three beats', () => beats >= 3, { timeoutMs: 5_000, everyMs: 5 });
    await beater.stop();
    await new Promise((resolve) => setImmediate(resolve));
    process.off('unhandledRejection', onUnhandled);
    assert.deepEqual(unseen, []);
  });
});

describe('the log', () => {
  test('callwarden verify: every projection equals the fold of its events', async () => {
    need('DATABASE_URL');
    const report = JSON.parse(await verify());
    assert.equal(report.ok, true);
    assert.equal(report.summary.mismatches, 0);
    assert.ok(report.summary.jobs > 20, JSON.stringify(report.summary));
  });
});

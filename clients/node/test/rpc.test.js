// The rpc face: the same methods through supabase-js' `schema('callwarden').rpc()`.
// First against a tiny fake object (exact argument mapping, answers, errors), then the real
// supabase-js client through a stand-in for PostgREST's RPC endpoint over the real
// database (test/support/postgrest.js): the names it sends bind to the real functions.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import { createClient } from '@supabase/supabase-js';

import {
  Callwarden, InvalidArgument, JobNotFound, PermissionDenied, TaskAlreadyClaimed,
  TaskIdConflict,
} from '../src/index.js';
import { pool } from './support/env.js';
import { miniPostgrest } from './support/postgrest.js';
import { assets, jobRow, usage } from './support/rows.js';

/**
 * A fake supabase-js client: records every rpc, answers from `answers` by function name.
 * @param {Record<string, {data?: unknown, error?: {code?: string, message: string}}>} answers
 */
function fakeSupabase(answers) {
  /** @type {Array<{schema: string, fn: string, args: Record<string, unknown> | undefined}>} */
  const calls = [];
  return {
    calls,
    /** @param {string} schema */
    schema(schema) {
      return {
        /**
         * @param {string} fn
         * @param {Record<string, unknown>} [args]
         */
        rpc: async (fn, args) => {
          calls.push({ schema, fn, args });
          const answer = answers[fn] ?? { data: null };
          return { data: answer.data ?? null, error: answer.error ?? null };
        },
      };
    },
  };
}

const JOB = '7b6f2f4e-64c4-4a49-9f3a-0f7c7c1d2e11';

describe('rpc face, argument mapping (a fake supabase client)', () => {
  test('every method calls its function by name with SQL parameter names', async () => {
    const outcome = [{ ok: true, state: 'completed', settlement: 'settled' }];
    const sb = fakeSupabase({
      create_job: { data: JOB },
      start_call: { data: [{ action: 'resume', task_id: 'tk', state: 'polling', version: 2 }] },
      task_created: { data: [{ ok: true, state: 'polling', version: 2 }] },
      heartbeat: { data: true },
      succeeded: { data: outcome }, failed: { data: outcome }, not_found: { data: outcome },
      cancel: { data: outcome },
      host_api_version: { data: 1 },
    });
    const cw = Callwarden.rpc(sb);
    assert.equal(cw.face, 'rpc');
    const media = [{ key: 'k', url: 'u', content_type: 'image/png', size: 1 }];
    assert.equal(await cw.createJob({ userId: 'u1', credits: 5, input: { p: 1 }, jobType: 'video',
                                      jobId: JOB }), JOB);
    assert.equal(await cw.createJob({ userId: 'u1', credits: null }), JOB);
    assert.deepEqual(await cw.startCall({ jobId: JOB, kind: 'kie-standard', actor: 'w:h:1' }),
                     { action: 'resume', taskId: 'tk', state: 'polling', version: 2 });
    await cw.startCall({ jobId: JOB, kind: 'anthropic-sync', actor: 'w:h:1', sync: true,
                         recreate: false });
    assert.deepEqual(await cw.taskCreated({ jobId: JOB, taskId: 'tk', actor: 'w:h:1' }),
                     { ok: true, state: 'polling', version: 2 });
    assert.equal(await cw.heartbeat({ jobId: JOB, owner: 'w:h:1', progress: 50 }), true);
    assert.equal(await cw.heartbeat({ jobId: JOB, owner: 'w:h:1' }), true);
    assert.deepEqual(await cw.succeeded({ jobId: JOB, actor: 'w:h:1', media, text: 't',
                                          cost: '1.5', result: { text: 't' } }), outcome[0]);
    await cw.succeeded({ jobId: JOB, actor: 'w:h:1' });
    await cw.failed({ jobId: JOB, actor: 'w:h:1', error: 'e', code: '501' });
    await cw.failed({ jobId: JOB, actor: 'w:h:1', error: 'e' });
    await cw.notFound({ jobId: JOB, actor: 'w:h:1' });
    await cw.cancel({ jobId: JOB, by: 'user:1' });
    assert.equal(await cw.hostApiVersion(), 1);
    assert.deepEqual(sb.calls, [
      { schema: 'callwarden', fn: 'create_job',
        args: { user_id: 'u1', credits: 5, input: { p: 1 }, job_type: 'video', job_id: JOB } },
      { schema: 'callwarden', fn: 'create_job', args: { user_id: 'u1', credits: null } },
      { schema: 'callwarden', fn: 'start_call',
        args: { job_id: JOB, kind: 'kie-standard', actor: 'w:h:1' } },
      { schema: 'callwarden', fn: 'start_call',
        args: { job_id: JOB, kind: 'anthropic-sync', actor: 'w:h:1', sync: true,
                recreate: false } },
      { schema: 'callwarden', fn: 'task_created',
        args: { job_id: JOB, task_id: 'tk', actor: 'w:h:1' } },
      { schema: 'callwarden', fn: 'heartbeat', args: { job_id: JOB, owner: 'w:h:1', progress: 50 } },
      { schema: 'callwarden', fn: 'heartbeat', args: { job_id: JOB, owner: 'w:h:1' } },
      { schema: 'callwarden', fn: 'succeeded',
        args: { job_id: JOB, actor: 'w:h:1', media, text: 't', cost: '1.5',
                result: { text: 't' } } },
      { schema: 'callwarden', fn: 'succeeded', args: { job_id: JOB, actor: 'w:h:1' } },
      { schema: 'callwarden', fn: 'failed',
        args: { job_id: JOB, actor: 'w:h:1', error: 'e', code: '501' } },
      { schema: 'callwarden', fn: 'failed', args: { job_id: JOB, actor: 'w:h:1', error: 'e' } },
      { schema: 'callwarden', fn: 'not_found', args: { job_id: JOB, actor: 'w:h:1' } },
      { schema: 'callwarden', fn: 'cancel', args: { job_id: JOB, by: 'user:1' } },
      { schema: 'callwarden', fn: 'host_api_version', args: {} },
    ]);
  });

  test('PostgREST errors become the same typed errors as the pg face', async () => {
    const sb = fakeSupabase({
      task_created: { error: { code: 'CW001', message: 'job x holds task a, not b' } },
      start_call: { error: { code: 'P0002', message: 'no job x' } },
      cancel: { error: { code: '42501', message: 'permission denied for function cancel' } },
      heartbeat: { error: { code: '', message: 'TypeError: fetch failed' } },
    });
    const cw = Callwarden.rpc(sb);
    const conflict = await cw.taskCreated({ jobId: JOB, taskId: 'b', actor: 'w' })
      .then(() => null, (e) => e);
    assert.ok(conflict instanceof TaskIdConflict);
    assert.equal(conflict.fn, 'callwarden.task_created');
    assert.match(conflict.message, /callwarden\.task_created: job x holds task a, not b/);
    await assert.rejects(cw.startCall({ jobId: JOB, kind: 'k', actor: 'w' }), JobNotFound);
    await assert.rejects(cw.cancel({ jobId: JOB, by: 'u' }), PermissionDenied);
    const down = await cw.heartbeat({ jobId: JOB, owner: 'w' }).then(() => null, (e) => e);
    assert.equal(down?.transient, true);
    await assert.rejects(cw.failed(/** @type {any} */ ({ jobId: JOB, actor: 'w' })),
                         InvalidArgument);
    assert.equal(sb.calls.filter((c) => c.fn === 'failed').length, 0);
  });
});

describe('rpc face, real supabase-js over HTTP to the real functions', () => {
  const db = pool(3);
  /** @type {Awaited<ReturnType<typeof miniPostgrest>>} */
  let server;
  /** @type {Callwarden} */
  let cw;

  before(async () => {
    server = await miniPostgrest(db);
    const supabase = createClient(server.url, 'service-role-key', {
      auth: { persistSession: false, autoRefreshToken: false },
      // Node 20 has no WebSocket: realtime is never used by rpc, give it a constructor.
      realtime: { transport: /** @type {any} */ (class {}) },
    });
    cw = Callwarden.rpc(supabase);
  });
  after(async () => {
    await server.close();
    await db.end();
  });

  test('a whole call: create, start, task, beat, succeed', async () => {
    assert.equal(await cw.hostApiVersion(), 2);
    const jobId = await cw.createJob({ userId: 'user-rpc', credits: '8.5',
                                      input: { prompt: 'x' } });
    assert.deepEqual(await cw.startCall({ jobId, kind: 'kie-standard', actor: 'worker:rpc:1' }),
                     { action: 'create', taskId: null, state: 'created', version: 1 });
    const task = `rpc-${jobId}`;
    assert.deepEqual(await cw.taskCreated({ jobId, taskId: task, actor: 'worker:rpc:1' }),
                     { ok: true, state: 'polling', version: 2 });
    assert.equal(await cw.heartbeat({ jobId, owner: 'worker:rpc:1', progress: 60 }), true);
    const media = [{ key: `rpc/${jobId}.png`, url: '/m/x.png', content_type: 'image/png',
                     size: 10 }];
    assert.deepEqual(await cw.succeeded({ jobId, actor: 'worker:rpc:1', media, cost: 8,
                                          result: { media_urls: ['https://x/y.png'] } }),
                     { ok: true, state: 'completed', settlement: 'settled' });
    const row = await jobRow(db, jobId);
    assert.equal(row.status, 'completed');
    assert.equal(row.provider_task_id, task);
    assert.deepEqual(await usage(db, jobId),
                     [{ status: 'committed', reserved: 8.5, charged: 8, settled: true }]);
    assert.equal((await assets(db, jobId)).length, 1);
    const sent = server.requests.find((r) => r.path === '/rest/v1/rpc/succeeded');
    assert.equal(sent?.headers['content-profile'], 'callwarden');
    assert.equal(sent?.headers.apikey, 'service-role-key');
    assert.deepEqual(sent?.body.media, media);
  });

  test('errors from the database arrive typed', async () => {
    await assert.rejects(cw.startCall({ jobId: randomUUID(), kind: 'kie-standard', actor: 'w' }),
                         JobNotFound);
    const jobId = await cw.createJob({ userId: 'user-rpc', credits: 1 });
    await cw.startCall({ jobId, kind: 'kie-standard', actor: 'w' });
    await cw.taskCreated({ jobId, taskId: `a-${jobId}`, actor: 'w' });
    await assert.rejects(cw.taskCreated({ jobId, taskId: `b-${jobId}`, actor: 'w' }),
                         TaskIdConflict);
    const other = await cw.createJob({ userId: 'user-rpc', credits: 1 });
    await cw.startCall({ jobId: other, kind: 'kie-standard', actor: 'w' });
    await assert.rejects(cw.taskCreated({ jobId: other, taskId: `a-${jobId}`, actor: 'w' }),
                         TaskAlreadyClaimed);
    await assert.rejects(cw.succeeded({ jobId, actor: 'w', cost: -2 }), InvalidArgument);
  });
});

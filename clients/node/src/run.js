// The seed's runKieTask with callwarden's guard, for any queue: claim the call before the
// create (startCall), create only when told to, record the task id the moment the provider
// answers it (taskCreated), resume by task id on a redelivery, heartbeat while the host's
// code runs, and record the outcome with its settlement. runSync is the same for a call
// answered in one round trip (a sync route). A start the provider account's limits refuse
// (`wait`) runs nothing and answers `status: 'waiting'` with `retryAfterMs`: the host's
// queue runs the job again then (for BullMQ: bullmq.js, `delayWhenWaiting`).

import { actorId } from './actor.js';
import { Beater } from './beat.js';
import { CallwardenError, CreateRefused } from './errors.js';

/** @typedef {import('./contract.js').StartAction} StartAction */
/** @typedef {import('./contract.js').StartCall} StartCall */
/** @typedef {import('./contract.js').TaskCreated} TaskCreatedAnswer */
/** @typedef {import('./contract.js').Outcome} Outcome */
/** @typedef {import('./contract.js').StoredMedia} StoredMedia */
/** @typedef {import('./contract.js').ProviderResult} ProviderResult */

/**
 * The calls `runTask` and `runSync` make (a `Callwarden`, over either face).
 * @typedef {Object} HostApi
 * @property {(a: {jobId: string, kind: string, actor: string, sync?: boolean,
 *   recreate?: boolean}) => Promise<StartCall>} startCall
 * @property {(a: {jobId: string, taskId: string, actor: string})
 *   => Promise<TaskCreatedAnswer>} taskCreated
 * @property {(a: {jobId: string, owner: string, progress?: number | null})
 *   => Promise<boolean>} heartbeat
 * @property {(a: {jobId: string, actor: string, media?: StoredMedia[], text?: string | null,
 *   cost?: number | string | null, result?: ProviderResult | null}) => Promise<Outcome>} succeeded
 * @property {(a: {jobId: string, actor: string, error: string, code?: string | null})
 *   => Promise<Outcome>} failed
 * @property {(a: {jobId: string, actor: string}) => Promise<Outcome>} notFound
 */

/**
 * Upstream succeeded: what the host stored (`media`, under keys of its own, unique per
 * job) and what to commit (`cost`, default the reservation, never above it).
 * @typedef {Object} Succeeded
 * @property {'succeeded'} status
 * @property {StoredMedia[]} [media]
 * @property {string} [text]
 * @property {number | string} [cost]
 * @property {ProviderResult} [result]
 */

/**
 * @typedef {Object} Failed
 * @property {'failed'} status
 * @property {string} error
 * @property {string} [code]
 */

/**
 * What the host's `poll(taskId)` answers.
 * @typedef {{status: 'running', progress?: number} | Succeeded | Failed
 *   | {status: 'not_found'}} PollResult
 */

/**
 * What a sync call answers: an outcome, and anything else the route wants back.
 * @typedef {Succeeded | Failed} SyncOutcome
 */

/**
 * Given to the host's `create`, `poll` and `call`: `signal` aborts when the caller's
 * signal does or when the call is no longer this worker's to run (a heartbeat said so).
 * @typedef {Object} CallContext
 * @property {string} jobId
 * @property {AbortSignal} signal
 */

/**
 * @typedef {Object} RunTaskOptions
 * @property {string} jobId
 * @property {string} kind the provider kind (`kie-standard`, ...)
 * @property {string} [actor] default `actorId('worker')`
 * @property {(ctx: CallContext) => Promise<string>} create makes the provider's create
 *   request, answers the task id; throws `CreateRefused` when nothing was created upstream
 * @property {(taskId: string, ctx: CallContext) => Promise<PollResult>} poll one status
 *   request (a thrown error is retried, up to `maxPollErrors` in a row)
 * @property {number} [heartbeatEveryMs] default 10,000 (well under the reconciler's
 *   heartbeat timeout, 60 s by default)
 * @property {number} [pollEveryMs] default 2,000
 * @property {AbortSignal} [signal] stop polling (the call stays open: resumed by the next
 *   delivery or recovered by the reconciler)
 * @property {boolean} [recreate] create again when a call started earlier has no task id
 *   (accepts paying twice; default false: such a call is left to the reconciler)
 * @property {number} [maxPollErrors] default 5
 * @property {(err: unknown, where: string) => void} [onError] a failed heartbeat, poll or
 *   database write that is being retried
 */

/**
 * How a run ended.
 * - `recorded`: this run recorded the outcome (`outcome.ok` false: another actor ended the
 *   call first; `outcome.state` says how it stands)
 * - `skipped`: `startCall` said not to run (ambiguous, finalize, done, not_started, ...)
 * - `waiting`: `startCall` answered `wait`: the account's limits refused the start and
 *   nothing was written or sent; run the job again after `retryAfterMs` (`reason` names
 *   the limit). Not a failure: the job's queue delays it, and it is no attempt
 * - `stopped`: the call stopped being this worker's (a heartbeat answered false, or the
 *   task id could not be recorded because the call had ended)
 * - `aborted`: the caller's signal (the call is left open, except before the create:
 *   then nothing exists upstream and it is recorded failed and refunded)
 * @typedef {Object} RunResult
 * @property {StartAction} action what `startCall` answered
 * @property {string | null} taskId
 * @property {'recorded' | 'skipped' | 'stopped' | 'aborted' | 'waiting'} status
 * @property {'succeeded' | 'failed' | 'not_found' | null} upstream the provider's answer
 *   that was recorded
 * @property {Outcome | null} outcome
 * @property {string | null} [reason] `waiting` only: the limit that refused the start
 * @property {number} [retryAfterMs] `waiting` only: run the job again after this long
 */

/**
 * @template {SyncOutcome} A
 * @typedef {Object} RunSyncOptions
 * @property {string} jobId
 * @property {string} kind a sync kind (`anthropic-sync`, `kie-llm`, `elevenlabs-sync`)
 * @property {string} [actor] default `actorId('route')`
 * @property {(ctx: CallContext) => Promise<A>} call the provider request (its answer is
 *   handed back as `answer`); a thrown error is recorded as a failure (refund) and rethrown
 * @property {number} [heartbeatEveryMs] default 10,000
 * @property {AbortSignal} [signal]
 * @property {(err: unknown, where: string) => void} [onError]
 */

/**
 * @template {SyncOutcome} A
 * @typedef {Object} RunSyncResult
 * @property {StartAction} action
 * @property {'recorded' | 'skipped' | 'waiting'} status `waiting`: as `runTask`'s (the
 *   route answers the user "busy, try again", or queues the job, after `retryAfterMs`)
 * @property {'succeeded' | 'failed' | null} upstream
 * @property {Outcome | null} outcome
 * @property {A | null} answer what `call()` answered (null when skipped or waiting)
 * @property {string | null} [reason] `waiting` only: the limit that refused the start
 * @property {number} [retryAfterMs] `waiting` only: try again after this long
 */

const RECORD_ATTEMPTS = 6;

/**
 * Wait `ms`, or less when `signal` aborts.
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
export function wait(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}

/**
 * The wait before retry `n` (1, 2, ...): doubling from `baseMs`, capped, jittered.
 * @param {number} n
 * @param {number} baseMs
 */
function backoff(n, baseMs) {
  const ms = Math.min(baseMs * 2 ** (n - 1), 5_000);
  return ms / 2 + Math.random() * (ms / 2);
}

/**
 * `write()`, made again while it fails transiently (the database unreachable, a
 * serialization failure), up to RECORD_ATTEMPTS times within ~8 s. Every function of the
 * host API is safe to repeat: a repeat of one whose commit went through answers how the
 * call stands (`ok: false`; a repeated start_call answers `ambiguous`, so nothing is
 * created, and the reconciler refunds the call).
 * @template T
 * @param {() => Promise<T>} write
 * @param {(err: unknown, where: string) => void} onError
 * @param {string} where
 * @returns {Promise<T>}
 */
async function retrying(write, onError, where) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await write();
    } catch (err) {
      if (!(err instanceof CallwardenError && err.transient) || attempt >= RECORD_ATTEMPTS) {
        throw err;
      }
      onError(err, where);
      await wait(backoff(attempt, 250));
    }
  }
}

/** @param {unknown} err */
function errorText(err) {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}

/**
 * Links the caller's signal to an internal controller; `lose()` aborts it too.
 * @param {AbortSignal | undefined} outer
 */
function stopper(outer) {
  const controller = new AbortController();
  const follow = () => controller.abort(outer?.reason);
  outer?.addEventListener('abort', follow, { once: true });
  return {
    signal: controller.signal,
    /** @param {string} why */
    lose: (why) => controller.abort(new Error(why)),
    release: () => outer?.removeEventListener('abort', follow),
  };
}

/**
 * Record a provider outcome (`succeeded`, `failed` or `not_found`).
 * @param {HostApi} cw
 * @param {string} jobId
 * @param {string} actor
 * @param {Succeeded | Failed | {status: 'not_found'}} answer
 * @param {(err: unknown, where: string) => void} onError
 * @returns {Promise<Outcome>}
 */
function record(cw, jobId, actor, answer, onError) {
  switch (answer.status) {
    case 'succeeded':
      return retrying(() => cw.succeeded({
        jobId, actor, media: answer.media ?? [], text: answer.text ?? null,
        cost: answer.cost ?? null, result: answer.result ?? null,
      }), onError, 'succeeded');
    case 'failed':
      return retrying(() => cw.failed({
        jobId, actor, error: String(answer.error ?? 'failed'), code: answer.code ?? null,
      }), onError, 'failed');
    default:
      return retrying(() => cw.notFound({ jobId, actor }), onError, 'not_found');
  }
}

/**
 * What a `wait` answer says: the limit, and when to try again.
 * @param {StartCall} start
 * @returns {{reason: string | null, retryAfterMs: number}}
 */
function waiting(start) {
  return { reason: start.reason ?? null, retryAfterMs: start.retryAfterMs ?? 0 };
}

const OUTCOMES = new Set(['running', 'succeeded', 'failed', 'not_found']);

/**
 * @param {string} who
 * @param {unknown} answer
 * @param {Set<string>} allowed
 */
function checkAnswer(who, answer, allowed) {
  const status = answer !== null && typeof answer === 'object'
    ? /** @type {{status?: unknown}} */ (answer).status : undefined;
  if (typeof status !== 'string' || !allowed.has(status)) {
    throw new TypeError(`${who} must answer {status: ${[...allowed].join(' | ')}}, got `
                        + `${JSON.stringify(answer)?.slice(0, 200)}`);
  }
}

/**
 * Run one async provider call to its end, or hand it on: the seed's runKieTask, made
 * safe against redelivery (it never creates twice) and against a dead worker (the task id
 * is durable the moment the provider answers it, and the reconciler recovers it).
 * @param {HostApi} cw
 * @param {RunTaskOptions} options
 * @returns {Promise<RunResult>}
 */
export async function runTask(cw, options) {
  const { jobId, kind, create, poll } = options;
  if (typeof create !== 'function' || typeof poll !== 'function') {
    throw new TypeError('runTask: create and poll must be functions');
  }
  const actor = options.actor ?? actorId('worker');
  const pollEveryMs = options.pollEveryMs ?? 2_000;
  const maxPollErrors = options.maxPollErrors ?? 5;
  const onError = options.onError ?? (() => {});
  options.signal?.throwIfAborted();

  const start = await retrying(() => cw.startCall({
    jobId, kind, actor, recreate: options.recreate ?? false,
  }), onError, 'start_call');
  /**
   * @param {RunResult['status']} status
   * @param {string | null} taskId
   * @param {Partial<RunResult>} [more]
   * @returns {RunResult}
   */
  const result = (status, taskId, more = {}) => ({
    action: start.action, taskId, status, upstream: null, outcome: null, ...more,
  });
  if (start.action === 'wait') {
    return result('waiting', null, waiting(start));
  }
  if (start.action !== 'create' && start.action !== 'resume') {
    return result('skipped', start.taskId);
  }
  const stop = stopper(options.signal);
  const beater = new Beater({
    cw, jobId, owner: actor, everyMs: options.heartbeatEveryMs ?? 10_000, onError,
    onLost: () => stop.lose('the call is no longer open to this worker'),
  }).start();
  /** @type {CallContext} */
  const ctx = { jobId, signal: stop.signal };
  try {
    let taskId = start.taskId;
    if (start.action === 'create') {
      if (stop.signal.aborted) {
        // Nothing was sent upstream: end the call now rather than leave it ambiguous.
        const outcome = await record(cw, jobId, actor, {
          status: 'failed', error: 'aborted before the create request', code: 'aborted',
        }, onError);
        return result('aborted', null, { upstream: 'failed', outcome });
      }
      let created;
      try {
        created = await create(ctx);
      } catch (err) {
        if (beater.lost) return result('stopped', null); // ended meanwhile (cancelled, swept)
        if (err instanceof CreateRefused) {
          const outcome = await record(cw, jobId, actor, {
            status: 'failed', error: err.message, code: err.code,
          }, onError);
          return result('recorded', null, { upstream: 'failed', outcome });
        }
        throw err; // the task may exist upstream: ambiguous, the reconciler sweeps it
      }
      if (typeof created !== 'string' || created === '') {
        throw new TypeError(`runTask: create() must answer the provider's task id (a `
                            + `non-empty string), got ${JSON.stringify(created)}`);
      }
      taskId = created;
      const recorded = await retrying(
        () => cw.taskCreated({ jobId, taskId: created, actor }), onError, 'task_created');
      if (!recorded.ok && recorded.state !== 'polling') {
        return result('stopped', taskId);
      }
    }
    if (taskId === null) {
      throw new CallwardenError(`callwarden.start_call: answered resume without a task id`,
                                { fn: 'callwarden.start_call' });
    }
    for (let errors = 0; ;) {
      if (stop.signal.aborted) {
        return result(beater.lost ? 'stopped' : 'aborted', taskId);
      }
      /** @type {PollResult} */
      let answer;
      try {
        answer = await poll(taskId, ctx);
        errors = 0;
      } catch (err) {
        if (stop.signal.aborted) continue;
        errors += 1;
        if (errors >= maxPollErrors) throw err;
        onError(err, 'poll');
        await wait(backoff(errors, pollEveryMs), stop.signal);
        continue;
      }
      checkAnswer('runTask: poll()', answer, OUTCOMES);
      if (answer.status === 'running') {
        if (typeof answer.progress === 'number') beater.progress = answer.progress;
        await wait(pollEveryMs, stop.signal);
        continue;
      }
      const outcome = await record(cw, jobId, actor, answer, onError);
      return result('recorded', taskId, { upstream: answer.status, outcome });
    }
  } finally {
    await beater.stop();
    stop.release();
  }
}

const SYNC_OUTCOMES = new Set(['succeeded', 'failed']);

/**
 * Run one sync provider call (answered in one round trip) under a heartbeat: a route
 * killed mid-call is swept and refunded by the reconciler, a call that ends is settled
 * once, and a call longer than its kind's threshold is not swept while it beats.
 * @template {SyncOutcome} A
 * @param {HostApi} cw
 * @param {RunSyncOptions<A>} options
 * @returns {Promise<RunSyncResult<A>>}
 */
export async function runSync(cw, options) {
  const { jobId, kind, call } = options;
  if (typeof call !== 'function') throw new TypeError('runSync: call must be a function');
  const actor = options.actor ?? actorId('route');
  const onError = options.onError ?? (() => {});
  options.signal?.throwIfAborted();
  const start = await retrying(() => cw.startCall({ jobId, kind, actor, sync: true }),
                               onError, 'start_call');
  if (start.action === 'wait') {
    return { action: start.action, status: 'waiting', upstream: null, outcome: null,
             answer: null, ...waiting(start) };
  }
  if (start.action !== 'create') {
    return { action: start.action, status: 'skipped', upstream: null, outcome: null,
             answer: null };
  }
  const stop = stopper(options.signal);
  const beater = new Beater({
    cw, jobId, owner: actor, everyMs: options.heartbeatEveryMs ?? 10_000, onError,
    onLost: () => stop.lose('the call is no longer open to this route'),
  }).start();
  try {
    /** @type {A} */
    let answer;
    try {
      answer = await call({ jobId, signal: stop.signal });
      checkAnswer('runSync: call()', answer, SYNC_OUTCOMES);
    } catch (err) {
      try {
        await record(cw, jobId, actor, {
          status: 'failed', error: errorText(err).slice(0, 1_000), code: 'exception',
        }, onError);
      } catch (recordErr) {
        onError(recordErr, 'failed'); // the reconciler sweeps and refunds the call
      }
      throw err;
    }
    const outcome = await record(cw, jobId, actor, answer, onError);
    return { action: start.action, status: 'recorded', upstream: answer.status, outcome,
             answer };
  } finally {
    await beater.stop();
    stop.release();
  }
}

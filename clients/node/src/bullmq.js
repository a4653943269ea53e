// The BullMQ glue (`@callwarden/client/bullmq`; BullMQ 5 is the host's own dependency, so
// this module is apart from index.js): a job whose start the provider account's limits
// refused (`runTask`/`runSync` answered `status: 'waiting'`) goes back to BullMQ's delayed
// set for `retryAfterMs`, plus up to a quarter of it, with BullMQ's manual-delay pattern
// (`job.moveToDelayed(timestamp, token)`, then `throw new DelayedError()`). BullMQ's
// `moveToDelayed` does not count an attempt (`skipAttempt`), and the worker takes a
// `DelayedError` for a job it moved, neither completed nor failed: a job waits behind a
// full account for as long as it is refused, whatever its `attempts`, and starts once a
// slot frees.

import { DelayedError } from 'bullmq';

/**
 * The part of a BullMQ job used here (a `Job`, or a sandboxed processor's job).
 * @typedef {Object} DelayableJob
 * @property {(timestamp: number, token?: string) => Promise<void>} moveToDelayed
 */

/**
 * What a run answers (`RunResult`, `RunSyncResult`, or the host's own with the same two
 * fields).
 * @typedef {{status: string, retryAfterMs?: number, reason?: string | null}} Waitable
 */

/** The shortest delay (ms): a `wait` that names none is not retried in a loop. */
export const MIN_DELAY_MS = 50;

/**
 * `ms` plus up to a quarter of it, so that the jobs a limit refused together do not all
 * come back at once (at least `MIN_DELAY_MS`).
 * @param {number} ms
 * @returns {number}
 */
export function jittered(ms) {
  return Math.round(Math.max(ms, MIN_DELAY_MS) * (1 + Math.random() / 4));
}

/**
 * In a BullMQ processor: when `result` waits (`status: 'waiting'`), move `job` to the
 * delayed set for its `retryAfterMs` (jittered) and throw BullMQ's `DelayedError`, which
 * the worker takes for a job moved by its processor (not failed, not completed, not an
 * attempt). Otherwise answer `result` as it is.
 * @template {Waitable} R
 * @param {DelayableJob} job
 * @param {string | undefined} token the processor's second argument (the job's lock)
 * @param {R} result
 * @returns {Promise<R>}
 */
export async function delayIfWaiting(job, token, result) {
  if (result === null || typeof result !== 'object' || result.status !== 'waiting') {
    return result;
  }
  await job.moveToDelayed(Date.now() + jittered(result.retryAfterMs ?? 0), token);
  throw new DelayedError(`callwarden: waiting${result.reason ? `: ${result.reason}` : ''}`);
}

/**
 * A BullMQ processor running `handler` (which answers a `runTask`/`runSync` result) and
 * delaying the job while it waits (`delayIfWaiting`):
 *
 *     new Worker('generate', delayWhenWaiting((job, _token, signal) =>
 *       cw.runTask({ jobId: job.data.jobId, kind: 'kie-standard', signal, create, poll })),
 *       { connection });
 *
 * @template {Waitable} R
 * @template [D=any]
 * @param {(job: import('bullmq').Job<D, R>, token: string | undefined,
 *          signal: AbortSignal | undefined) => Promise<R>} handler
 * @returns {import('bullmq').Processor<D, R>}
 */
export function delayWhenWaiting(handler) {
  return async (job, token, signal) => delayIfWaiting(job, token,
                                                      await handler(job, token, signal));
}

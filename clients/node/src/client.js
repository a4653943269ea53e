// The Callwarden client: one method per host-API function, each one SQL call (one
// transaction on a pool), with typed answers and errors; and the two loops built on them.

import { FUNCTIONS, HOST_API_VERSION } from './contract.js';
import { CallwardenError } from './errors.js';
import { runSync, runTask } from './run.js';
import { pgTransport, rpcTransport } from './transport.js';

/** @typedef {import('./transport.js').Queryable} Queryable */
/** @typedef {import('./transport.js').RpcClient} RpcClient */
/** @typedef {import('./transport.js').Transport} Transport */
/** @typedef {import('./contract.js').FunctionSpec} FunctionSpec */
/** @typedef {import('./contract.js').StartCall} StartCall */
/** @typedef {import('./contract.js').SlowedDown} SlowedDown */
/** @typedef {import('./contract.js').TaskCreated} TaskCreated */
/** @typedef {import('./contract.js').Outcome} Outcome */
/** @typedef {import('./contract.js').StoredMedia} StoredMedia */
/** @typedef {import('./contract.js').ProviderResult} ProviderResult */
/** @typedef {import('./run.js').RunTaskOptions} RunTaskOptions */
/** @typedef {import('./run.js').RunResult} RunResult */
/** @typedef {import('./run.js').SyncOutcome} SyncOutcome */

/** @type {FunctionSpec} */
const VERSION = { sql: 'host_api_version', returns: 'scalar', params: [] };

/**
 * @param {string} fn
 * @param {unknown} row
 * @returns {Record<string, unknown>}
 */
function asRow(fn, row) {
  if (row === null || typeof row !== 'object') {
    throw new CallwardenError(`callwarden.${fn}: answered ${JSON.stringify(row)}, not a row`,
                              { fn: `callwarden.${fn}` });
  }
  return /** @type {Record<string, unknown>} */ (row);
}

/** @param {unknown} v */
const str = (v) => (v === null || v === undefined ? null : String(v));

/**
 * @param {unknown} row
 * @returns {Outcome}
 */
function outcome(row) {
  const r = asRow('outcome', row);
  return {
    ok: r.ok === true,
    state: /** @type {Outcome['state']} */ (str(r.state)),
    settlement: str(r.settlement),
  };
}

/**
 * `value` with every NUL character made U+FFFD, in strings, arrays and plain objects
 * (keys too): Postgres refuses NUL in text and jsonb, and a provider's answer or an
 * error's text that carries one must still be recordable (as Python's write path makes
 * it: `without_nul`).
 * @param {unknown} value
 * @returns {unknown}
 */
export function withoutNul(value) {
  if (typeof value === 'string') {
    return value.includes('\0') ? value.replaceAll('\0', '\uFFFD') : value;
  }
  if (Array.isArray(value)) return value.map(withoutNul);
  if (value !== null && typeof value === 'object'
      && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.fromEntries(Object.entries(value).map(
      ([k, v]) => [withoutNul(k), withoutNul(v)]));
  }
  return value;
}

export class Callwarden {
  /** @type {Transport} */
  #t;

  /**
   * @param {Queryable | Transport} source a `pg.Pool` (each call its own transaction), a
   *   `pg.Client`/`PoolClient` (inside the host's transaction when it began one), or a
   *   transport (`rpcTransport(supabase)`; see `Callwarden.rpc`)
   */
  constructor(source) {
    this.#t = 'invoke' in source && typeof source.invoke === 'function'
      ? /** @type {Transport} */ (source) : pgTransport(/** @type {Queryable} */ (source));
  }

  /**
   * The same client over supabase-js: `supabase.schema('callwarden').rpc(...)`.
   * @param {RpcClient} supabase a client made with the service-role key (server side only)
   * @returns {Callwarden}
   */
  static rpc(supabase) {
    return new Callwarden(rpcTransport(supabase));
  }

  /** `pg` or `rpc`. */
  get face() {
    return this.#t.face;
  }

  /**
   * @param {string} name
   * @param {Record<string, unknown>} args
   */
  #call(name, args) {
    const spec = FUNCTIONS[name];
    if (spec === undefined) throw new Error(`no host-API function ${name}`);
    return this.#t.invoke(spec, /** @type {Record<string, unknown>} */ (withoutNul(args)));
  }

  /**
   * `callwarden.host_api_version()`: the contract version the database speaks.
   * @returns {Promise<number>}
   */
  async hostApiVersion() {
    return Number(await this.#t.invoke(VERSION, {}));
  }

  /**
   * Refuse to start against a database whose host API this client does not speak.
   * @returns {Promise<number>}
   */
  async checkVersion() {
    const version = await this.hostApiVersion();
    if (version !== HOST_API_VERSION) {
      throw new CallwardenError(
        `callwarden.host_api_version() is ${version}; this client speaks ${HOST_API_VERSION}`,
        { fn: 'callwarden.host_api_version' });
    }
    return version;
  }

  /**
   * A `jobs` row (status `pending`) and its reservation of `credits` in one statement
   * (`credits` null: no reservation). Its id.
   * @param {{userId: string, credits: number | string | null, input?: unknown,
   *          jobType?: string, jobId?: string}} args
   * @returns {Promise<string>}
   */
  async createJob(args) {
    const id = await this.#call('createJob', args);
    return String(id);
  }

  /**
   * The claim before the create: what this delivery must do (`action`). `wait`: the
   * provider account's limits refused the start (nothing was written); `reason` and
   * `retryAfterMs` say why and for how long (`callwarden.waiting_for`, a second call).
   * @param {{jobId: string, kind: string, actor: string, sync?: boolean,
   *          recreate?: boolean}} args
   * @returns {Promise<StartCall>}
   */
  async startCall(args) {
    const r = asRow('start_call', await this.#call('startCall', args));
    /** @type {StartCall} */
    const start = {
      action: /** @type {StartCall['action']} */ (String(r.action)),
      taskId: str(r.task_id),
      state: /** @type {StartCall['state']} */ (str(r.state)),
      version: Number(r.version),
    };
    if (start.action !== 'wait') return start;
    const why = await this.waitingFor({ jobId: args.jobId });
    return { ...start, reason: why?.reason ?? null, retryAfterMs: why?.retryAfterMs ?? 0 };
  }

  /**
   * Why a job waits (its start refused by the account's limits): the limit, and the ms
   * until a start may be admitted; null when it does not wait.
   * @param {{jobId: string}} args
   * @returns {Promise<{reason: string, retryAfterMs: number} | null>}
   */
  async waitingFor(args) {
    const answer = await this.#call('waitingFor', args);
    if (answer === null) return null;
    const r = asRow('waiting_for', answer);
    return { reason: String(r.reason),
             retryAfterMs: Math.max(0, Math.round(Number(r.retry_after_s) * 1000)) };
  }

  /**
   * The provider refused a create (or a sync call) of `kind` with 429, after your own
   * transport's retries: pause the account whose limit names `kind` for the whole fleet
   * for `retryAfterS` (the provider's `Retry-After`; null or left out: the account's
   * `wait_s`), and halve its caps unless it was paused already
   * (`callwarden.slow_down`). Create again after `pausedS` (plus some jitter), while your
   * call beats; null when no limit names the kind (nothing to wait for: fail the call,
   * refunded, e.g. `throw new CreateRefused(...)` in `runTask`'s `create`).
   * @param {{kind: string, retryAfterS?: number | null}} args
   * @returns {Promise<SlowedDown | null>}
   */
  async slowDown(args) {
    const answer = await this.#call('slowDown', { kind: args.kind,
                                                  retryAfterS: args.retryAfterS ?? null });
    if (answer === null) return null;
    const r = asRow('slow_down', answer);
    return { account: String(r.account), pausedS: Math.max(0, Number(r.paused_s)),
             rateFactor: Number(r.rate_factor) };
  }

  /**
   * Record the provider's task id (the call's first heartbeat). Throws `TaskIdConflict`
   * when the job holds another id, `TaskAlreadyClaimed` when another job holds this one.
   * @param {{jobId: string, taskId: string, actor: string}} args
   * @returns {Promise<TaskCreated>}
   */
  async taskCreated(args) {
    const r = asRow('task_created', await this.#call('taskCreated', args));
    return {
      ok: r.ok === true,
      state: /** @type {TaskCreated['state']} */ (str(r.state)),
      version: Number(r.version),
    };
  }

  /**
   * The call's holder is alive (projection only). False: stop polling, the call ended or
   * its result is recorded.
   * @param {{jobId: string, owner: string, progress?: number | null}} args
   * @returns {Promise<boolean>}
   */
  async heartbeat(args) {
    return (await this.#call('heartbeat', args)) === true;
  }

  /**
   * Upstream succeeded: the job completed, its asset rows, and the commit (at `cost`,
   * default the reservation, never above it) in one transaction.
   * @param {{jobId: string, actor: string, media?: StoredMedia[], text?: string | null,
   *          cost?: number | string | null, result?: ProviderResult | null}} args
   * @returns {Promise<Outcome>}
   */
  async succeeded(args) {
    return outcome(await this.#call('succeeded', args));
  }

  /**
   * Upstream failed: the job failed, refunded.
   * @param {{jobId: string, actor: string, error: string, code?: string | null}} args
   * @returns {Promise<Outcome>}
   */
  async failed(args) {
    return outcome(await this.#call('failed', args));
  }

  /**
   * The provider no longer knows the task: swept, refunded.
   * @param {{jobId: string, actor: string}} args
   * @returns {Promise<Outcome>}
   */
  async notFound(args) {
    return outcome(await this.#call('notFound', args));
  }

  /**
   * The user cancelled: any open call (or a job whose call never started), refunded.
   * @param {{jobId: string, by: string}} args
   * @returns {Promise<Outcome>}
   */
  async cancel(args) {
    return outcome(await this.#call('cancel', args));
  }

  /**
   * Run an async provider call (see run.js, `runTask`).
   * @param {RunTaskOptions} options
   * @returns {Promise<RunResult>}
   */
  runTask(options) {
    return runTask(this, options);
  }

  /**
   * Run a sync provider call under a heartbeat (see run.js, `runSync`).
   * @template {SyncOutcome} A
   * @param {import('./run.js').RunSyncOptions<A>} options
   * @returns {Promise<import('./run.js').RunSyncResult<A>>}
   */
  runSync(options) {
    return runSync(this, options);
  }
}

// Typed errors of the host API: every failure of a call to a callwarden.* function is a
// CallwardenError naming the function and carrying the SQLSTATE; the ones a host acts on
// have their own class.

/** A failure of one call to a `callwarden.*` SQL function. */
export class CallwardenError extends Error {
  /**
   * @param {string} message
   * @param {{fn: string, code?: string | null, cause?: unknown}} info
   */
  constructor(message, { fn, code = null, cause }) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    /** The SQL function called (e.g. `callwarden.task_created`). */
    this.fn = fn;
    /** The SQLSTATE (`CW001`, `23505`, `P0002`, ...) or the driver's error code. */
    this.code = code;
  }

  /** Whether the same call may succeed if made again (the database was unreachable, a
   * serialization failure). */
  get transient() {
    return false;
  }
}

/** The job does not exist (SQLSTATE P0002). */
export class JobNotFound extends CallwardenError {}

/** The job already holds another upstream task id (SQLSTATE CW001): this task is not
 * recorded; never poll it for this job. */
export class TaskIdConflict extends CallwardenError {}

/** Another job already holds this upstream task id (unique violation 23505). */
export class TaskAlreadyClaimed extends CallwardenError {}

/** A job with this id already exists (create_job with a given job id; 23505). */
export class JobExists extends CallwardenError {}

/** The job's call is of another provider kind (SQLSTATE CW002). */
export class KindMismatch extends CallwardenError {}

/** The log refused the transition (SQLSTATE CW003): a bug in the caller's sequence. */
export class IllegalTransition extends CallwardenError {}

/** An argument the function refuses (SQLSTATE 22023, or caught before sending). */
export class InvalidArgument extends CallwardenError {}

/** The caller's role may not execute the function (SQLSTATE 42501): run
 * `callwarden grant ROLE` for it. */
export class PermissionDenied extends CallwardenError {}

/** The database could not be reached or dropped the connection, or the transaction hit a
 * serialization failure or deadlock. The same call may be made again: every function of
 * the host API is safe to repeat (one whose commit did go through answers how the call
 * stands: `ok: false`, or `ambiguous` for a repeated `start_call`, which then creates
 * nothing). */
export class DatabaseUnavailable extends CallwardenError {
  /** @override */
  get transient() {
    return true;
  }
}

/** Thrown by a host's `create()` when the provider refused the request (a 4xx, a
 * validation error): nothing exists upstream, so `runTask` records the call as failed and
 * refunds it. Any other error out of `create()` leaves the call ambiguous (the task may
 * exist upstream): the reconciler sweeps and refunds it, nothing creates it again. */
export class CreateRefused extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, cause?: unknown}} [options]
   */
  constructor(message, { code = 'refused', cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'CreateRefused';
    this.code = code;
  }
}

const NETWORK_CODES = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH',
  'ENETUNREACH', 'ENOENT', // ENOENT: a Unix socket that is not there (server down)
]);
const TRANSIENT_SQLSTATES = new Set(['40001', '40P01', '57P01', '57P02', '57P03', '53300']);
const CONNECTION_MESSAGES = [
  'Connection terminated', 'connection timeout', 'Client has encountered a connection error',
  'timeout exceeded when trying to connect', 'fetch failed',
];

/**
 * The typed error for a driver's (or PostgREST's) error `err` from SQL function `fn`.
 * @param {string} fn
 * @param {unknown} err
 * @returns {CallwardenError}
 */
export function classify(fn, err) {
  if (err instanceof CallwardenError) return err;
  const e = /** @type {{code?: unknown, message?: unknown, details?: unknown}} */ (
    err !== null && typeof err === 'object' ? err : {});
  const code = typeof e.code === 'string' ? e.code : null;
  const text = typeof e.message === 'string' ? e.message : String(err);
  const message = `${fn}: ${text}`;
  const info = { fn, code, cause: err };
  switch (code) {
    case 'P0002': return new JobNotFound(message, info);
    case 'CW001': return new TaskIdConflict(message, info);
    case '23505':
      if (fn.endsWith('task_created')) return new TaskAlreadyClaimed(message, info);
      if (fn.endsWith('create_job')) return new JobExists(message, info);
      return new CallwardenError(message, info);
    case 'CW002': return new KindMismatch(message, info);
    case 'CW003': return new IllegalTransition(message, info);
    case '22023': return new InvalidArgument(message, info);
    case '42501': return new PermissionDenied(message, info);
    default: break;
  }
  if ((code !== null && (NETWORK_CODES.has(code) || TRANSIENT_SQLSTATES.has(code)
                         || code.startsWith('08')))
      || (code === null && CONNECTION_MESSAGES.some((m) => text.includes(m)))) {
    return new DatabaseUnavailable(message, info);
  }
  return new CallwardenError(message, info);
}

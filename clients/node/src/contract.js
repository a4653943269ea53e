// The host API's SQL functions (migration 0014_host_api.sql; 0018 added admission
// control: `start_call`'s `wait`, `waiting_for`, and `slow_down` for a 429), declared once: each
// method's arguments (the JS name, the SQL parameter it binds by name, its SQL type,
// whether it is required) and the shape of its answer. Both faces (pg and supabase-js
// rpc) are driven by this table, so they cannot disagree on a name.

/** The answers of `startCall`. `already_started`: a sync call that started before (only
 * the first start of a sync call answers `create`). `wait`: the provider account's limits
 * (`callwarden.limits`) refused the start, nothing was written: run the job again after
 * `retryAfterMs` (host API version 2). */
/** @typedef {'create' | 'resume' | 'ambiguous' | 'finalize' | 'done' | 'not_started'
 *            | 'already_started' | 'wait'} StartAction */

/** @typedef {'created' | 'polling' | 'upstream_succeeded' | 'finalizing' | 'completed'
 *            | 'failed' | 'swept' | 'exhausted' | 'cancelled'} CallState */

/**
 * What `startCall` answered: what this delivery must do next.
 * @typedef {Object} StartCall
 * @property {StartAction} action
 * @property {string | null} taskId the task the job holds (set for `resume`)
 * @property {CallState | null} state the call's state after the start
 * @property {number} version the call's version (number of events) after the start
 * @property {string | null} [reason] for `wait` only: the limit that refused the start
 *   (`kie-main: 5 of 5 calls in flight`), from `callwarden.waiting_for`
 * @property {number} [retryAfterMs] for `wait` only: when a start may be admitted, in ms
 *   (0 when the database no longer holds the job as waiting: try again now)
 */

/**
 * What `slowDown` answered: the provider account (`callwarden.limits`) that names the kind,
 * now paused for the whole fleet (every start answers `wait` until the pause ends).
 * @typedef {Object} SlowedDown
 * @property {string} account the account paused
 * @property {number} pausedS seconds left of its pause: create again after them
 * @property {number} rateFactor the share of its caps it admits now (halved by the first
 *   429 of a pause, down to 1/64; one call's worth comes back per `wait_s` after it)
 */

/**
 * @typedef {Object} TaskCreated
 * @property {boolean} ok this call recorded TaskCreated (false: the same id twice, or the
 *   call is no longer waiting for its task id; `state` says how it stands)
 * @property {CallState | null} state
 * @property {number} version
 */

/**
 * How an outcome (`succeeded`, `failed`, `notFound`, `cancel`) was recorded.
 * @typedef {Object} Outcome
 * @property {boolean} ok this call ended the call (false: someone ended it first, or the
 *   call is not in a state this outcome may follow)
 * @property {CallState | null} state the call's state now
 * @property {string | null} settlement what became of the reservation: `settled` (moved
 *   by this call), `already_settled`, `no_reservation`, or, when `ok` is false, the
 *   call's settlement (`committed`, `refunded`, `host`) or null while it is open
 */

/**
 * A file the host already stored, recorded as an `assets` row.
 * @typedef {Object} StoredMedia
 * @property {string} key the storage key (unique per job: a repeat is not a second row)
 * @property {string} url how the host serves it
 * @property {string} content_type
 * @property {number} size bytes
 */

/**
 * What the provider reported, kept in the call's log (all optional).
 * @typedef {Object} ProviderResult
 * @property {string[]} [media_urls]
 * @property {string} [text]
 * @property {number} [cost]
 * @property {Record<string, number | string>} [usage]
 * @property {string} [stop_reason]
 * @property {Record<string, unknown>} [raw]
 */

/** @typedef {'text' | 'numeric' | 'jsonb' | 'uuid' | 'boolean' | 'int' | 'double'} SqlType */

/**
 * How an argument may be given: `required` (a value), `nullable` (required, and null is a
 * value: sent as NULL), `optional` (left out when not given: the SQL default applies).
 * @typedef {'required' | 'nullable' | 'optional'} Presence
 */

/**
 * One argument: [JS name, SQL parameter name, SQL type, presence].
 * @typedef {[string, string, SqlType, Presence]} Param
 */

/**
 * @typedef {Object} FunctionSpec
 * @property {string} sql the function's name in schema `callwarden`
 * @property {Param[]} params
 * @property {'scalar' | 'row' | 'optional_row'} returns a single value, one row of a TABLE
 *   function, or one row or none (null) of a SETOF function
 */

/** @type {Readonly<Record<string, FunctionSpec>>} */
export const FUNCTIONS = Object.freeze({
  createJob: {
    sql: 'create_job', returns: 'scalar', params: [
      ['userId', 'user_id', 'text', 'required'], ['credits', 'credits', 'numeric', 'nullable'],
      ['input', 'input', 'jsonb', 'optional'], ['jobType', 'job_type', 'text', 'optional'],
      ['jobId', 'job_id', 'uuid', 'optional']],
  },
  startCall: {
    sql: 'start_call', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['kind', 'kind', 'text', 'required'],
      ['actor', 'actor', 'text', 'required'], ['sync', 'sync', 'boolean', 'optional'],
      ['recreate', 'recreate', 'boolean', 'optional']],
  },
  taskCreated: {
    sql: 'task_created', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['taskId', 'task_id', 'text', 'required'],
      ['actor', 'actor', 'text', 'required']],
  },
  heartbeat: {
    sql: 'heartbeat', returns: 'scalar', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['owner', 'owner', 'text', 'required'],
      ['progress', 'progress', 'int', 'optional']],
  },
  succeeded: {
    sql: 'succeeded', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['actor', 'actor', 'text', 'required'],
      ['media', 'media', 'jsonb', 'optional'], ['text', 'text', 'text', 'optional'],
      ['cost', 'cost', 'numeric', 'optional'], ['result', 'result', 'jsonb', 'optional']],
  },
  failed: {
    sql: 'failed', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['actor', 'actor', 'text', 'required'],
      ['error', 'error', 'text', 'required'], ['code', 'code', 'text', 'optional']],
  },
  notFound: {
    sql: 'not_found', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['actor', 'actor', 'text', 'required']],
  },
  cancel: {
    sql: 'cancel', returns: 'row', params: [
      ['jobId', 'job_id', 'uuid', 'required'], ['by', 'by', 'text', 'required']],
  },
  waitingFor: {
    sql: 'waiting_for', returns: 'optional_row', params: [
      ['jobId', 'job_id', 'uuid', 'required']],
  },
  slowDown: {
    sql: 'slow_down', returns: 'optional_row', params: [
      ['kind', 'kind', 'text', 'required'],
      ['retryAfterS', 'retry_after_s', 'double', 'nullable']],
  },
});

/** The schema the functions live in. */
export const SCHEMA = 'callwarden';

/** The contract version this client speaks (`callwarden.host_api_version()`): 2 since
 * migration 0018 (`start_call` may answer `wait`; `waiting_for`; `slow_down`). */
export const HOST_API_VERSION = 2;

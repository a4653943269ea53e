// The two ways to reach the host API: SQL over anything with `query(text, values)` (a
// pg.Pool, a pg.Client, a host's own wrapper inside its transaction), and supabase-js'
// `schema('callwarden').rpc(name, args)`. Both bind arguments by the SQL parameter's
// name (FUNCTIONS), leave out the ones not given (the function's default applies), and
// turn failures into the typed errors of errors.js.

import { SCHEMA } from './contract.js';
import { CallwardenError, InvalidArgument, classify } from './errors.js';

/** @typedef {import('./contract.js').FunctionSpec} FunctionSpec */
/** @typedef {import('./contract.js').SqlType} SqlType */

/**
 * Anything that runs one parameterised statement: a `pg.Pool`, a `pg.Client`, a
 * `pg.PoolClient` inside the host's transaction.
 * @typedef {Object} Queryable
 * @property {(text: string, values?: unknown[]) => Promise<{rows: any[]}>} query
 */

/**
 * A PostgREST error as supabase-js reports it.
 * @typedef {Object} RpcError
 * @property {string} message
 * @property {string} [code]
 * @property {string | null} [details]
 * @property {string | null} [hint]
 */

/**
 * The part of a supabase-js client the rpc face uses:
 * `supabase.schema('callwarden').rpc(name, args)`.
 * @typedef {Object} RpcClient
 * @property {(schema: string) => {rpc: (fn: string, args?: Record<string, unknown>)
 *   => PromiseLike<{data: unknown, error: RpcError | null}>}} schema
 */

/**
 * How the client reaches the functions. `invoke` answers the function's value (a
 * `scalar` spec) or its one row, with the SQL column names (a `row` spec; an
 * `optional_row` spec answers null when the function returned no row).
 * @typedef {Object} Transport
 * @property {'pg' | 'rpc'} face
 * @property {(spec: FunctionSpec, args: Record<string, unknown>) => Promise<unknown>} invoke
 */

/** @type {Record<SqlType, string>} */
const CASTS = {
  text: 'text', numeric: 'numeric', jsonb: 'jsonb', uuid: 'uuid', boolean: 'boolean',
  int: 'integer', double: 'double precision',
};

/**
 * Check one argument's JS value against its SQL type (the message names the argument).
 * @param {string} fn
 * @param {string} name
 * @param {SqlType} type
 * @param {unknown} value
 */
function check(fn, name, type, value) {
  /** @param {string} want */
  const refuse = (want) => {
    throw new InvalidArgument(
      `${fn}: ${name} must be ${want}, got ${describe(value)}`, { fn, code: null });
  };
  switch (type) {
    case 'text': case 'uuid':
      if (typeof value !== 'string') refuse('a string');
      break;
    case 'boolean':
      if (typeof value !== 'boolean') refuse('a boolean');
      break;
    case 'int':
      if (!Number.isInteger(value)) refuse('an integer');
      break;
    case 'double':
      if (!(typeof value === 'number' && Number.isFinite(value))) refuse('a finite number');
      break;
    case 'numeric':
      if (!((typeof value === 'number' && Number.isFinite(value))
            || (typeof value === 'string' && /^-?\d+(\.\d+)?$/.test(value)))) {
        refuse('a finite number (or a decimal string)');
      }
      break;
    case 'jsonb':
      if (typeof value === 'function' || typeof value === 'symbol'
          || typeof value === 'bigint') {
        refuse('a JSON value');
      }
      break;
    default: break;
  }
}

/** @param {unknown} value */
function describe(value) {
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (typeof value === 'string') return JSON.stringify(value.slice(0, 80));
  return typeof value;
}

/**
 * The arguments given (JS names) as [SQL name, type, value], in declaration order;
 * optional ones not given (undefined or null) left out, a nullable one sent as NULL, a
 * required one missing refused.
 * @param {FunctionSpec} spec
 * @param {Record<string, unknown>} args
 * @returns {Array<[string, SqlType, unknown]>}
 */
export function bind(spec, args) {
  const fn = `${SCHEMA}.${spec.sql}`;
  /** @type {Array<[string, SqlType, unknown]>} */
  const bound = [];
  for (const [js, sqlName, type, presence] of spec.params) {
    const value = args[js];
    if (value === null && presence === 'nullable') {
      bound.push([sqlName, type, null]);
      continue;
    }
    if (value === undefined || value === null) {
      if (presence !== 'optional') {
        throw new InvalidArgument(`${fn}: ${js} is required${
          presence === 'nullable' ? ' (null is a value here)' : ''}`, { fn, code: null });
      }
      continue;
    }
    check(fn, js, type, value);
    bound.push([sqlName, type, value]);
  }
  return bound;
}

/**
 * The statement calling `spec` with these arguments by name (`"job_id" => $1::uuid`).
 * @param {FunctionSpec} spec
 * @param {Array<[string, SqlType, unknown]>} bound
 * @returns {{text: string, values: unknown[]}}
 */
export function statement(spec, bound) {
  const named = bound.map(([name, type], i) => `"${name}" => $${i + 1}::${CASTS[type]}`);
  const call = `${SCHEMA}.${spec.sql}(${named.join(', ')})`;
  const text = spec.returns === 'scalar' ? `SELECT ${call} AS value` : `SELECT * FROM ${call}`;
  // jsonb goes as its JSON text: pg would send a JS array as a Postgres array literal.
  const values = bound.map(([, type, value]) => (value === null ? null
    : type === 'jsonb' ? JSON.stringify(value) : type === 'numeric' ? String(value) : value));
  return { text, values };
}

/**
 * @param {string} fn
 * @param {FunctionSpec['returns']} returns
 * @param {unknown} row
 */
function one(fn, returns, row) {
  if (returns === 'row' && (row === null || typeof row !== 'object')) {
    throw new CallwardenError(`${fn}: answered no row`, { fn, code: null });
  }
  return returns === 'optional_row' && (row === null || typeof row !== 'object') ? null : row;
}

/**
 * The SQL face: one statement per call, on `db` (autocommit on a pool: each call is its
 * own transaction; on a client inside BEGIN, part of the host's).
 * @param {Queryable} db
 * @returns {Transport}
 */
export function pgTransport(db) {
  if (db === null || typeof db !== 'object' || typeof db.query !== 'function') {
    throw new TypeError('Callwarden: want a pg.Pool, a pg.Client or an object with query()');
  }
  return {
    face: 'pg',
    async invoke(spec, args) {
      const fn = `${SCHEMA}.${spec.sql}`;
      const { text, values } = statement(spec, bind(spec, args));
      let rows;
      try {
        ({ rows } = await db.query(text, values));
      } catch (err) {
        throw classify(fn, err);
      }
      const [first] = rows;
      return spec.returns === 'scalar' ? (first === undefined ? null : first.value)
        : one(fn, spec.returns, first ?? null);
    },
  };
}

/**
 * The supabase-js face: `supabase.schema('callwarden').rpc(name, args)` (PostgREST binds
 * the arguments by name; a TABLE function answers an array of one row).
 * @param {RpcClient} supabase
 * @returns {Transport}
 */
export function rpcTransport(supabase) {
  if (supabase === null || typeof supabase !== 'object'
      || typeof supabase.schema !== 'function') {
    throw new TypeError('Callwarden.rpc: want a supabase-js client (with schema().rpc())');
  }
  return {
    face: 'rpc',
    async invoke(spec, args) {
      const fn = `${SCHEMA}.${spec.sql}`;
      /** @type {Record<string, unknown>} */
      const params = {};
      for (const [name, , value] of bind(spec, args)) params[name] = value;
      let answer;
      try {
        answer = await supabase.schema(SCHEMA).rpc(spec.sql, params);
      } catch (err) {
        throw classify(fn, err);
      }
      const { data, error } = answer;
      if (error) {
        throw classify(fn, { ...error, code: error.code || undefined });
      }
      const row = spec.returns !== 'scalar' && Array.isArray(data) ? data[0] : data;
      return spec.returns === 'scalar' ? row : one(fn, spec.returns, row ?? null);
    },
  };
}

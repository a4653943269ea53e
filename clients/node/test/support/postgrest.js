// A stand-in for PostgREST's RPC endpoint, over the real database: enough of it for
// supabase-js to talk to (no Supabase server exists here). `POST /rest/v1/rpc/<fn>` with
// `Content-Profile: <schema>` calls `<schema>.<fn>` binding the JSON body's keys to the
// function's parameters by name, as PostgREST does (json_to_record, then the call by
// name); a TABLE function answers a JSON array, a scalar one its value; an error answers
// PostgREST's body `{code, message, details, hint}` with its HTTP status for the SQLSTATE.

import http from 'node:http';

/** @typedef {{query: (text: string, values?: unknown[]) => Promise<{rows: any[]}>}} Db */

/** PostgREST's HTTP status for a SQLSTATE (its documented table, the part used here). */
function statusFor(/** @type {string} */ code) {
  if (code === 'P0002') return 404;
  if (code === '23505') return 409;
  if (code === '42501') return 403;
  if (code.startsWith('22') || code.startsWith('23')) return 400;
  return 400;
}

/**
 * Serve the RPC endpoint on 127.0.0.1; `requests` records what supabase-js sent.
 * @param {Db} db
 * @returns {Promise<{url: string, requests: Array<{path: string, headers: http.IncomingHttpHeaders,
 *   body: any}>, close: () => Promise<void>}>}
 */
export async function miniPostgrest(db) {
  /** @type {Array<{path: string, headers: http.IncomingHttpHeaders, body: any}>} */
  const requests = [];
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (chunk) => { raw += chunk; });
    req.on('end', async () => {
      /**
       * @param {number} status
       * @param {unknown} body
       */
      const send = (status, body) => {
        res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8' });
        res.end(JSON.stringify(body));
      };
      const match = /^\/rest\/v1\/rpc\/([a-z_]+)$/.exec(req.url ?? '');
      const schema = req.headers['content-profile'];
      const body = raw ? JSON.parse(raw) : {};
      requests.push({ path: req.url ?? '', headers: req.headers, body });
      if (req.method !== 'POST' || !match || typeof schema !== 'string') {
        send(404, { code: 'PGRST125', message: 'Invalid path', details: null, hint: null });
        return;
      }
      try {
        send(200, await call(db, schema, match[1], body));
      } catch (err) {
        const e = /** @type {{code?: string, message: string, detail?: string, hint?: string}} */ (err);
        const code = e.code ?? 'PGRST000';
        send(statusFor(code), { code, message: e.message, details: e.detail ?? null,
                                hint: e.hint ?? null });
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const address = /** @type {import('node:net').AddressInfo} */ (server.address());
  return {
    url: `http://127.0.0.1:${address.port}`,
    requests,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

/**
 * @param {Db} db
 * @param {string} schema
 * @param {string} fn
 * @param {Record<string, unknown>} args
 */
async function call(db, schema, fn, args) {
  const { rows } = await db.query(
    `SELECT p.proargnames AS names, p.pronargs AS n, p.proretset AS set,
            array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS types
     FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
     WHERE s.nspname = $1 AND p.proname = $2`, [schema, fn]);
  const given = Object.keys(args);
  const sig = rows.find((r) => given.every((k) => r.names.slice(0, r.n).includes(k)));
  if (sig === undefined) {
    throw Object.assign(new Error(`Could not find the function ${schema}.${fn}(${
      given.join(', ')}) in the schema cache`), { code: 'PGRST202' });
  }
  /** @param {string} name */
  const quoted = (name) => `"${name.replace(/"/g, '""')}"`;
  const columns = given.map((k) => `${quoted(k)} ${sig.types[sig.names.indexOf(k)]}`);
  const bound = given.map((k) => `${quoted(k)} => _.${quoted(k)}`).join(', ');
  const from = `json_to_record($1::json) AS _(${columns.join(', ') || 'unused int'})`;
  const target = `${quoted(schema)}.${quoted(fn)}(${bound})`;
  const text = sig.set
    ? `SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]') AS out FROM ${from}, LATERAL ${target} r`
    : `SELECT to_jsonb(${target}) AS out FROM ${from}`;
  const result = await db.query(text, [JSON.stringify(args)]);
  return result.rows[0].out;
}

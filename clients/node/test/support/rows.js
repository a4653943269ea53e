// Reading back what the host API wrote, by plain SQL (the way a host's dashboard would).

/** @typedef {{query: (text: string, values?: unknown[]) => Promise<{rows: any[]}>}} Db */

/**
 * The job's row (host columns and callwarden's projection).
 * @param {Db} db
 * @param {string} jobId
 */
export async function jobRow(db, jobId) {
  const { rows } = await db.query(
    `SELECT status, job_type, input_data, output_data, error_message, progress,
            provider_kind, provider_task_id, provider_cost, call_state, call_version,
            call_sync, call_settlement, heartbeat_at, heartbeat_owner
     FROM jobs WHERE id = $1`, [jobId]);
  if (rows.length !== 1) throw new Error(`no job ${jobId}`);
  return rows[0];
}

/**
 * The job's reservations, in id order.
 * @param {Db} db
 * @param {string} jobId
 * @returns {Promise<Array<{status: string, reserved: number, charged: number | null,
 *                          settled: boolean}>>}
 */
export async function usage(db, jobId) {
  const { rows } = await db.query(
    `SELECT status, credits_reserved::float8 AS reserved, credits_charged::float8 AS charged,
            settled_at IS NOT NULL AS settled
     FROM usage_logs WHERE job_id = $1 ORDER BY id`, [jobId]);
  return rows;
}

/**
 * @param {Db} db
 * @param {string} jobId
 * @returns {Promise<Array<{storage_key: string, url: string, content_type: string,
 *                          size_bytes: string}>>}
 */
export async function assets(db, jobId) {
  const { rows } = await db.query(
    'SELECT storage_key, url, content_type, size_bytes FROM assets WHERE job_id = $1 ORDER BY id',
    [jobId]);
  return rows;
}

/**
 * The types of the job's events, in order.
 * @param {Db} db
 * @param {string} jobId
 * @returns {Promise<string[]>}
 */
export async function events(db, jobId) {
  const { rows } = await db.query(
    'SELECT type FROM callwarden.call_events WHERE job_id = $1 ORDER BY seq', [jobId]);
  return rows.map((r) => r.type);
}

/**
 * The invariants every scenario ends on, per job: the call terminal, exactly one
 * reservation and it settled (none left reserved), one Completed event at most, and as
 * many asset rows as the completion stored.
 * @param {Db} db
 * @param {string[]} jobIds
 */
export async function ledger(db, jobIds) {
  const { rows } = await db.query(
    `SELECT j.id::text AS job, j.call_state, j.status, j.call_version,
            (SELECT count(*)::int FROM usage_logs u WHERE u.job_id = j.id) AS reservations,
            (SELECT count(*)::int FROM usage_logs u
              WHERE u.job_id = j.id AND u.status <> 'reserved') AS settled,
            (SELECT min(u.status) FROM usage_logs u WHERE u.job_id = j.id) AS settlement,
            (SELECT count(*)::int FROM callwarden.call_events e
              WHERE e.job_id = j.id) AS events,
            (SELECT count(*)::int FROM callwarden.call_events e
              WHERE e.job_id = j.id AND e.type = 'Completed') AS completions,
            (SELECT min(e.actor) FROM callwarden.call_events e
              WHERE e.job_id = j.id AND e.type = 'Completed') AS completed_by,
            (SELECT count(*)::int FROM assets a WHERE a.job_id = j.id) AS assets
     FROM jobs j WHERE j.id = ANY($1::uuid[]) ORDER BY j.created_at, j.id`, [jobIds]);
  return rows;
}

-- Audit, verify, rebuild, stats and status: every query of engine/replay/, each under a
-- "-- name: <name>" header (loaded into callwarden.database.queries.QUERIES).

-- name: audit_job
SELECT id, status, call_state, call_version, provider_kind
FROM jobs
WHERE id = %(job_id)s;

-- name: audit_job_prefix
-- The jobs whose id starts with a prefix (`callwarden audit 92ebf615`): the uuids from the
-- prefix padded with 0s to the prefix padded with fs, a range on the primary key (uuids
-- order by their bytes, as their hex does); `id::text LIKE` would read every row.
SELECT id, provider_kind, status, call_state
FROM jobs
WHERE id >= %(lower)s::uuid
  AND id <= %(upper)s::uuid
ORDER BY id
LIMIT %(limit)s;

-- name: audit_reservations
SELECT id, status, credits_reserved, credits_charged, settled_at
FROM usage_logs
WHERE job_id = %(job_id)s
ORDER BY id;

-- name: audit_verify_ids
-- The next batch of jobs with a call (events, or projection columns that claim some),
-- keyset-paginated on id.
SELECT j.id
FROM jobs j
WHERE j.id > %(after)s
  AND (j.call_version <> 0
       OR j.call_state IS NOT NULL
       OR EXISTS (SELECT 1 FROM callwarden.call_events e WHERE e.job_id = j.id))
ORDER BY j.id
LIMIT %(batch)s;

-- name: audit_verify_ids_since
-- The next batch of jobs with an event recorded at or after %(since)s.
SELECT DISTINCT job_id AS id
FROM callwarden.call_events
WHERE recorded_at >= %(since)s
  AND job_id > %(after)s
ORDER BY job_id
LIMIT %(batch)s;

-- name: audit_verify_total
SELECT count(*) AS n
FROM jobs
WHERE call_version <> 0 OR call_state IS NOT NULL;

-- name: audit_verify_total_since
SELECT count(DISTINCT job_id) AS n
FROM callwarden.call_events
WHERE recorded_at >= %(since)s;

-- name: audit_histories
-- Each job's projection columns, its whole log as ONE JSON array (decoded in one call),
-- the log's "type/version" signature, its size and last seq (a gap shows as n <> last_seq)
-- and its reservation statuses.
SELECT j.id, j.status, j.call_state, j.call_version, j.provider_kind, j.provider_task_id,
       j.provider_call_started_at, j.call_sync, j.reconcile_attempts,
       j.reconcile_last_error, j.reconcile_next_at, j.error_message, j.finalize_owner,
       j.finalize_lease_until, j.upstream_result::text AS upstream_result,
       j.call_output::text AS call_output, j.provider_cost, j.call_finished_at,
       j.call_settlement,
       ev.payloads, ev.sig, ev.n, ev.last_seq,
       coalesce(us.statuses, '{}'::text[]) AS statuses,
       coalesce(us.settled_by, '{}'::int[]) AS settled_by
FROM jobs j
LEFT JOIN LATERAL (
    SELECT '[' || string_agg(e.payload::text, ',' ORDER BY e.seq) || ']' AS payloads,
           string_agg(e.type || '/' || e.version, ' ' ORDER BY e.seq) AS sig,
           count(*) AS n,
           max(e.seq) AS last_seq
    FROM callwarden.call_events e
    WHERE e.job_id = j.id
) ev ON true
LEFT JOIN LATERAL (
    SELECT array_agg(u.status ORDER BY u.id) AS statuses,
           array_agg(u.settled_by_seq ORDER BY u.id) AS settled_by
    FROM usage_logs u
    WHERE u.job_id = j.id
) us ON true
WHERE j.id = ANY(%(ids)s::uuid[])
ORDER BY j.id;

-- name: audit_rebuild_projection
-- Rewrite the projection from the fold, fenced on the call_version read with the events
-- (a writer that appended since makes this match nothing: re-read and retry). Never
-- lowers call_version, never touches usage_logs, and keeps a host's status='cancelled'
-- on a call the log has not ended yet (the seed's cancel fence).
UPDATE jobs SET
    call_state = %(call_state)s::text,
    call_version = %(new_version)s::int,
    status = CASE WHEN COALESCE(status, 'pending') NOT IN ('pending', 'processing')
                       AND NOT %(terminal)s::boolean THEN status
                  ELSE COALESCE(%(status)s::text, status) END,
    {{projection_set}}
    updated_at = now()
WHERE id = %(job_id)s::uuid
  AND call_version = %(expected_version)s::int
  AND call_version <= %(new_version)s::int
RETURNING id;

-- name: audit_stats_kind_state
SELECT coalesce(provider_kind, '-') AS kind, coalesce(call_state, '-') AS state,
       count(*) AS calls
FROM jobs
WHERE call_state IS NOT NULL OR provider_kind IS NOT NULL
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: audit_stats_stale
-- Open calls (and the host's seed rows not yet adopted) the reconciler counts as stale,
-- by kind: the rows of callwarden_stale_jobs (migration 0008; the stale_jobs fragment of
-- service.sql), the same rows as /metrics.
SELECT coalesce(j.provider_kind, '-') AS kind, count(*) AS stale
FROM {{stale_jobs}} j
GROUP BY 1
ORDER BY 1;

-- name: audit_stats_terminal_events
-- Terminal events recorded in the window, by kind, type and whether a reconciler wrote it.
SELECT coalesce(j.provider_kind, '-') AS kind, e.type,
       e.actor LIKE 'reconciler%%' AS by_reconciler, count(*) AS events
FROM callwarden.call_events e
JOIN jobs j ON j.id = e.job_id
WHERE e.recorded_at >= %(since)s
  AND e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled')
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: audit_stats_time_to_terminal
-- call_finished_at - provider_call_started_at for calls finished in the window, per kind
-- and overall (kind NULL).
SELECT provider_kind AS kind, count(*) AS calls,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY
           extract(epoch FROM call_finished_at - provider_call_started_at)) AS pcts
FROM jobs
WHERE call_finished_at >= %(since)s
  AND provider_call_started_at IS NOT NULL
GROUP BY provider_kind
UNION ALL  -- the overall row: not GROUP BY ROLLUP, which Citus refuses across shards
SELECT NULL, count(*),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY
           extract(epoch FROM call_finished_at - provider_call_started_at))
FROM jobs
WHERE call_finished_at >= %(since)s
  AND provider_call_started_at IS NOT NULL
ORDER BY 1 NULLS LAST;

-- name: audit_stats_jobs_without_call
-- In-flight jobs with credits reserved and no call, created after the legacy cutoff and
-- older than %(older_than)s: the host's (a pipeline wrapper, a job its queue never ran).
-- Never swept (only rows from before the call columns are legacy); reported instead.
SELECT count(*) AS n
FROM jobs j
WHERE j.status IN ('pending', 'processing')
  AND j.provider_call_started_at IS NULL
  AND j.call_state IS NULL
  AND j.created_at < %(older_than)s::timestamptz
  AND j.created_at >= COALESCE(%(legacy_cutoff)s::timestamptz,
                               (SELECT applied_at FROM callwarden.callwarden_migrations WHERE version = 2),
                               '-infinity'::timestamptz)
  AND EXISTS (SELECT 1 FROM usage_logs u WHERE u.job_id = j.id AND u.status = 'reserved');

-- name: status_jobs_by_state
-- `callwarden status`: jobs by the host's status and the call's state.
SELECT status, coalesce(call_state, '-') AS call_state, count(*) AS n
FROM jobs
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: status_event_count
SELECT count(*) AS n FROM callwarden.call_events;

-- name: audit_host_left
-- Reservations still 'reserved' on jobs the host ended, past %(before)s
-- (host_left_after_s ago): calls it completed whose commit never came (settlement 'host',
-- recorded before then), and jobs it ended with no call in the log (outside the
-- reconciler's window, or not recorded yet) last written before then. The reconciler
-- settles the first by its policy (docs/reconciler.md, "Jobs ended outside callwarden");
-- what stays is reported: stats, check, /metrics (callwarden_reservations_host_left) and
-- the CallwardenReservationsHostLeft alert. usage_logs_reserved_idx (0015) holds only the
-- reserved rows.
SELECT count(*) AS reservations, COALESCE(sum(u.credits_reserved), 0)::float8 AS credits
FROM usage_logs u
JOIN jobs j ON j.id = u.job_id
WHERE u.status = 'reserved'
  AND j.status NOT IN ('pending', 'processing')
  AND ((j.call_settlement = 'host' AND j.call_finished_at < %(before)s::timestamptz)
       OR (j.call_state IS NULL
           AND GREATEST(j.updated_at, j.completed_at) < %(before)s::timestamptz));

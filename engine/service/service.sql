-- The service face's reads: /metrics' gauges and the dashboard, each under a
-- "-- name: <name>" header. The webhook receiver's statements are the database port's
-- (engine/database/webhooks.sql).

-- name: metrics_open_calls
-- Open calls by kind and state: served by the partial index jobs_open_calls_idx, so the
-- cost grows with the number of in-flight calls, never with the size of jobs.
SELECT coalesce(provider_kind, '-') AS kind, call_state AS state, count(*) AS calls
FROM jobs
WHERE call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: metrics_recent_terminal
-- Calls that ended since %(since)s, by kind and terminal state (the events' recorded_at
-- index bounds the scan to the window).
SELECT coalesce(j.provider_kind, '-') AS kind, j.call_state AS state, count(*) AS calls
FROM callwarden.call_events e
JOIN jobs j ON j.id = e.job_id
WHERE e.recorded_at >= %(since)s::timestamptz
  AND e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled')
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: metrics_leaked_reservations
-- Reservations still 'reserved' on calls that ended since %(since)s, by kind: verify's rule
-- (projections/verify.py) over the window. The write path settles them in the terminal
-- event's own statement, so any row here is a credit something else re-opened or added
-- afterwards; a call the host completed itself (call_settlement 'host') is the host's to
-- settle and not counted. The events' recorded_at index bounds the scan to the window
-- (as metrics_recent_terminal), usage_logs_job_id_idx finds each call's reservations.
SELECT coalesce(j.provider_kind, '-') AS kind, count(*) AS reservations
FROM callwarden.call_events e
JOIN jobs j ON j.id = e.job_id
JOIN usage_logs u ON u.job_id = e.job_id
WHERE e.recorded_at >= %(since)s::timestamptz
  AND e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled', 'HostEnded')
  AND j.call_state IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled')
  AND j.call_settlement IS DISTINCT FROM 'host'
  AND u.status = 'reserved'
GROUP BY 1
ORDER BY 1;

-- fragment: stale_jobs
-- The rows of callwarden_stale_jobs (migration 0008: the open calls, and the host's seed
-- rows not yet adopted, that the one rule, the stale_rule fragment, finds stale), written out as
-- a subquery: it is what the planner inlined the function into, and Citus refuses a
-- parameterized call of a SQL function over a distributed table (issue 27).
-- tests/integration/test_stale_fragment.py keeps the two equal, row for row.
(SELECT j.*
 FROM jobs j
 WHERE (j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
        OR (j.call_state IS NULL AND j.status IN ('pending', 'processing')
            AND j.provider_kind IS NOT NULL AND j.provider_call_started_at IS NOT NULL))
   AND {{stale_rule}})

-- name: metrics_stale_calls
-- Open calls (and the host's seed rows not yet adopted) the reconciler counts as stale,
-- by kind: the rows of callwarden_stale_jobs (the stale_jobs fragment above: the one rule,
-- callwarden_is_stale, with the configured thresholds; a kind unknown to this version gets
-- the legacy threshold). audit_stats_stale and dashboard_stale_calls read the same rows.
SELECT coalesce(j.provider_kind, '-') AS kind, count(*) AS stale
FROM {{stale_jobs}} j
GROUP BY 1
ORDER BY 1;

-- name: dashboard_stale_calls
-- The oldest stale calls (the stale_jobs fragment, as metrics_stale_calls).
SELECT j.id, j.provider_kind, j.call_state, j.provider_task_id, j.provider_call_started_at,
       j.reconcile_attempts, j.reconcile_last_error, j.heartbeat_at
FROM {{stale_jobs}} j
ORDER BY j.provider_call_started_at
LIMIT %(limit)s;

-- name: dashboard_recent_outcomes
-- The latest terminal events (%(types)s: a subset of the terminal types), newest first:
-- a backward scan of call_events_terminal_idx (0009) from now, stopped by the LIMIT.
SELECT e.job_id, e.type, e.actor, e.recorded_at, j.provider_kind, j.call_state,
       j.error_message, j.call_settlement
FROM callwarden.call_events e
JOIN jobs j ON j.id = e.job_id
WHERE e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled', 'HostEnded')
  AND e.recorded_at >= %(since)s::timestamptz
  AND e.type = ANY(%(types)s::text[])
ORDER BY e.recorded_at DESC
LIMIT %(limit)s;

-- name: dashboard_terminal_buckets
-- Calls that ended in [%(since)s, %(until)s) (NULL: no end), per time bucket (%(bucket)s
-- wide, aligned on %(origin)s), terminal event type and actor: an index-only range scan of
-- call_events_terminal_idx (0009), so the cost is the range's ended calls. The dashboard
-- asks once for each closed bucket (engine/service/dashboard/rollup.py) and then only for
-- the open one.
SELECT date_bin(%(bucket)s::interval, e.recorded_at, %(origin)s::timestamptz) AS bucket,
       e.type, e.actor, count(*) AS calls
FROM callwarden.call_events e
WHERE e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled', 'HostEnded')
  AND e.recorded_at >= %(since)s::timestamptz
  AND e.recorded_at < coalesce(%(until)s::timestamptz, 'infinity')
GROUP BY 1, 2, 3;

-- name: dashboard_finished_durations
-- Time to terminal (call start to call end, seconds) of the calls that finished in
-- [%(since)s, %(until)s), per bucket and kind (one array of seconds each): an index-only
-- range scan of jobs_call_finished_idx (0009). The percentiles per kind are computed from
-- these (engine/service/dashboard/rollup.py).
SELECT date_bin(%(bucket)s::interval, call_finished_at, %(origin)s::timestamptz) AS bucket,
       coalesce(provider_kind, '-') AS kind,
       array_agg(extract(epoch FROM call_finished_at - provider_call_started_at)::float8)
           AS seconds
FROM jobs
WHERE call_finished_at >= %(since)s::timestamptz
  AND call_finished_at < coalesce(%(until)s::timestamptz, 'infinity')
  AND provider_call_started_at IS NOT NULL
GROUP BY 1, 2;

-- name: dashboard_credit_buckets
-- Credits settled in [%(since)s, %(until)s) per time bucket: committed (charged), released
-- (the rest of a committed reservation) and refunded: usage_logs_settled_at_idx (0009).
SELECT date_bin(%(bucket)s::interval, settled_at, %(origin)s::timestamptz) AS bucket,
       coalesce(sum(credits_charged) FILTER (WHERE status = 'committed'), 0) AS committed,
       coalesce(sum(credits_reserved - coalesce(credits_charged, 0))
                FILTER (WHERE status = 'committed'), 0) AS released,
       coalesce(sum(credits_reserved) FILTER (WHERE status = 'refunded'), 0) AS refunded
FROM usage_logs
WHERE settled_at >= %(since)s::timestamptz
  AND settled_at < coalesce(%(until)s::timestamptz, 'infinity')
GROUP BY 1;

-- name: dashboard_list_calls
-- One page of calls, newest call start first, after the keyset cursor (%(cursor_at)s,
-- %(cursor_id)s) (NULL: the first page; never OFFSET), with optional filters (NULL: any):
-- kind, call states (an array: the dashboard gives one, `callwarden jobs` several), the
-- role that ended the call, the user, a call-start range, and an ILIKE pattern (its % and
-- _ escaped by the caller) on the job's and the reconciler's last error. The dashboard and
-- `callwarden jobs` (engine/cli/jobs.py) both list calls with it.
-- jobs_call_started_idx / jobs_kind_started_idx (0009) give the order and bound the range;
-- the filters are checked on the rows the index walk reads, and the page stops at LIMIT.
-- ended_by: the terminal event's actor role, read through call_events' primary key.
SELECT j.id, j.user_id, j.status, j.provider_kind, j.call_state, j.provider_task_id,
       j.created_at, j.updated_at, j.call_settlement,
       j.provider_call_started_at AS started_at, j.call_finished_at AS finished_at,
       coalesce(j.error_message, j.reconcile_last_error) AS error, t.ended_by
FROM jobs j
LEFT JOIN LATERAL (
    SELECT split_part(e.actor, ':', 1) AS ended_by
    FROM callwarden.call_events e
    WHERE e.job_id = j.id
      AND e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled',
                     'HostEnded')
    ORDER BY e.seq DESC
    LIMIT 1
) t ON true
WHERE j.provider_call_started_at IS NOT NULL
  AND j.provider_call_started_at >= coalesce(%(from)s::timestamptz, '-infinity')
  AND j.provider_call_started_at < coalesce(%(to)s::timestamptz, 'infinity')
  AND (j.provider_call_started_at, j.id)
      < (coalesce(%(cursor_at)s::timestamptz, 'infinity'),
         coalesce(%(cursor_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND (%(kind)s::text IS NULL OR j.provider_kind = %(kind)s::text)
  AND (%(states)s::text[] IS NULL OR j.call_state = ANY(%(states)s::text[]))
  AND (%(actor)s::text IS NULL OR t.ended_by = %(actor)s::text)
  AND (%(user_id)s::text IS NULL OR j.user_id = %(user_id)s::text)
  AND (%(error)s::text IS NULL OR j.error_message ILIKE %(error)s::text ESCAPE '\'
       OR j.reconcile_last_error ILIKE %(error)s::text ESCAPE '\')
ORDER BY j.provider_call_started_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: dashboard_search
-- A job by id (exact) or by upstream task id.
SELECT id, provider_kind, provider_task_id, status, call_state
FROM jobs
WHERE id = %(job_id)s::uuid
   OR (provider_task_id = %(task_id)s::text AND provider_kind IS NOT NULL)
LIMIT 20;

-- name: dashboard_job_events
-- A job's stored events as they are (the page shows the raw payloads on demand).
SELECT seq, type, version, payload::text AS payload, actor, recorded_at
FROM callwarden.call_events
WHERE job_id = %(job_id)s::uuid
ORDER BY seq;

-- name: dashboard_job_io
-- What went into a job and came out of it (its jobs row, by the primary key).
SELECT input_data::text AS input_data, output_data::text AS output_data, error_message
FROM jobs
WHERE id = %(job_id)s::uuid;

-- name: dashboard_job_assets
-- A job's stored files (assets_job_key_idx); the page shows the first 50.
SELECT storage_key, url, content_type, size_bytes
FROM assets
WHERE job_id = %(job_id)s::uuid
ORDER BY storage_key
LIMIT 50;

-- name: dashboard_ledger
-- A job's settlement ledger: its usage_logs rows (usage_logs_job_id_idx).
SELECT id, status, credits_reserved, credits_charged, created_at, settled_at, settled_by_seq
FROM usage_logs
WHERE job_id = %(job_id)s::uuid
ORDER BY id;

-- name: dashboard_bulk_jobs
-- The jobs a bulk admin action looks at (by the primary key), each with its call state and
-- the credits it still holds reserved (usage_logs_job_id_idx): what the preview counts.
SELECT j.id, j.call_state,
       coalesce((SELECT sum(u.credits_reserved) FROM usage_logs u
                 WHERE u.job_id = j.id AND u.status = 'reserved'), 0) AS reserved
FROM jobs j
WHERE j.id = ANY(%(ids)s::uuid[]);

-- name: dashboard_refunded_by
-- The credits a job's event at %(seq)s refunded: the usage_logs rows its transaction
-- settled (usage_logs_job_id_idx).
SELECT coalesce(sum(credits_reserved), 0) AS credits
FROM usage_logs
WHERE job_id = %(job_id)s::uuid AND status = 'refunded' AND settled_by_seq = %(seq)s::int;

-- fragment: waiting_jobs
-- The jobs waiting for a provider account's slot now: the rows of callwarden.waiting
-- (migration 0018: a start the account's limits refused; the start that admits the job
-- deletes its row) whose job could still start, as start_call tells (no call, no task,
-- still pending or processing): a job the host ended or removed while it waited is not
-- waiting any more, even if its row is left. Each row reaches its job by jobs' primary
-- key (a LATERAL ... LIMIT 1, which the planner keeps a nested loop over the waiting rows:
-- joined plainly, it may hash a scan of every job it guesses has no call), so the cost
-- grows with the waiting rows, never with jobs. dashboard_waiting (the dashboard's
-- /waiting page, `callwarden jobs --state waiting`) and metrics_waiting (the overview's
-- card, /metrics) read these rows.
(SELECT w.job_id, w.account, w.reason, w.since, w.retry_at, w.refusals,
        j.user_id, j.status, j.created_at
 FROM callwarden.waiting w
 CROSS JOIN LATERAL (
     SELECT j.user_id, j.status, j.created_at
     FROM jobs j
     WHERE j.id = w.job_id AND j.call_state IS NULL AND j.provider_task_id IS NULL
       AND coalesce(j.status, 'pending') IN ('pending', 'processing')
     LIMIT 1
 ) j)

-- name: dashboard_waiting
-- The jobs waiting for a slot (the waiting_jobs fragment), longest waiting first, with
-- optional filters (NULL: any): the job's user, a kind (the account whose kinds hold
-- it), a range of the time the job began to wait.
SELECT w.job_id AS id, w.user_id, w.status, w.created_at, w.account, w.reason, w.since,
       w.retry_at, w.refusals
FROM {{waiting_jobs}} w
WHERE (%(user_id)s::text IS NULL OR w.user_id = %(user_id)s::text)
  AND (%(kind)s::text IS NULL OR EXISTS (
        SELECT 1 FROM callwarden.limits l
        WHERE l.account = w.account AND l.kinds @> ARRAY[%(kind)s::text]))
  AND w.since >= coalesce(%(from)s::timestamptz, '-infinity')
  AND w.since < coalesce(%(to)s::timestamptz, 'infinity')
ORDER BY w.since, w.job_id
LIMIT %(limit)s;

-- name: metrics_waiting
-- Per provider account (each of callwarden.limits, and any other a waiting row names):
-- its jobs waiting now (the waiting_jobs fragment; 0 when none), since when the oldest
-- waits, the soonest retry, and the reasons of their latest refusals.
SELECT a.account, count(w.job_id) AS jobs, min(w.since) AS oldest, min(w.retry_at) AS next_retry,
       coalesce(array_agg(DISTINCT w.reason ORDER BY w.reason)
                FILTER (WHERE w.reason IS NOT NULL), '{}') AS reasons
FROM (SELECT l.account FROM callwarden.limits l
      UNION SELECT r.account FROM callwarden.waiting r) a
LEFT JOIN {{waiting_jobs}} w ON w.account = a.account
GROUP BY a.account
ORDER BY a.account;


-- The service face (webhooks, metrics, dashboard, admin): every query of engine/service/
-- (webhooks, metrics, dashboard, app), each under a "-- name: <name>" header.

-- name: service_ping
SELECT 1 AS ok;

-- name: webhook_find_job
-- Served by the unique partial index jobs_provider_task_idx (provider_kind, provider_task_id).
SELECT id, provider_kind, provider_task_id, call_state
FROM jobs
WHERE provider_kind = ANY(%(kinds)s::text[])
  AND provider_task_id = %(task_id)s::text;

-- name: webhook_job_by_id
SELECT id, provider_kind, provider_task_id, provider_call_started_at, call_state,
       callback_token
FROM jobs
WHERE id = %(job_id)s::uuid;

-- name: webhook_record_delivery
-- Replay protection: a second delivery with the same id inserts nothing.
INSERT INTO webhook_deliveries (provider, delivery_id, job_id)
VALUES (%(provider)s::text, %(delivery_id)s::text, %(job_id)s::uuid)
ON CONFLICT (provider, delivery_id) DO NOTHING
RETURNING delivery_id;

-- name: webhook_forget_delivery
-- The delivery could not be processed (database error): let the provider's retry through.
DELETE FROM webhook_deliveries
WHERE provider = %(provider)s::text AND delivery_id = %(delivery_id)s::text;

-- name: webhook_prune_deliveries
DELETE FROM webhook_deliveries
WHERE received_at < %(before)s::timestamptz;

-- name: callback_token_ensure
-- The job's callback token, set once (a redelivered job keeps the token its upstream task
-- was created with).
UPDATE jobs
SET callback_token = COALESCE(callback_token, %(token)s::text)
WHERE id = %(job_id)s::uuid
RETURNING callback_token;

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
FROM call_events e
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
FROM call_events e
JOIN jobs j ON j.id = e.job_id
JOIN usage_logs u ON u.job_id = e.job_id
WHERE e.recorded_at >= %(since)s::timestamptz
  AND e.type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled', 'HostEnded')
  AND j.call_state IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled')
  AND j.call_settlement IS DISTINCT FROM 'host'
  AND u.status = 'reserved'
GROUP BY 1
ORDER BY 1;

-- name: metrics_stale_calls
-- Open calls (and the host's seed rows not yet adopted) the reconciler counts as stale,
-- by kind: callwarden_stale_jobs (migration 0008: the one rule, callwarden_is_stale, with
-- the configured thresholds; a kind unknown to this version gets the legacy threshold).
-- audit_stats_stale and dashboard_stale_calls read the same function.
SELECT coalesce(j.provider_kind, '-') AS kind, count(*) AS stale
FROM callwarden_stale_jobs(%(stale_thresholds)s::jsonb, %(stale_legacy_s)s::float8,
                           %(stale_heartbeat_s)s::float8, %(now)s::timestamptz) j
GROUP BY 1
ORDER BY 1;

-- name: dashboard_stale_calls
-- The oldest stale calls (callwarden_stale_jobs, as metrics_stale_calls).
SELECT j.id, j.provider_kind, j.call_state, j.provider_task_id, j.provider_call_started_at,
       j.reconcile_attempts, j.reconcile_last_error, j.heartbeat_at
FROM callwarden_stale_jobs(%(stale_thresholds)s::jsonb, %(stale_legacy_s)s::float8,
                           %(stale_heartbeat_s)s::float8, %(now)s::timestamptz) j
ORDER BY j.provider_call_started_at
LIMIT %(limit)s;

-- name: dashboard_recent_outcomes
-- The latest terminal events (exhausted ones included), newest first.
SELECT e.job_id, e.type, e.actor, e.recorded_at, j.provider_kind, j.call_state,
       j.error_message, j.call_settlement
FROM call_events e
JOIN jobs j ON j.id = e.job_id
WHERE e.recorded_at >= %(since)s::timestamptz
  AND e.type = ANY(%(types)s::text[])
ORDER BY e.recorded_at DESC
LIMIT %(limit)s;

-- name: dashboard_search
-- A job by id (exact) or by upstream task id.
SELECT id, provider_kind, provider_task_id, status, call_state
FROM jobs
WHERE id = %(job_id)s::uuid
   OR (provider_task_id = %(task_id)s::text AND provider_kind IS NOT NULL)
LIMIT 20;

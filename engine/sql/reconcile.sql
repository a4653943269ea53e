-- The reconciler's queries. Projection columns are never written here: every state change
-- goes through append_event (fenced on call_version). These statements only move the
-- reconciler's own claim columns (reconcile_owner, reconcile_lease_until).

-- name: reconcile_claim
-- Claim up to batch_size stale in-flight calls in ONE statement (so one transaction).
-- Two branches, each served by a partial index and each locking with SKIP LOCKED:
--   open_calls: calls with events, through jobs_open_calls_idx (call_state open);
--   seed_rows: rows with no events (the host's own workers wrote the seed columns, or a
--              legacy row with none), through jobs_inflight_idx (status pending/processing).
-- Every mutable predicate (state, heartbeat, next attempt, claim lease, finalization lease)
-- sits on the locked relation itself, so a row changed by a concurrent commit is re-checked
-- on its newest version before it is locked (no stale-snapshot claim, River #1302).
-- %(cutoff)s = now - min(smallest kind threshold, heartbeat timeout): the index range;
-- %(thresholds)s: {kind: seconds} as JSON; %(unknown_threshold_s)s for kinds not in it.
WITH open_calls AS (
    SELECT j.id
    FROM jobs j
    WHERE j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
      AND j.provider_call_started_at < %(cutoff)s::timestamptz
      AND (j.reconcile_lease_until IS NULL OR j.reconcile_lease_until <= %(now)s::timestamptz)
      AND (j.reconcile_next_at IS NULL OR j.reconcile_next_at <= %(now)s::timestamptz)
      AND NOT (j.call_state = 'finalizing'
               AND j.finalize_lease_until > %(now)s::timestamptz)
      AND CASE
            WHEN j.heartbeat_at IS NOT NULL THEN
                j.heartbeat_at <= %(now)s::timestamptz
                    - make_interval(secs => %(heartbeat_timeout_s)s::float8)
            ELSE
                j.provider_call_started_at <= %(now)s::timestamptz - make_interval(secs =>
                    COALESCE((%(thresholds)s::jsonb ->> j.provider_kind)::float8,
                             %(unknown_threshold_s)s::float8))
          END
    LIMIT %(batch_size)s
    FOR UPDATE OF j SKIP LOCKED
), seed_rows AS (
    SELECT j.id
    FROM jobs j
    WHERE j.status IN ('pending', 'processing')
      AND j.call_state IS NULL
      AND (j.provider_call_started_at < %(cutoff)s::timestamptz
           OR j.provider_call_started_at IS NULL)
      AND (j.reconcile_lease_until IS NULL OR j.reconcile_lease_until <= %(now)s::timestamptz)
      AND CASE
            WHEN j.provider_call_started_at IS NULL THEN
                COALESCE(j.started_at, j.created_at) <= %(now)s::timestamptz
                    - make_interval(secs => %(legacy_threshold_s)s::float8)
            ELSE
                j.provider_call_started_at <= %(now)s::timestamptz - make_interval(secs =>
                    COALESCE((%(thresholds)s::jsonb ->> j.provider_kind)::float8,
                             %(legacy_threshold_s)s::float8))
          END
    LIMIT (SELECT greatest(%(batch_size)s - count(*), 0) FROM open_calls)
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs j
SET reconcile_owner = %(owner)s::text,
    reconcile_lease_until = %(lease_until)s::timestamptz
WHERE j.id = ANY(ARRAY(SELECT id FROM open_calls UNION ALL SELECT id FROM seed_rows))
RETURNING j.id, j.status, j.call_state, j.call_version, j.provider_kind, j.provider_task_id,
          j.provider_call_started_at, j.call_sync, j.reconcile_attempts,
          j.reconcile_last_error, j.reconcile_next_at, j.error_message, j.finalize_owner,
          j.finalize_lease_until, j.upstream_result::text AS upstream_result,
          j.output_data::text AS output_data, j.provider_cost, j.call_finished_at,
          j.call_settlement, j.heartbeat_at, j.started_at, j.created_at;

-- name: reconcile_renew
-- Before acting on a claimed call: extend the claim, only if it is still ours (a claim
-- that expired and was taken by another reconciler is never acted on).
UPDATE jobs
SET reconcile_lease_until = %(lease_until)s::timestamptz
WHERE id = %(job_id)s::uuid AND reconcile_owner = %(owner)s::text
RETURNING id;

-- name: reconcile_release
-- Done with the call (whatever happened): drop the claim, only if it is still ours.
UPDATE jobs
SET reconcile_owner = NULL, reconcile_lease_until = NULL
WHERE id = %(job_id)s::uuid AND reconcile_owner = %(owner)s::text;

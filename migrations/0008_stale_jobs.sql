-- 0008: the rows every reader of staleness reports, defined once: the open calls (and the
-- host's seed rows the reconciler would adopt: no events yet, status pending/processing,
-- a kind and a call start) that callwarden_is_stale (0007) finds stale with the given
-- thresholds. /metrics, the dashboard and `callwarden stats` select from it; the
-- reconciler's claim applies the same rule over its own partial indexes. A STABLE SQL
-- function of one SELECT: the planner inlines it into the caller's query.

CREATE OR REPLACE FUNCTION callwarden_stale_jobs(
    thresholds jsonb,
    legacy_threshold_s float8,
    heartbeat_timeout_s float8,
    now timestamptz
) RETURNS SETOF jobs
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT j.*
FROM jobs j
WHERE (j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
       OR (j.call_state IS NULL AND j.status IN ('pending', 'processing')
           AND j.provider_kind IS NOT NULL AND j.provider_call_started_at IS NOT NULL))
  AND callwarden_is_stale(j.provider_call_started_at, j.started_at, j.created_at,
                          j.heartbeat_at, j.provider_kind, thresholds, legacy_threshold_s,
                          heartbeat_timeout_s, now)
$$;

-- 0007: the staleness rule, once, in the database (engine/reconciler/stale.py is the same
-- rule in Python; a property test checks they agree). The reconciler's claim, /metrics,
-- the dashboard and `callwarden stats` all filter by it, with the thresholds the operator
-- configured passed in, so they can never disagree on which calls are stale.
--
-- A call that heartbeated is stale once its heartbeat is heartbeat_timeout_s old; one that
-- never did, once it is its kind's threshold old (counted from provider_call_started_at;
-- a kind missing from `thresholds` gets legacy_threshold_s); a row with no call start is
-- aged from the host's started_at (else created_at) against legacy_threshold_s.
-- Written with interval arithmetic only, so it is IMMUTABLE and the planner inlines it.

CREATE OR REPLACE FUNCTION callwarden_is_stale(
    call_started_at timestamptz,
    host_started_at timestamptz,
    created_at timestamptz,
    heartbeat_at timestamptz,
    kind text,
    thresholds jsonb,
    legacy_threshold_s float8,
    heartbeat_timeout_s float8,
    now timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE
    WHEN heartbeat_at IS NOT NULL THEN
        now - heartbeat_at >= make_interval(secs => heartbeat_timeout_s)
    WHEN call_started_at IS NOT NULL THEN
        now - call_started_at >= make_interval(secs =>
            coalesce((thresholds ->> kind)::float8, legacy_threshold_s))
    ELSE
        coalesce(now - coalesce(host_started_at, created_at)
                 >= make_interval(secs => legacy_threshold_s), false)
END
$$;

-- Admission limits (engine/calls/limits.py; migrations/0018_admission.sql).

-- name: limits_upsert
-- One account's caps, written as the settings file says.
INSERT INTO callwarden.limits AS l (account, kinds, in_flight, tenant_in_flight, creates,
                                    per_s, wait_s, updated_at)
VALUES (%(account)s, %(kinds)s::text[], %(in_flight)s, %(tenant_in_flight)s, %(creates)s,
        %(per_s)s, %(wait_s)s, now())
ON CONFLICT (account) DO UPDATE
SET kinds = EXCLUDED.kinds, in_flight = EXCLUDED.in_flight,
    tenant_in_flight = EXCLUDED.tenant_in_flight, creates = EXCLUDED.creates,
    per_s = EXCLUDED.per_s, wait_s = EXCLUDED.wait_s, updated_at = now();

-- name: limits_remove_others
-- The accounts the settings file no longer names.
DELETE FROM callwarden.limits WHERE account <> ALL (%(accounts)s::text[])
RETURNING account;

-- name: limits_show
-- Each account, its calls in flight (jobs_open_kind_user_idx) and the jobs waiting for it.
SELECT l.account, l.kinds, l.in_flight, l.tenant_in_flight, l.creates, l.per_s, l.wait_s,
       callwarden.limit_factor(l, clock_timestamp()) AS rate_factor,
       GREATEST(0, EXTRACT(epoch FROM l.paused_until - clock_timestamp()))::float8 AS paused_s,
       (SELECT count(*) FROM jobs j
        WHERE j.provider_kind = ANY (l.kinds)
          AND j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing'))
           AS open_calls,
       (SELECT count(*) FROM callwarden.waiting w WHERE w.account = l.account) AS waiting
FROM callwarden.limits l
ORDER BY l.account;

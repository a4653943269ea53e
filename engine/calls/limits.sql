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
    per_s = EXCLUDED.per_s, wait_s = EXCLUDED.wait_s,
    updated_at = EXCLUDED.updated_at;  -- (Citus: no now() in a DO UPDATE of a reference table)

-- name: limits_remove_others
-- The accounts the settings file no longer names.
DELETE FROM callwarden.limits WHERE account <> ALL (%(accounts)s::text[])
RETURNING account;

-- name: limits_show
-- Each provider account of callwarden.limits (`callwarden limits`, the dashboard's Limits
-- card): its caps, the share of them the provider's 429s leave it at %(now)s (NULL: the
-- database's clock; callwarden.limit_factor) and the pause left, its calls in flight and
-- its jobs waiting now. The open calls are counted per kind first, by one scan of
-- jobs_open_kind_user_idx over the limited kinds (the cost grows with their calls in
-- flight, never with jobs), the waiting jobs per account (the waiting_jobs fragment: only
-- jobs that could still start), each MATERIALIZED: one distributed query each on Citus,
-- summed over the accounts (a reference table) after, never a subquery per account.
WITH open_calls AS MATERIALIZED (
    SELECT j.provider_kind AS kind, count(*) AS calls
    FROM jobs j
    WHERE j.provider_kind = ANY (ARRAY(SELECT DISTINCT k.kind
                                      FROM callwarden.limits l, unnest(l.kinds) AS k(kind)))
      AND j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
    GROUP BY j.provider_kind
), waiting AS MATERIALIZED (
    SELECT w.account, count(*) AS jobs FROM {{waiting_jobs}} w GROUP BY w.account
), at AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
)
SELECT l.account, l.kinds, l.in_flight, l.tenant_in_flight, l.creates, l.per_s, l.wait_s,
       callwarden.limit_factor(l.rate_factor, l.paused_until, l.wait_s,
                               COALESCE(l.in_flight, l.creates), at.now) AS rate_factor,
       GREATEST(0, EXTRACT(epoch FROM l.paused_until - at.now))::float8 AS paused_s,
       coalesce((SELECT sum(o.calls) FROM open_calls o WHERE o.kind = ANY (l.kinds)),
                0)::bigint AS open_calls,
       coalesce((SELECT w.jobs FROM waiting w WHERE w.account = l.account), 0)::bigint
           AS waiting
FROM callwarden.limits l, at
ORDER BY l.account;
